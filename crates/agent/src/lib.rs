//! The node agent: starts, supervises and stops app instances on this machine.
//!
//! The agent owns the life of instances on its node: it starts one on request (one shared
//! instance per app and label), waits until it accepts connections, records it in the store
//! under the node's lease, removes the record when the process exits, and kills every instance
//! when it shuts down. It never routes requests and never decides who may see what: the gateway
//! does that. Instance environments never carry the agent's own environment.
#![deny(unsafe_code)]

mod process;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::sync::watch;
use warden_core::{keys, model::now_ms, AppSpec, InstanceRecord, InstanceState, NodeRecord};
use warden_store::{get_json, put_json, LeaseId, Store, StoreError};

/// Lines of an instance's output quoted in start errors.
const LOG_TAIL_LINES: usize = 10;
/// Time an instance gets to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// Why an instance could not be started or found.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentError {
    /// No app of that name is registered.
    #[error("no app named {0:?} is registered; create it with `warden apps create`")]
    UnknownApp(String),
    /// The program could not be started.
    #[error("cannot start app {app:?}: {reason}; check the app's command and workdir")]
    Spawn {
        /// App name.
        app: String,
        /// OS error.
        reason: String,
    },
    /// The program exited before accepting connections.
    #[error(
        "app {app:?} exited ({status}) before accepting connections; its last output:\n{log_tail}"
    )]
    Exited {
        /// App name.
        app: String,
        /// Exit status.
        status: String,
        /// Last lines the instance printed.
        log_tail: String,
    },
    /// The program did not accept connections in time.
    #[error("app {app:?} did not accept connections within {waited_ms} ms; it must listen on 127.0.0.1:$PORT. Its last output:\n{log_tail}")]
    Timeout {
        /// App name.
        app: String,
        /// How long the agent waited.
        waited_ms: u64,
        /// Last lines the instance printed.
        log_tail: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The agent is stopping.
    #[error("the agent is shutting down")]
    ShuttingDown,
    /// No instance with that id runs on this node.
    #[error("no instance {0:?} runs on this node")]
    UnknownInstance(String),
}

/// Agent settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// This node's id.
    pub node: String,
    /// Directory for instance logs.
    pub log_dir: PathBuf,
    /// TTL of the node's lease; records vanish this long after the agent dies.
    pub lease_ttl: Duration,
}

type StartResult = Option<Result<InstanceRecord, AgentError>>;

enum Slot {
    Starting(watch::Receiver<StartResult>),
    Ready(InstanceRecord),
}

struct Running {
    record: InstanceRecord,
    exited: watch::Receiver<bool>,
}

struct Inner {
    store: Arc<dyn Store>,
    config: AgentConfig,
    lease: Mutex<LeaseId>,
    slots: Mutex<HashMap<(String, String), Slot>>,
    running: Mutex<HashMap<String, Running>>,
    stopping: watch::Sender<bool>,
}

/// Handle to the agent; cheap to clone.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain maps behind, still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// === impl Agent ===

impl Agent {
    /// Registers the node under a fresh lease and starts the background duties (lease renewal,
    /// stopping instances of deleted apps).
    pub async fn start(store: Arc<dyn Store>, config: AgentConfig) -> Result<Self, AgentError> {
        std::fs::create_dir_all(&config.log_dir).map_err(|e| AgentError::Spawn {
            app: String::new(),
            reason: format!(
                "cannot create log directory {}: {e}",
                config.log_dir.display()
            ),
        })?;
        let lease = store.grant_lease(config.lease_ttl).await?;
        let agent = Self {
            inner: Arc::new(Inner {
                store,
                config,
                lease: Mutex::new(lease),
                slots: Mutex::new(HashMap::new()),
                running: Mutex::new(HashMap::new()),
                stopping: watch::channel(false).0,
            }),
        };
        agent.put_node().await?;
        agent.remove_stale_records().await?;
        tokio::spawn(agent.clone().renew_lease());
        tokio::spawn(agent.clone().follow_app_deletes());
        Ok(agent)
    }

    /// This node's id.
    pub fn node(&self) -> &str {
        &self.inner.config.node
    }

    fn lease(&self) -> LeaseId {
        *lock(&self.inner.lease)
    }

