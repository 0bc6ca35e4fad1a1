//! The admin connections of one [`super::Admin`]: one per database, made at first use and
//! reused by every later call on the same `Admin`, so a chain of calls (an instance's attach:
//! label the tables, then make the role) opens each connection once instead of per call.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Mutex;
use tokio_postgres::Client;

use crate::server::{Server, ServerError};

/// Admin connections by database (`None`: the server's own, as [`Server::admin`] takes it).
#[derive(Default)]
pub(super) struct Conns {
    open: Mutex<HashMap<Option<String>, Arc<Client>>>,
}

impl Conns {
    /// The connection to `db`: the one made before if it is still open, else a new one.
    pub(super) async fn get(
        &self,
        server: &Server,
        db: Option<&str>,
    ) -> Result<Arc<Client>, ServerError> {
        let key = db.map(str::to_owned);
        // Held across the connect so two calls at once make one connection, not two.
        let mut open = self.open.lock().await;
        if let Some(c) = open.get(&key).filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let c = Arc::new(server.admin(db).await?);
        open.insert(key, c.clone());
        Ok(c)
    }
}

/// Ends every session of `role` and waits until none is left, for at most 10 s; returns
/// whether none is left. `pg_terminate_backend` only signals, so each round counts what the
/// last one had not ended yet.
pub(super) async fn end_sessions(admin: &Client, role: &str) -> Result<bool, super::SchemaError> {
    for _ in 0..100 {
        let left: i64 = admin
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE usename = $1",
                &[&role],
            )
            .await
            .map_err(super::sql("ending a role's sessions"))?
            .get(0);
        if left == 0 {
            return Ok(true);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Ok(false)
}
