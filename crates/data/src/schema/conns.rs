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