    async fn put_node(&self) -> Result<(), StoreError> {
        let record = NodeRecord {
            id: self.inner.config.node.clone(),
            hostname: nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
            pid: std::process::id(),
            started_at_ms: now_ms(),
        };
        put_json(
            &*self.inner.store,
            &keys::node(&record.id),
            &record,
            Some(self.lease()),
        )
        .await?;
        Ok(())
    }

    /// Deletes instance records this node left behind when it last died: their processes died
    /// with it (parent-death signal), and routing to them until their old lease expires would
    /// only produce errors.
    async fn remove_stale_records(&self) -> Result<(), StoreError> {
        let listing = self.inner.store.list(keys::INSTANCES).await?;
        for e in listing.entries {
            let Ok(r) = warden_store::decode::<InstanceRecord>(&e.key, &e.value) else {
                continue;
            };
            if r.node == self.node() && e.lease != Some(self.lease()) {
                tracing::info!(app = %r.app, instance = %r.id, "removing the record of an instance from before a crash");
                self.inner
                    .store
                    .compare_and_swap(&e.key, Some(e.mod_revision), None, None)
                    .await?;
            }
        }
        Ok(())
    }

    /// Keeps the lease alive; if it was lost (the store expired it while we stalled), takes a new
    /// one and writes the node's records again so nothing stays missing.
    async fn renew_lease(self) {
        let mut stopping = self.inner.stopping.subscribe();
        let period = self.inner.config.lease_ttl / 3;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = stopping.changed() => return,
            }
            match self.inner.store.keep_alive(self.lease()).await {
                Ok(()) => {}
                Err(StoreError::LeaseNotFound(_)) => {
                    tracing::warn!(node = %self.node(), "node lease was lost; registering again");
                    if let Err(e) = self.reregister().await {
                        tracing::error!(error = %e, "re-registering the node failed");
                    }
                }
                Err(StoreError::Closed) => return,
                Err(e) => tracing::warn!(error = %e, "lease keep-alive failed"),
            }
        }
    }

    async fn reregister(&self) -> Result<(), StoreError> {
        let lease = self
            .inner
            .store
            .grant_lease(self.inner.config.lease_ttl)
            .await?;
        *lock(&self.inner.lease) = lease;
        self.put_node().await?;
        let records: Vec<InstanceRecord> = lock(&self.inner.running)
            .values()
            .map(|r| r.record.clone())
            .collect();
        for r in records {
            put_json(
                &*self.inner.store,
                &keys::instance(&r.app, &r.id),
                &r,
                Some(lease),
            )
            .await?;
        }
        Ok(())
    }

    /// Stops the instances of apps that are deleted.
    async fn follow_app_deletes(self) {
        let mut stopping = self.inner.stopping.subscribe();
        let Ok(mut w) = self.inner.store.watch(keys::APPS, 0).await else {
            return;
        };
        loop {
            let ev = tokio::select! {
                ev = w.next() => ev,
                _ = stopping.changed() => return,
            };
            match ev {
                Some(Ok(ev)) if ev.kind == warden_store::EventKind::Delete => {
                    if let Some(app) = ev
                        .key
                        .strip_prefix("apps/")
                        .and_then(|k| k.strip_suffix("/spec"))
                    {
                        let ids: Vec<String> = lock(&self.inner.running)
                            .values()
                            .filter(|r| r.record.app == app)
                            .map(|r| r.record.id.clone())
                            .collect();
                        for id in ids {
                            let _ = self.kill(&id).await;
                        }
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "app watch ended; restarting it");
                    match self.inner.store.watch(keys::APPS, 0).await {
                        Ok(nw) => w = nw,
                        Err(_) => return,
                    }
                }
                None => return,
            }
        }
    }

    /// A ready instance of `app` for `label`, starting one if none runs. Concurrent callers for
    /// the same app and label share one start.
    pub async fn ensure(&self, app: &str, label: &str) -> Result<InstanceRecord, AgentError> {
        if *self.inner.stopping.borrow() {
            return Err(AgentError::ShuttingDown);
        }
        let slot_key = (app.to_owned(), label.to_owned());
        let mut rx = {
            let mut slots = lock(&self.inner.slots);
            match slots.get(&slot_key) {
                Some(Slot::Ready(r)) => return Ok(r.clone()),
                Some(Slot::Starting(rx)) => rx.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    slots.insert(slot_key.clone(), Slot::Starting(rx.clone()));
                    // The start runs on its own task so that a caller giving up does not leave
                    // a half-started instance behind.
                    let agent = self.clone();
                    tokio::spawn(async move {
                        let result = agent.start_instance(&slot_key.0, &slot_key.1).await;
                        {
                            let mut slots = lock(&agent.inner.slots);
                            match &result {
                                Ok(r) if lock(&agent.inner.running).contains_key(&r.id) => {
                                    slots.insert(slot_key, Slot::Ready(r.clone()));
                                }
                                _ => {
                                    slots.remove(&slot_key);
                                }
                            }
                        }
                        let _ = tx.send(Some(result));
                    });
                    rx
                }
            }
        };
        let done = rx
            .wait_for(|r| r.is_some())
            .await
            .map_err(|_| AgentError::ShuttingDown)?;
        done.clone().unwrap_or(Err(AgentError::ShuttingDown))
    }

    async fn start_instance(&self, app: &str, label: &str) -> Result<InstanceRecord, AgentError> {
        let store = &*self.inner.store;
        let (spec, _) = get_json::<AppSpec>(store, &keys::app_spec(app))
            .await?
            .ok_or_else(|| AgentError::UnknownApp(app.to_owned()))?;
        let id = warden_core::id::short_id();
        let spawn_err = |reason: String| AgentError::Spawn {
            app: app.to_owned(),
            reason,
        };
        let port =
            process::free_port().map_err(|e| spawn_err(format!("no free loopback port: {e}")))?;
        let log = self.log_path(app, &id);
        let mut env: BTreeMap<String, String> = spec.env.clone();
        env.insert("PORT".into(), port.to_string());
        env.insert("WARDEN_APP".into(), app.to_owned());
        env.insert("WARDEN_LABEL".into(), label.to_owned());
        env.insert("WARDEN_INSTANCE".into(), id.clone());
        let launch = process::Launch {
            command: &spec.command,
            workdir: spec.workdir.as_deref(),
            env,
            log: &log,
        };
        let started = Instant::now();
        let mut child = process::spawn(&launch).map_err(|e| spawn_err(e.to_string()))?;
        let pid = child.id().unwrap_or(0);
        let addr = process::loopback(port);
        let mut record = InstanceRecord {
            id: id.clone(),
            app: app.to_owned(),
            label: label.to_owned(),
            node: self.node().to_owned(),
            addr: addr.to_string(),
            pid,
            state: InstanceState::Starting,
            started_at_ms: now_ms(),
        };
        let (exit_tx, exit_rx) = watch::channel(false);
        let (status_tx, status_rx) = tokio::sync::oneshot::channel::<String>();
        lock(&self.inner.running).insert(
            id.clone(),
            Running {
                record: record.clone(),
                exited: exit_rx.clone(),
            },
        );
        tracing::info!(app, label, instance = %id, pid, %addr, "instance starting");
        // The monitor owns the child: it reaps it and cleans up whenever it exits.
        let key = keys::instance(app, &id);
        let (agent, monitor_key, monitor_id) = (self.clone(), key.clone(), id.clone());
        tokio::spawn(async move {
            let status = match child.wait().await {
                Ok(s) => s.to_string(),
                Err(e) => format!("wait failed: {e}"),
            };
            let _ = status_tx.send(status.clone());
            agent.forget(&monitor_key, &monitor_id, &status).await;
            let _ = exit_tx.send(true);
        });
        put_json(store, &key, &record, Some(self.lease())).await?;

        let timeout = Duration::from_millis(spec.start_timeout_ms);
        match wait_ready(addr, exit_rx, timeout).await {
            Ready::Yes => {}
            Ready::Exited => {
                let status = status_rx.await.unwrap_or_else(|_| "unknown status".into());
                return Err(AgentError::Exited {
                    app: app.to_owned(),
                    status,
                    log_tail: process::log_tail(&log, LOG_TAIL_LINES),
                });
            }
            Ready::TimedOut => {
                let _ = self.kill(&id).await;
                return Err(AgentError::Timeout {
                    app: app.to_owned(),
                    waited_ms: spec.start_timeout_ms,
                    log_tail: process::log_tail(&log, LOG_TAIL_LINES),
                });
            }
        }
        record.state = InstanceState::Ready;
        if let Some(r) = lock(&self.inner.running).get_mut(&id) {
            r.record = record.clone();
        } else {
            // Exited between accepting and now; the monitor already cleaned up.
            return Err(AgentError::Exited {
                app: app.to_owned(),
                status: "exited right after starting".into(),
                log_tail: process::log_tail(&log, LOG_TAIL_LINES),
            });
        }
        put_json(store, &key, &record, Some(self.lease())).await?;
        tracing::info!(app, label, instance = %id, ms = started.elapsed().as_millis() as u64, "instance ready");
        Ok(record)
    }

    fn log_path(&self, app: &str, id: &str) -> PathBuf {
        self.inner.config.log_dir.join(format!("{app}-{id}.log"))
    }

    /// Drops every trace of an exited instance.
    async fn forget(&self, key: &str, id: &str, status: &str) {
        let gone = lock(&self.inner.running).remove(id);
        if let Some(r) = &gone {
            let mut slots = lock(&self.inner.slots);
            let slot_key = (r.record.app.clone(), r.record.label.clone());
            if matches!(slots.get(&slot_key), Some(Slot::Ready(x)) if x.id == id) {
                slots.remove(&slot_key);
            }
            tracing::info!(app = %r.record.app, instance = %id, %status, "instance exited");
        }
        if let Err(e) = self.inner.store.delete(key).await {
            tracing::warn!(instance = %id, error = %e, "could not remove the instance record; its lease will");
        }
    }

    /// Stops an instance: SIGTERM to its process group, SIGKILL after a grace period. Returns
    /// once it has exited and its record is gone.
    pub async fn kill(&self, id: &str) -> Result<(), AgentError> {
        let (pid, mut exited) = {
            let running = lock(&self.inner.running);
            let r = running
                .get(id)
                .ok_or_else(|| AgentError::UnknownInstance(id.to_owned()))?;
            (r.record.pid, r.exited.clone())
        };
        process::signal_group(pid, Signal::SIGTERM);
        if tokio::time::timeout(STOP_GRACE, exited.wait_for(|e| *e))
            .await
            .is_err()
        {
            process::signal_group(pid, Signal::SIGKILL);
            let _ = exited.wait_for(|e| *e).await;
        }
        Ok(())
    }

    /// Raises an instance's label (after taint): it stops serving its old label, serves the new
    /// one if that label has no instance yet, and its record says so.
    pub async fn relabel(&self, id: &str, label: &str) -> Result<(), AgentError> {
        let record = {
            let mut running = lock(&self.inner.running);
            let r = running
                .get_mut(id)
                .ok_or_else(|| AgentError::UnknownInstance(id.to_owned()))?;
            let old = (r.record.app.clone(), r.record.label.clone());
            r.record.label = label.to_owned();
            let record = r.record.clone();
            let mut slots = lock(&self.inner.slots);
            if matches!(slots.get(&old), Some(Slot::Ready(x)) if x.id == id) {
                slots.remove(&old);
            }
            slots
                .entry((record.app.clone(), label.to_owned()))
                .or_insert_with(|| Slot::Ready(record.clone()));
            record
        };
        put_json(
            &*self.inner.store,
            &keys::instance(&record.app, id),
            &record,
            Some(self.lease()),
        )
        .await?;
        Ok(())
    }

    /// Instances running on this node.
    pub fn instances(&self) -> Vec<InstanceRecord> {
        let mut v: Vec<_> = lock(&self.inner.running)
            .values()
            .map(|r| r.record.clone())
            .collect();
        v.sort_by(|a, b| (&a.app, &a.label, &a.id).cmp(&(&b.app, &b.label, &b.id)));
        v
    }

    /// Stops every instance, removes the node's records and ends its lease.
    pub async fn shutdown(&self) {
        let _ = self.inner.stopping.send(true);
        let ids: Vec<String> = lock(&self.inner.running).keys().cloned().collect();
        let kills = ids.iter().map(|id| self.kill(id));
        futures_util::future::join_all(kills).await;
        let _ = self.inner.store.delete(&keys::node(self.node())).await;
        let _ = self.inner.store.revoke_lease(self.lease()).await;
        tracing::info!(node = %self.node(), stopped = ids.len(), "agent stopped");
    }
}

enum Ready {
    Yes,
    Exited,
    TimedOut,
}

/// Waits until `addr` accepts a TCP connection, the process exits, or `timeout` passes.
async fn wait_ready(
    addr: std::net::SocketAddr,
    mut exited: watch::Receiver<bool>,
    timeout: Duration,
) -> Ready {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        if *exited.borrow() {
            return Ready::Exited;
        }
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ready::Yes;
        }
        if tokio::time::Instant::now() >= deadline {
            return Ready::TimedOut;
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = exited.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}
