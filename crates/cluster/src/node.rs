//! This node in the store: its record (`nodes/<id>`, with its roles, address and load) and the
//! lease every record of the node lives under, so that they vanish when the node does. Every
//! node registers, whatever its roles; a node without the agent keeps its record alive with
//! [`heartbeat`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use warden_core::{keys, model::now_ms, DriverKind, InstanceRecord, NodeRecord};
use warden_store::{put_json, LeaseId, Store, StoreError};

use crate::load;

/// What a node says of itself in its record.
#[derive(Debug, Clone, Default)]
pub struct NodeInfo {
    /// The node's name, unique among live nodes.
    pub id: String,
    /// Roles it runs.
    pub roles: Vec<String>,
    /// Its node port, if other nodes reach it.
    pub advertise: Option<String>,
    /// Drivers it can run instances with.
    pub drivers: Vec<DriverKind>,
    /// What enforces sandbox limits here.
    pub limits: String,
    /// A file the node's load is read from (JSON of [`warden_core::HostLoad`]'s fractions)
    /// instead of /proc: for load measured some other way, and for tests of placement by load
    /// on one machine, where every node would otherwise see the same host.
    pub load_file: Option<std::path::PathBuf>,
}

/// Weight of each new one-second CPU sample in the published, smoothed busy share.
const CPU_SMOOTHING: f64 = 0.1;

/// How often a node's record (and its load) is written again.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// This node's registration.
pub struct Node {
    info: NodeInfo,
    store: Arc<dyn Store>,
    ttl: Duration,
    lease: Mutex<LeaseId>,
    started_at_ms: u64,
    /// CPU counters at the previous publish, for the busy share since then.
    cpu: Mutex<Option<load::CpuTimes>>,
    /// The smoothed CPU busy share published last.
    cpu_smoothed: Mutex<Option<f64>>,
    /// Whether the node is drained now (published in its record).
    draining: std::sync::atomic::AtomicBool,
}

/// Why a node could not register.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another live node has the name.
    #[error("node name {name:?} is taken by a live node (host {host}, pid {pid}); give this one another --node-name, or stop that one")]
    NameTaken {
        /// The name.
        name: String,
        /// Host of the node holding it.
        host: String,
        /// Its pid.
        pid: u32,
    },
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default()
}

// === impl Node ===

