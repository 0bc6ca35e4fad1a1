//! The private server: started under a directory, stopped with its holder (dropped, or killed
//! with SIGKILL), and started again over one still running in its directory.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::{Pid, User};
use warden_data::server::private::{alive, find_bindir};
use warden_data::server::Server;

const HOLDER_DIR: &str = "WARDEN_DATA_TEST_HOLDER_DIR";

/// Not a test on its own: the child process the next test starts and kills.
#[test]
#[ignore = "run by a_private_server_dies_with_its_holder_and_a_start_copes_with_what_is_left"]
fn holder() {
    let Ok(dir) = std::env::var(HOLDER_DIR) else {
        return;
    };
    // Blocking-pool threads retire after 100 ms idle, so the one that ran the start is gone
    // long before the holder is killed.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_keep_alive(Duration::from_millis(100))
        .build()
        .unwrap();
    let server = rt.block_on(Server::private(dir.as_ref())).unwrap();
    let Server::Private(p) = &server else {
        unreachable!()
    };
    println!("ready {}", p.pid().unwrap());
    // The starting threads of tokio's blocking pool retire meanwhile; the server must not.
    std::thread::sleep(Duration::from_secs(300));
}

/// Waits (bounded) until `pid` is gone; true if it went.
fn gone_within(pid: i32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if !alive(Pid::from_raw(pid)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn a_private_server_dies_with_its_holder_and_a_start_copes_with_what_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["holder", "--exact", "--ignored", "--nocapture"])
        .env(HOLDER_DIR, dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first: i32 = loop {
        let line = lines.next().expect("holder printed ready").unwrap();
        if let Some(pid) = line.strip_prefix("ready ") {
            break pid.trim().parse().unwrap();
        }
    };
    // Long past the holder's blocking threads retired: the server must outlive the thread
    // that started it, and die with the process.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        alive(Pid::from_raw(first)),
        "the server outlives the thread that started it"
    );
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    assert!(
        gone_within(first, Duration::from_secs(30)),
        "the server dies with a holder killed by SIGKILL"
    );

    // A server still running in the directory (as a warden without setpriv would leave it):
    // the next start stops it and serves.
    let pgdata = dir.path().join("pgdata");
    let mut orphan = Command::new(find_bindir().unwrap().join("postgres"));
    orphan
        .arg("-D")
        .arg(&pgdata)
        .arg("-k")
        .arg(dir.path().join("run"))
        .args(["-c", "listen_addresses=", "-p", "5432"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    if nix::unistd::Uid::effective().is_root() {
        let pg = User::from_name("postgres").unwrap().unwrap();
        orphan.uid(pg.uid.as_raw()).gid(pg.gid.as_raw());
    }
    let mut orphan = orphan.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pgdata.join("postmaster.pid").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let orphan_pid = orphan.id() as i32;
    let server = Server::private(dir.path())
        .await
        .expect("starts over an orphan");
    let deadline = Instant::now() + Duration::from_secs(30);
    while orphan.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if !gone_within(orphan_pid, Duration::ZERO) {
        let _ = kill(Pid::from_raw(orphan_pid), Signal::SIGKILL);
        panic!("the orphan was not stopped");
    }
    let c = server.admin(None).await.unwrap();
    let one: i32 = c.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    let Server::Private(p) = &server else {
        unreachable!()
    };
    let pid = Pid::from_raw(p.pid().unwrap() as i32);
    assert_ne!(pid.as_raw(), orphan_pid);
    drop(c);
    // Dropped, it stops (fast shutdown, waited for).
    drop(server);
    assert!(!alive(pid), "the server stops when dropped");

    // A stale postmaster.pid naming a live process of the server's user that is no server of
    // this dir (pids are reused after a reboot): PostgreSQL alone refuses to start over it.
    let mut other = Command::new("sleep");
    other.arg("60");
    if nix::unistd::Uid::effective().is_root() {
        let pg = User::from_name("postgres").unwrap().unwrap();
        other.uid(pg.uid.as_raw()).gid(pg.gid.as_raw());
    }
    let mut other = other.spawn().unwrap();
    std::fs::write(pgdata.join("postmaster.pid"), format!("{}\n", other.id())).unwrap();
    let started = Server::private(dir.path()).await;
    let _ = other.kill();
    let _ = other.wait();
    started
        .expect("starts over a stale pid file")
        .shutdown()
        .await;
}

/// warden's default data dir is relative (`warden-data`), and initdb and postgres run with
/// the server's directory as their working directory: a relative path must still start it.
#[tokio::test]
async fn a_private_server_starts_under_a_relative_directory() {
    let top = tempfile::tempdir().unwrap();
    // The postgres user must reach the directory (tempdirs are 0700).
    std::fs::set_permissions(
        top.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // Each test runs in a process of its own (nextest), so moving this one's directory is safe.
    std::env::set_current_dir(top.path()).unwrap();
    let server = Server::private(std::path::Path::new("warden-data/postgres"))
        .await
        .expect("a private server under a relative directory starts");
    let c = server.admin(None).await.expect("the admin connects");
    let one: i32 = c.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
}

/// A postmaster killed with SIGKILL is started again by warden, with no one asking: the admin
/// connects again, to a new postmaster.
#[tokio::test]
async fn a_private_server_killed_is_started_again() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::private(dir.path()).await.expect("starts");
    let Server::Private(p) = &server else {
        unreachable!()
    };
    let first = p.pid().unwrap() as i32;
    kill(Pid::from_raw(first), Signal::SIGKILL).unwrap();
    assert!(gone_within(first, Duration::from_secs(30)));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(c) = server.admin(None).await {
            if let Ok(row) = c.query_one("SELECT 1", &[]).await {
                assert_eq!(row.get::<_, i32>(0), 1);
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the private server was not started again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let second = p.pid().expect("a postmaster runs again");
    assert_ne!(second as i32, first);
    server.shutdown().await;
    assert!(!alive(Pid::from_raw(second as i32)), "stopped at shutdown");
}

/// Run as root, the server runs as `postgres`: a parent directory that user may not enter is
/// named in the error, with what to do, not a bare "Permission denied".
#[tokio::test]
async fn a_private_server_under_a_closed_parent_says_which_and_what_to_do() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: only a root warden runs the server as another user");
        return;
    }
    let top = tempfile::tempdir().unwrap();
    let closed = top.path().join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::set_permissions(
        top.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let Err(e) = Server::private(&closed.join("data").join("postgres")).await else {
        panic!("a private server started under a directory its user cannot enter");
    };
    let text = e.to_string();
    assert!(
        text.contains(&format!("cannot enter {}", closed.display()))
            && text.contains(&format!("chmod o+x {}", closed.display()))
            && text.contains("--data-dir"),
        "{text}"
    );
}

/// One `Admin`'s calls share its admin connections: the one a first call opened to the app's
/// database still serves (alive, not reopened) after a second call.
#[tokio::test]
async fn an_admins_calls_share_its_connections() {
    use warden_data::schema::{Admin, DataKey};
    let dir = tempfile::tempdir().unwrap();
    let server = Server::private(dir.path()).await.expect("starts");
    let lattice = warden_auth::lattice::Lattice {
        levels: vec!["U".into()],
        categories: vec![],
    };
    let admin = Admin::new(&server, DataKey([7; 32]), lattice);
    admin.create_app("conns").await.unwrap();
    let probe = server.admin(None).await.unwrap();
    let began: f64 = probe
        .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
        .await
        .unwrap()
        .get(0);
    admin.label_role("conns", "U", None).await.unwrap();
    // Long enough for a backend whose client closed to be gone.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kept: i64 = probe
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = 'warden_app_conns' \
             AND application_name = 'warden' AND extract(epoch FROM backend_start)::float8 < $1",
            &[&began],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        kept, 1,
        "the first call's connection was not kept for the next"
    );
    drop(admin);
}
