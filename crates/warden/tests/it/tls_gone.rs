//! Handshakes whose clients have gone cost no cryptography: a flood whose clients time out and
//! leave while their hellos wait (in the backlog, or for a slot) must not keep the gateway
//! signing for nobody, with admission control or without it.

use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use warden_test_support::{wait_until, Launch};

use crate::tls::{any_version, bin, client, demo_cert, freeze, hello_written, metric, tls_addr};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_whose_client_left_while_it_waited_is_given_up_before_its_signature() {
    let w = Launch::new(bin()).arg("--no-tls-admission").start();
    let addr = tls_addr(&w);
    let cert = demo_cert(&w);
    // While the gateway is stopped, as while it is too busy to accept, ten clients send their
    // hello and leave; one stays.
    let pid = Pid::from_raw(w.pid() as i32);
    freeze(pid);
    for _ in 0..10 {
        drop(hello_written(&addr, &client(&[&cert], &any_version(), &[])).await);
    }
    let mut stays = hello_written(&addr, &client(&[&cert], &any_version(), &[])).await;
    kill(pid, Signal::SIGCONT).unwrap();

    let mut first = [0u8; 1];
    stays.read_exact(&mut first).await.unwrap();
    assert_eq!(
        first[0], 0x16,
        "the client that stayed gets its ServerHello"
    );
    let abandoned = r#"warden_gateway_tls_handshakes_total{result="abandoned"}"#;
    wait_until(
        "the ten handshakes given up",
        Duration::from_secs(10),
        || (metric(&w, abandoned) >= 10.0).then_some(()),
    );
    assert_eq!(metric(&w, abandoned), 10.0);
    assert_eq!(
        metric(
            &w,
            r#"warden_gateway_tls_handshakes_total{result="failed"}"#
        ),
        0.0,
        "no handshake went on to fail writing to a client that had gone"
    );
}
