//! The private server: started under a directory, stopped with its holder, and started again
//! after its holder was killed with SIGKILL.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use warden_data::server::{private::alive, Server};

const HOLDER_DIR: &str = "WARDEN_DATA_TEST_HOLDER_DIR";

/// Not a test on its own: the child process the next test starts and kills.
#[test]
#[ignore = "run by a_private_server_copes_with_its_holder_killed"]
fn holder() {
    let Ok(dir) = std::env::var(HOLDER_DIR) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(Server::private(dir.as_ref())).unwrap();
    let Server::Private(p) = &server else {
        unreachable!()
    };
    println!("ready {}", p.pid().unwrap());
    std::thread::sleep(std::time::Duration::from_secs(300));
}

#[tokio::test]
async fn a_private_server_copes_with_its_holder_killed() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["holder", "--exact", "--ignored", "--nocapture"])
        .env(HOLDER_DIR, dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let orphan: i32 = loop {
        let line = lines.next().expect("holder printed ready").unwrap();
        if let Some(pid) = line.strip_prefix("ready ") {
            break pid.trim().parse().unwrap();
        }
    };
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    assert!(
        alive(Pid::from_raw(orphan)),
        "the server outlives a SIGKILLed holder"
    );

    // The next start stops the orphan and serves.
    let server = Server::private(dir.path())
        .await
        .expect("starts after a crash");
    assert!(!alive(Pid::from_raw(orphan)), "the orphan was stopped");
    let c = server.admin(None).await.unwrap();
    let one: i32 = c.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    let Server::Private(p) = &server else {
        unreachable!()
    };
    let pid = Pid::from_raw(p.pid().unwrap() as i32);
    drop(c);
    // Dropped, it stops (fast shutdown, waited for).
    drop(server);
    assert!(!alive(pid), "the server stops when dropped");
}
