//! This node in the store: its record (`nodes/<id>`, with its load) and the lease every record
//! of the node lives under, so that they vanish when the node does.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use warden_core::{keys, model::now_ms, InstanceRecord, NodeRecord};
use warden_store::{put_json, LeaseId, Store, StoreError};

use crate::load;
use crate::sync::lock;

/// This node's registration.
pub(crate) struct Node {
    id: String,
    store: Arc<dyn Store>,
    ttl: Duration,
    lease: Mutex<LeaseId>,
    /// What enforces sandbox limits here, published in the node record.
    limits: String,
}

// === impl Node ===

impl Node {
    /// Takes a lease for node `id`; [`Node::publish`] writes its record.
    pub(crate) async fn register(
        store: Arc<dyn Store>,
        id: String,
        ttl: Duration,
        limits: String,
    ) -> Result<Self, StoreError> {
        let lease = store.grant_lease(ttl).await?;
        Ok(Self {
            id,
            store,
            ttl,
            lease: Mutex::new(lease),
            limits,
        })
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The lease this node's records live under now.
    pub(crate) fn lease(&self) -> LeaseId {
        *lock(&self.lease)
    }

    /// How often the lease must be kept alive.
    pub(crate) fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    /// Writes the node's record with its load now and the instances it runs.
    pub(crate) async fn publish(&self, instances: u32) -> Result<(), StoreError> {
        let mut load = load::sample();
        load.instances = instances;
        let record = NodeRecord {
            id: self.id.clone(),
            hostname: nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
            pid: std::process::id(),
            started_at_ms: now_ms(),
            load,
            limits: self.limits.clone(),
        };
        put_json(
            &*self.store,
            &keys::node(&record.id),
            &record,
            Some(self.lease()),
        )
        .await?;
        Ok(())
    }

    /// Keeps the lease alive; `LeaseNotFound` when the store expired it meanwhile.
    pub(crate) async fn keep_alive(&self) -> Result<(), StoreError> {
        self.store.keep_alive(self.lease()).await
    }

    /// Takes a new lease after the old one was lost; the caller writes the records again.
    pub(crate) async fn renew(&self) -> Result<LeaseId, StoreError> {
        let lease = self.store.grant_lease(self.ttl).await?;
        *lock(&self.lease) = lease;
        Ok(lease)
    }

    /// Deletes instance records this node left behind when it last died: their processes died
    /// with it (parent-death signal), and routing to them until their old lease expires would
    /// only produce errors.
    pub(crate) async fn remove_stale_records(&self) -> Result<(), StoreError> {
        let listing = self.store.list(keys::INSTANCES).await?;
        for e in listing.entries {
            let Ok(r) = warden_store::decode::<InstanceRecord>(&e.key, &e.value) else {
                continue;
            };
            if r.node == self.id && e.lease != Some(self.lease()) {
                tracing::info!(app = %r.app, instance = %r.id, "removing the record of an instance from before a crash");
                self.store
                    .compare_and_swap(&e.key, Some(e.mod_revision), None, None)
                    .await?;
            }
        }
        Ok(())
    }

    /// Removes the node's record and ends its lease, and with it every record under it.
    pub(crate) async fn deregister(&self) {
        let _ = self.store.delete(&keys::node(&self.id)).await;
        let _ = self.store.revoke_lease(self.lease()).await;
    }
}
