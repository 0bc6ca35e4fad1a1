//! A cancel still on its way to PostgreSQL when its client leaves must not stop the next
//! client's query on the same server connection (the race of pgbouncer#717): a relay in
//! front of the server holds cancel requests back until the test lets them go.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;
use warden_data::proxy::{Limits, ServerAddr};

use super::pg::Pg;
use super::{connect, Setup};

/// A Unix socket relay to PostgreSQL's socket that passes everything at once except cancel
/// requests, which wait for `release`.
struct HoldingRelay {
    dir: TempDir,
    release: Arc<Notify>,
}

impl HoldingRelay {
    fn start(to: PathBuf) -> HoldingRelay {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join(".s.PGSQL.5432")).unwrap();
        let release = Arc::new(Notify::new());
        let gate = release.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let to = to.clone();
                let gate = gate.clone();
                tokio::spawn(async move {
                    let mut head = [0u8; 8];
                    if client.read_exact(&mut head).await.is_err() {
                        return;
                    }
                    if head == [0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e] {
                        gate.notified().await;
                    }
                    let mut server = UnixStream::connect(&to).await.unwrap();
                    server.write_all(&head).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
        HoldingRelay { dir, release }
    }

    fn dir(&self) -> &Path {
        self.dir.path()
    }
}

#[tokio::test]
async fn a_cancel_still_on_its_way_stops_no_later_clients_query() {
    let pg = Pg::start().await;
    let relay = HoldingRelay::start(pg.socket_dir.join(".s.PGSQL.5432"));
    let mut target = pg.target();
    target.server = ServerAddr::Unix {
        dir: relay.dir().to_owned(),
        port: 5432,
    };
    // One server connection for the app, so the next client has the one the first used.
    let limits = Limits {
        max_server_per_app: 1,
        ..Limits::default()
    };
    let setup = Setup::with_target(pg, target, limits);

    // A query that ends on its own while its client's cancel is held back.
    let first = connect(setup.dir()).await.unwrap();
    let token = first.cancel_token();
    let query = tokio::spawn(async move {
        let r = first.batch_execute("SELECT pg_sleep(0.5)").await;
        (first, r)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cancel = tokio::spawn(async move { token.cancel_query(tokio_postgres::NoTls).await });
    let (first, r) = query.await.unwrap();
    r.unwrap();
    drop(first);

    // The next client, with a query of its own that outlasts the held cancel's release (or,
    // as it should be, waiting for the connection until the cancel is done with).
    let dir = setup.dir().to_owned();
    let sleeping = tokio::spawn(async move {
        let second = connect(&dir).await?;
        second.batch_execute("SELECT pg_sleep(1.5)").await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.release.notify_waiters();
    cancel.await.unwrap().unwrap();
    let answer = sleeping.await.unwrap();
    assert!(
        answer.is_ok(),
        "a cancel sent by a client that had left stopped another client's query: {answer:?}"
    );
}