impl Node {
    /// Claims the node's name and writes its record under a new lease. The claim is a
    /// compare-and-swap, so two nodes starting with one name never both hold it. A record of
    /// the name left by a process of this host that is gone (a crash) is taken over at once;
    /// any other is waited for until its lease would have expired, and refused if it stays.
    pub async fn register(
        store: Arc<dyn Store>,
        info: NodeInfo,
        ttl: Duration,
    ) -> Result<Self, RegisterError> {
        let key = keys::node(&info.id);
        let deadline = tokio::time::Instant::now() + ttl + Duration::from_secs(2);
        let node = Self {
            info,
            store,
            ttl,
            lease: Mutex::new(0),
            started_at_ms: now_ms(),
            cpu: Mutex::new(load::cpu_times()),
            cpu_smoothed: Mutex::new(None),
            draining: std::sync::atomic::AtomicBool::new(false),
        };
        loop {
            let expected = match node.store.get(&key).await? {
                None => None,
                Some(e) => {
                    let other = warden_store::decode::<NodeRecord>(&e.key, &e.value).ok();
                    let gone_here = other.as_ref().is_some_and(|o| {
                        o.hostname == hostname()
                            && !std::path::Path::new(&format!("/proc/{}", o.pid)).exists()
                    });
                    if !gone_here {
                        if tokio::time::Instant::now() >= deadline {
                            return Err(RegisterError::NameTaken {
                                name: node.info.id.clone(),
                                host: other
                                    .as_ref()
                                    .map(|o| o.hostname.clone())
                                    .unwrap_or_default(),
                                pid: other.map_or(0, |o| o.pid),
                            });
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        continue;
                    }
                    Some(e.mod_revision)
                }
            };
            let lease = node.store.grant_lease(ttl).await?;
            *lock(&node.lease) = lease;
            let bytes = serde_json::to_vec(&node.record(0)).map_err(|e| StoreError::Decode {
                key: key.clone(),
                reason: e.to_string(),
            })?;
            match node
                .store
                .compare_and_swap(&key, expected, Some(bytes), Some(lease))
                .await?
            {
                warden_store::CasOutcome::Done(_) => return Ok(node),
                warden_store::CasOutcome::Conflict { .. } => {
                    // Another process claimed it between our read and our write: look again.
                    let _ = node.store.revoke_lease(lease).await;
                }
            }
        }
    }

    /// The node's name.
    pub fn id(&self) -> &str {
        &self.info.id
    }

    /// The lease this node's records live under now.
    pub fn lease(&self) -> LeaseId {
        *lock(&self.lease)
    }

    /// How often the lease is kept alive and the record written again.
    pub fn renew_every(&self) -> Duration {
        PUBLISH_EVERY.min(self.ttl / 3)
    }

    /// The node's record, with `instances` and no load yet.
    fn record(&self, instances: u32) -> NodeRecord {
        NodeRecord {
            id: self.info.id.clone(),
            hostname: hostname(),
            pid: std::process::id(),
            started_at_ms: self.started_at_ms,
            load: warden_core::HostLoad {
                instances,
                ..Default::default()
            },
            limits: self.info.limits.clone(),
            roles: self.info.roles.clone(),
            advertise: self.info.advertise.clone(),
            drivers: self.info.drivers.clone(),
            draining: self.draining(),
        }
    }

    /// Whether the node is drained now.
    pub fn draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets whether the node is drained; true when that changed (publish again).
    pub fn set_draining(&self, on: bool) -> bool {
        self.draining.swap(on, std::sync::atomic::Ordering::Relaxed) != on
    }

    /// Writes the node's record with its load now and the instances it runs.
    pub async fn publish(&self, instances: u32) -> Result<(), StoreError> {
        let mut load = load::sample();
        load.instances = instances;
        if let Some(now) = load::cpu_times() {
            if let Some(before) = lock(&self.cpu).replace(now) {
                load.cpu_busy = load::busy_share(before, now);
            }
            // One second's busy share jumps with every burst; placement compares nodes by a
            // smoothed one (about ten seconds), as seed 003 used the 1-minute load average.
            let mut smoothed = lock(&self.cpu_smoothed);
            let s = smoothed.get_or_insert(load.cpu_busy);
            *s += CPU_SMOOTHING * (load.cpu_busy - *s);
            load.cpu_busy = *s;
        }
        if let Some(path) = &self.info.load_file {
            load::override_from(path, &mut load);
        }
        let mut record = self.record(instances);
        record.load = load;
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
    pub async fn keep_alive(&self) -> Result<(), StoreError> {
        self.store.keep_alive(self.lease()).await
    }

    /// Takes a new lease after the old one was lost; the caller writes the records again.
    pub async fn renew(&self) -> Result<LeaseId, StoreError> {
        let lease = self.store.grant_lease(self.ttl).await?;
        *lock(&self.lease) = lease;
        Ok(lease)
    }

    /// Deletes instance records this node left behind when it last died: their processes died
    /// with it (parent-death signal), and routing to them until their old lease expires would
    /// only produce errors.
    pub async fn remove_stale_records(&self) -> Result<(), StoreError> {
        let listing = self.store.list(keys::INSTANCES).await?;
        for e in listing.entries {
            let Ok(r) = warden_store::decode::<InstanceRecord>(&e.key, &e.value) else {
                continue;
            };
            if r.node == self.info.id && e.lease != Some(self.lease()) {
                tracing::info!(app = %r.app, instance = %r.id, "removing the record of an instance from before a crash");
                self.store
                    .compare_and_swap(&e.key, Some(e.mod_revision), None, None)
                    .await?;
            }
        }
        Ok(())
    }

    /// Removes the node's record and ends its lease, and with it every record under it.
    pub async fn deregister(&self) {
        let _ = self.store.delete(&keys::node(&self.info.id)).await;
        let _ = self.store.revoke_lease(self.lease()).await;
    }
}

/// Keeps the record of a node without the agent alive until `stop` turns true, then
/// deregisters it: the record says the node's roles and load, and a lost lease is taken anew.
pub async fn heartbeat(node: Arc<Node>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(node.renew_every()) => {}
            _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
        }
        let kept = match node.keep_alive().await {
            Err(StoreError::LeaseNotFound(_)) => node.renew().await.map(|_| ()),
            other => other,
        };
        if let Err(e) = kept.and(node.publish(0).await) {
            tracing::warn!(error = %e, "keeping the node's record failed");
        }
    }
    node.deregister().await;
}

/// Locks `m`. A panic while holding the node's lock leaves plain values behind, still usable,
/// so a poisoned lock is taken as it is.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn of_two_nodes_starting_with_one_name_exactly_one_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(warden_store::EmbeddedStore::open(&dir.path().join("store.redb")).unwrap());
        let info = NodeInfo {
            id: "twin".into(),
            ..NodeInfo::default()
        };
        let ttl = Duration::from_secs(1);
        let a = tokio::spawn(Node::register(store.clone(), info.clone(), ttl));
        let b = tokio::spawn(Node::register(store.clone(), info, ttl));
        // The holder stays alive, as a running node would.
        let lease = loop {
            if let Some(e) = store.get(&keys::node("twin")).await.unwrap() {
                break e.lease.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let keeper = tokio::spawn({
            let store = store.clone();
            async move {
                loop {
                    let _ = store.keep_alive(lease).await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        });
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        keeper.abort();
        let held = [a.is_ok(), b.is_ok()];
        assert_eq!(held.iter().filter(|h| **h).count(), 1, "{held:?}");
        let refused = if a.is_ok() { b } else { a };
        assert!(matches!(refused, Err(RegisterError::NameTaken { .. })));
    }
}
