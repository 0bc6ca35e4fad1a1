//! The node agent: starts, supervises and stops app instances on this machine.
//!
//! The agent owns the life of instances on its node: it starts them through a driver (a plain
//! process or a sandbox), JIT or from its slot and warm pools, waits until they accept
//! connections, records them in the store under the node's lease, enforces their lifetime
//! (shared per label, per user, per request; idle reaping; per-app and per-node maximums),
//! keeps each app's desired count running with backoff after crashes, publishes the node's
//! load, and kills every instance when it shuts down. It never routes requests and never decides who may see what: the gateway does that.
//! Instance environments never carry the agent's own environment.
#![deny(unsafe_code)]

mod driver;
mod error;
mod health;
mod keep;
mod load;
mod metrics;
mod net;
mod pool;
mod process;
pub mod sandbox;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::sync::watch;
use warden_core::{
    keys, model::now_ms, AppSpec, DriverKind, InstanceRecord, InstanceState, Lifetime, NodeRecord,
    StartPath,
};
use warden_store::{get_json, put_json, LeaseId, Store, StoreError};

pub use error::AgentError;
pub use net::connect;
pub use process::raise_open_file_limit;

/// Lines of an instance's output quoted in start errors and crash reports.
const LOG_TAIL_LINES: usize = 10;
/// Time an instance gets to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// How long readiness is polled every millisecond before the polls back off.
const FAST_POLL: Duration = Duration::from_millis(100);
/// Logs of this many exited instances stay readable; older ones are deleted.
const KEEP_EXITED_LOGS: usize = 64;

/// Agent settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// This node's id.
    pub node: String,
    /// Directory for instance logs.
    pub log_dir: PathBuf,
    /// Directory under which each instance gets its private writable directory.
    pub instance_dir: PathBuf,
    /// TTL of the node's lease; records vanish this long after the agent dies.
    pub lease_ttl: Duration,
    /// Most instances this node runs at once.
    pub max_instances: u32,
    /// Size at which an instance's log is cut back to its newer half.
    pub max_log_bytes: u64,
    /// Whether sandbox limits may use cgroups (else rlimits only).
    pub cgroups: bool,
    /// The bridge of network mode `bridged`, set up when an instance first needs it.
    pub bridge: sandbox::bridge::BridgeConfig,
}

/// Whom an instance is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    /// Everyone with the label.
    Shared,
    /// One user.
    User(String),
    /// One request: a fresh instance, never handed out again.
    Request,
}

impl Owner {
    /// The owner an app's lifetime asks for, given the user a request comes from.
    pub fn for_lifetime(lifetime: Lifetime, user: &str) -> Self {
        match lifetime {
            Lifetime::Shared => Self::Shared,
            Lifetime::PerUser => Self::User(user.to_owned()),
            Lifetime::PerRequest => Self::Request,
        }
    }
}

/// Use of an instance as the gateway reports it, read by the idle reaper.
#[derive(Debug, Default)]
pub struct Activity {
    last_used_ms: AtomicU64,
    in_flight: AtomicUsize,
}

/// Marks a request in flight on an instance until dropped.
pub struct ActivityGuard(Arc<Activity>);

impl Activity {
    /// Marks one request as in flight until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> ActivityGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.last_used_ms.store(now_ms(), Ordering::Relaxed);
        ActivityGuard(self.clone())
    }

    fn idle_for(&self, now: u64) -> Option<Duration> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let last = self.last_used_ms.load(Ordering::Relaxed);
        Some(Duration::from_millis(now.saturating_sub(last)))
    }
}

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        self.0.last_used_ms.store(now_ms(), Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why an instance is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// A request needs it.
    Serve,
    /// The app's desired count wants it.
    Kept,
    /// The warm pool wants it.
    Spare,
}

type StartResult = Option<Result<InstanceRecord, AgentError>>;
type ServeKey = (String, String, String);

enum Serving {
    Starting(watch::Receiver<StartResult>),
    Ready(InstanceRecord),
}

struct Running {
    record: InstanceRecord,
    exited: watch::Receiver<bool>,
    activity: Arc<Activity>,
    idle_timeout: Duration,
    /// Set when the agent stops the instance itself, so its exit is not a crash.
    stopping: Arc<AtomicBool>,
    log: PathBuf,
}

#[derive(Default)]
struct Counts {
    per_app: HashMap<String, u32>,
    total: u32,
}

struct Inner {
    store: Arc<dyn Store>,
    config: AgentConfig,
    lease: Mutex<LeaseId>,
    serving: Mutex<HashMap<ServeKey, Serving>>,
    running: Mutex<HashMap<String, Running>>,
    counts: Mutex<Counts>,
    /// Logs of exited instances, oldest first: (id, app, path).
    exited: Mutex<VecDeque<(String, String, PathBuf)>>,
    keeper: keep::Keeper,
    pools: pool::Pools,
    metrics: metrics::Metrics,
    stopping: watch::Sender<bool>,
    bridge: Arc<sandbox::bridge::Bridge>,
    cgroups: sandbox::cgroup::Cgroups,
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

fn serve_key(app: &str, label: &str, owner: &Owner) -> Option<ServeKey> {
    let who = match owner {
        Owner::Shared => String::new(),
        Owner::User(u) => u.clone(),
        Owner::Request => return None,
    };
    Some((app.to_owned(), label.to_owned(), who))
}

fn record_key(r: &InstanceRecord) -> Option<ServeKey> {
    match r.lifetime {
        Lifetime::PerRequest => None,
        _ => Some((
            r.app.clone(),
            r.label.clone(),
            r.owner.clone().unwrap_or_default(),
        )),
    }
}

// === impl Agent ===

impl Agent {
    /// Registers the node under a fresh lease and starts the background duties (lease renewal
    /// with the node's load, stopping instances of deleted apps, desired counts, idle reaping).
    pub async fn start(store: Arc<dyn Store>, config: AgentConfig) -> Result<Self, AgentError> {
        for dir in [&config.log_dir, &config.instance_dir] {
            std::fs::create_dir_all(dir).map_err(|e| AgentError::Spawn {
                app: String::new(),
                reason: format!("cannot create directory {}: {e}", dir.display()),
            })?;
        }
        let metrics = metrics::Metrics::new().map_err(|e| AgentError::Spawn {
            app: String::new(),
            reason: format!("cannot register the agent's metrics: {e}"),
        })?;
        let lease = store.grant_lease(config.lease_ttl).await?;
        let cgroups = if config.cgroups {
            sandbox::cgroup::Cgroups::detect()
        } else {
            sandbox::cgroup::Cgroups::off("turned off with warden up --cgroups off")
        };
        tracing::info!(limits = cgroups.summary(), "sandbox limits");
        let agent = Self {
            inner: Arc::new(Inner {
                store,
                cgroups,
                bridge: sandbox::bridge::Bridge::new(config.bridge.clone()),
                config,
                lease: Mutex::new(lease),
                serving: Mutex::new(HashMap::new()),
                running: Mutex::new(HashMap::new()),
                counts: Mutex::new(Counts::default()),
                exited: Mutex::new(VecDeque::new()),
                keeper: keep::Keeper::default(),
                pools: pool::Pools::default(),
                metrics,
                stopping: watch::channel(false).0,
            }),
        };
        agent.put_node().await?;
        agent.remove_stale_records().await?;
        tokio::spawn(agent.clone().renew_lease());
        tokio::spawn(agent.clone().follow_app_deletes());
        tokio::spawn(agent.clone().supervise());
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
        let mut load = load::sample();
        load.instances = lock(&self.inner.counts).total;
        let record = NodeRecord {
            id: self.inner.config.node.clone(),
            hostname: nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
            pid: std::process::id(),
            started_at_ms: now_ms(),
            load,
            limits: self.inner.cgroups.summary().to_owned(),
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

    /// Keeps the lease alive and the node's load current; if the lease was lost (the store
    /// expired it while we stalled), takes a new one and writes the node's records again so
    /// nothing stays missing.
    async fn renew_lease(self) {
        let mut stopping = self.inner.stopping.subscribe();
        let period = self.inner.config.lease_ttl / 3;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = stopping.changed() => return,
            }
            match self.inner.store.keep_alive(self.lease()).await {
                Ok(()) => {
                    if let Err(e) = self.put_node().await {
                        tracing::warn!(error = %e, "publishing the node's load failed");
                    }
                }
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
        self.inner.keeper.republish_all();
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
                        self.app_deleted(app);
                        let ids: Vec<String> = lock(&self.inner.running)
                            .values()
                            .filter(|r| r.record.app == app)
                            .map(|r| r.record.id.clone())
                            .collect();
                        for id in ids {
                            let _ = self.kill(&id).await;
                        }
                        self.inner.keeper.forget_app(app);
                        let _ = self
                            .inner
                            .store
                            .delete(&keys::health(app, self.node()))
                            .await;
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

    /// A ready instance of `app` for `label` and `owner`. Shared and per-user instances are
    /// started once and handed out again; concurrent callers share one start. A per-request
    /// instance is always new and never handed out again: stop it with [`Agent::retire`] after
    /// its request. Reads the app's spec from the store; a caller that holds it already uses
    /// [`Agent::ensure_spec`].
    pub async fn ensure(
        &self,
        app: &str,
        label: &str,
        owner: &Owner,
    ) -> Result<InstanceRecord, AgentError> {
        let spec = self.load_spec(app).await?;
        self.ensure_spec(&spec, label, owner).await
    }

    /// [`Agent::ensure`] for a caller that holds the app's spec, such as the gateway, whose
    /// request path must not wait for the store.
    pub async fn ensure_spec(
        &self,
        spec: &AppSpec,
        label: &str,
        owner: &Owner,
    ) -> Result<InstanceRecord, AgentError> {
        if *self.inner.stopping.borrow() {
            return Err(AgentError::ShuttingDown);
        }
        let Some(key) = serve_key(&spec.name, label, owner) else {
            return self
                .start_instance(spec, label, owner, Purpose::Serve)
                .await;
        };
        let mut rx = {
            let mut serving = lock(&self.inner.serving);
            match serving.get(&key) {
                Some(Serving::Ready(r)) => return Ok(r.clone()),
                Some(Serving::Starting(rx)) => rx.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    serving.insert(key.clone(), Serving::Starting(rx.clone()));
                    // The start runs on its own task so that a caller giving up does not leave
                    // a half-started instance behind.
                    let (agent, owner, spec) = (self.clone(), owner.clone(), spec.clone());
                    tokio::spawn(async move {
                        let result = agent
                            .start_instance(&spec, &key.1, &owner, Purpose::Serve)
                            .await;
                        agent.settle(key, &result);
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

    /// After a start, the serving map holds the instance if it still runs, and is free otherwise.
    fn settle(&self, key: ServeKey, result: &Result<InstanceRecord, AgentError>) {
        let mut serving = lock(&self.inner.serving);
        match result {
            Ok(r) if lock(&self.inner.running).contains_key(&r.id) => {
                serving.insert(key, Serving::Ready(r.clone()));
            }
            _ => {
                if matches!(serving.get(&key), Some(Serving::Starting(_))) {
                    serving.remove(&key);
                }
            }
        }
    }

    /// Counts a new instance against the app's and the node's maximum, or says which is full.
    fn reserve(&self, spec: &AppSpec) -> Result<(), AgentError> {
        let mut c = lock(&self.inner.counts);
        let node_max = self.inner.config.max_instances;
        if c.total >= node_max {
            return Err(AgentError::Full {
                what: "this node".into(),
                limit: node_max,
            });
        }
        let n = c.per_app.entry(spec.name.clone()).or_default();
        if spec.max_instances > 0 && *n >= spec.max_instances {
            return Err(AgentError::Full {
                what: format!("app {:?}", spec.name),
                limit: spec.max_instances,
            });
        }
        *n += 1;
        c.total += 1;
        Ok(())
    }

    fn release(&self, app: &str) {
        let mut c = lock(&self.inner.counts);
        if let Some(n) = c.per_app.get_mut(app) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_app.remove(app);
            }
        }
        c.total = c.total.saturating_sub(1);
    }

    /// The app's spec as the store holds it.
    async fn load_spec(&self, app: &str) -> Result<AppSpec, AgentError> {
        let (spec, _) = get_json::<AppSpec>(&*self.inner.store, &keys::app_spec(app))
            .await?
            .ok_or_else(|| AgentError::UnknownApp(app.to_owned()))?;
        Ok(spec)
    }

    async fn start_instance(
        &self,
        spec: &AppSpec,
        label: &str,
        owner: &Owner,
        purpose: Purpose,
    ) -> Result<InstanceRecord, AgentError> {
        let store = &*self.inner.store;
        let app = spec.name.as_str();
        if purpose == Purpose::Serve && spec.start == StartPath::Warm {
            if let Some(r) = self.take_spare(spec, label, owner) {
                return Ok(r);
            }
        }
        self.reserve(spec)?;
        let started = Instant::now();
        let slot = match (spec.start, purpose) {
            (StartPath::Slot, Purpose::Serve | Purpose::Kept) => self.take_slot(spec),
            _ => None,
        };
        let (id, path, launched) = match slot {
            Some(slot) => {
                let id = slot.id.clone();
                let env = BTreeMap::from([("WARDEN_LABEL".to_owned(), label.to_owned())]);
                let launched = slot.go(env);
                self.refill_soon(spec);
                (id, metrics::Path::Slot, launched)
            }
            None => {
                let id = warden_core::id::short_id();
                let dir = self.inner.config.instance_dir.join(&id);
                let log = self.log_path(app, &id);
                let mut env = self.instance_env(spec, &id);
                env.insert("WARDEN_LABEL".into(), label.to_owned());
                let launched = std::fs::create_dir_all(&dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))
                    .and_then(|()| {
                        let launch = driver::Launch {
                            spec,
                            env,
                            log: &log,
                            dir: &dir,
                            bridge: &self.inner.bridge,
                            cgroups: &self.inner.cgroups,
                        };
                        driver_for(spec.driver).start(&launch)
                    });
                (id, metrics::Path::Jit, launched)
            }
        };
        let log = self.log_path(app, &id);
        let dir = self.inner.config.instance_dir.join(&id);
        let driver::Started {
            mut child,
            addr,
            held,
        } = match launched {
            Ok(s) => s,
            Err(reason) => {
                self.release(app);
                let _ = std::fs::remove_dir_all(&dir);
                return Err(AgentError::Spawn {
                    app: app.to_owned(),
                    reason,
                });
            }
        };
        let pid = child.id().unwrap_or(0);
        let mut record = InstanceRecord {
            id: id.clone(),
            app: app.to_owned(),
            label: label.to_owned(),
            node: self.node().to_owned(),
            addr: addr.clone(),
            pid,
            state: InstanceState::Starting,
            started_at_ms: now_ms(),
            lifetime: spec.lifetime,
            owner: match owner {
                Owner::User(u) => Some(u.clone()),
                _ => None,
            },
            kept: purpose == Purpose::Kept,
        };
        let (exit_tx, exit_rx) = watch::channel(false);
        let (status_tx, status_rx) = tokio::sync::oneshot::channel::<String>();
        let activity = Arc::new(Activity::default());
        activity.last_used_ms.store(now_ms(), Ordering::Relaxed);
        let stopping = Arc::new(AtomicBool::new(false));
        lock(&self.inner.running).insert(
            id.clone(),
            Running {
                record: record.clone(),
                exited: exit_rx.clone(),
                activity,
                idle_timeout: Duration::from_millis(spec.idle_timeout_ms),
                stopping: stopping.clone(),
                log: log.clone(),
            },
        );
        tracing::info!(app, label, instance = %id, pid, %addr, driver = ?spec.driver, "instance starting");
        // The monitor owns the child: it reaps it and cleans up whenever it exits.
        let key = keys::instance(app, &id);
        let (agent, monitor_key, monitor_record) = (self.clone(), key.clone(), record.clone());
        let pooled = purpose == Purpose::Spare;
        tokio::spawn(async move {
            let mut status = match child.wait().await {
                Ok(s) => s.to_string(),
                Err(e) => format!("wait failed: {e}"),
            };
            // A kill by the out-of-memory killer is told where the operator looks.
            if let Some(oom) = held.oom_note() {
                let log = agent.log_path(&monitor_record.app, &monitor_record.id);
                process::append_log(&log, &format!("warden: {oom}"));
                tracing::warn!(app = %monitor_record.app, instance = %monitor_record.id, "{oom}");
                agent.inner.metrics.oom_killed(&monitor_record.app);
                status = format!("{status}; {oom}");
            }
            let _ = status_tx.send(status.clone());
            let state = agent.forget(&monitor_key, &monitor_record, &status).await;
            // Unroutable now: its address may be handed out again and its cgroups go (which
            // can wait for the kernel), before anyone waiting for the exit hears of it.
            held.release().await;
            let crashed = !stopping.load(Ordering::Relaxed);
            // A spare that dies before it is handed out is the pool's crash, backed off and
            // reported like a kept instance's; once handed out it is an ordinary instance.
            let pool_crash = pooled && state != Some(InstanceState::Ready);
            if crashed && (monitor_record.kept || pool_crash) {
                let tail = process::log_tail(
                    &agent.log_path(&monitor_record.app, &monitor_record.id),
                    LOG_TAIL_LINES,
                );
                agent.inner.keeper.crashed(
                    &monitor_record.app,
                    &monitor_record.label,
                    &status,
                    &tail,
                );
            }
            let _ = exit_tx.send(true);
        });
        self.publish_or_stop(&id, &key, &record).await?;

        let timeout = Duration::from_millis(spec.start_timeout_ms);
        match wait_ready(&addr, spec.health_path.as_deref(), exit_rx, timeout).await {
            Ready::Yes => {}
            Ready::Exited => {
                let status = status_rx.await.unwrap_or_else(|_| "unknown status".into());
                return Err(AgentError::Exited {
                    app: app.to_owned(),
                    status,
                    log_tail: process::log_tail(&log, LOG_TAIL_LINES),
                });
            }
            Ready::TimedOut(waiting_for) => {
                let _ = self.kill(&id).await;
                return Err(AgentError::Timeout {
                    app: app.to_owned(),
                    waited_ms: spec.start_timeout_ms,
                    waiting_for,
                    log_tail: process::log_tail(&log, LOG_TAIL_LINES),
                });
            }
        }
        self.inner.metrics.started(path, started.elapsed());
        let spare = purpose == Purpose::Spare;
        record.state = if spare {
            InstanceState::Spare
        } else {
            InstanceState::Ready
        };
        if spare {
            // Published before it can be handed out, so a hand-out's own write comes last.
            self.publish_or_stop(&id, &key, &record).await?;
        }
        let still_running = match lock(&self.inner.running).get_mut(&id) {
            Some(r) => {
                r.record = record.clone();
                true
            }
            None => false,
        };
        if !still_running {
            // Exited between accepting and now; the monitor already cleaned up.
            if spare {
                let _ = store.delete(&key).await;
            }
            return Err(AgentError::Exited {
                app: app.to_owned(),
                status: "exited right after starting".into(),
                log_tail: process::log_tail(&log, LOG_TAIL_LINES),
            });
        }
        if !spare {
            self.publish_or_stop(&id, &key, &record).await?;
        }
        tracing::info!(app, label, instance = %id, ms = started.elapsed().as_millis() as u64, path = ?path, spare, "instance ready");
        Ok(record)
    }

    /// Writes a starting instance's record; if the store refuses (a lost lease under a start
    /// storm, a full disk), stops the instance, which would otherwise run unrecorded and count
    /// against the node's maximum until it exited by itself.
    async fn publish_or_stop(
        &self,
        id: &str,
        key: &str,
        record: &InstanceRecord,
    ) -> Result<(), AgentError> {
        match put_json(&*self.inner.store, key, record, Some(self.lease())).await {
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::warn!(app = %record.app, instance = %id, error = %e, "cannot record a starting instance; stopping it");
                let _ = self.kill(id).await;
                Err(e.into())
            }
        }
    }

    /// The environment every instance of `spec` gets, but for its label.
    fn instance_env(&self, spec: &AppSpec, id: &str) -> BTreeMap<String, String> {
        let mut env = spec.env.clone();
        env.insert("WARDEN_APP".into(), spec.name.clone());
        env.insert("WARDEN_INSTANCE".into(), id.to_owned());
        env
    }

    /// The agent's metrics in Prometheus text format.
    pub fn render_metrics(&self) -> String {
        let m = &self.inner.metrics;
        m.pool.reset();
        for (app, label, kind, n) in self.pool_levels() {
            m.pool.with_label_values(&[&app, &label, kind]).set(n);
        }
        m.render()
    }

    fn log_path(&self, app: &str, id: &str) -> PathBuf {
        self.inner.config.log_dir.join(format!("{app}-{id}.log"))
    }

    /// Drops every trace of an exited instance but its log, which stays readable for a while;
    /// returns the state it was in.
    async fn forget(
        &self,
        key: &str,
        record: &InstanceRecord,
        status: &str,
    ) -> Option<InstanceState> {
        let id = &record.id;
        let gone = lock(&self.inner.running).remove(id);
        if let Some(r) = &gone {
            if let Some(key) = record_key(&r.record) {
                let mut serving = lock(&self.inner.serving);
                if matches!(serving.get(&key), Some(Serving::Ready(x)) if &x.id == id) {
                    serving.remove(&key);
                }
            }
            self.release(&r.record.app);
            tracing::info!(app = %r.record.app, instance = %id, %status, "instance exited");
            let mut exited = lock(&self.inner.exited);
            exited.push_back((id.clone(), r.record.app.clone(), r.log.clone()));
            while exited.len() > KEEP_EXITED_LOGS {
                if let Some((_, _, old)) = exited.pop_front() {
                    let _ = std::fs::remove_file(old);
                }
            }
        }
        let _ = std::fs::remove_dir_all(self.inner.config.instance_dir.join(id));
        if let Err(e) = self.inner.store.delete(key).await {
            tracing::warn!(instance = %id, error = %e, "could not remove the instance record; its lease will");
        }
        gone.map(|r| r.record.state)
    }

    /// Stops an instance: SIGTERM to its process group, SIGKILL after a grace period. Returns
    /// once it has exited and its record is gone.
    pub async fn kill(&self, id: &str) -> Result<(), AgentError> {
        let (pid, mut exited) = self
            .mark_stopping(id)
            .ok_or_else(|| AgentError::UnknownInstance(id.to_owned()))?;
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

    /// Stops a per-request instance after its request, in the background. It is killed at
    /// once: it has served the one request it was for.
    pub fn retire(&self, id: &str) {
        if let Some((pid, _)) = self.mark_stopping(id) {
            process::signal_group(pid, Signal::SIGKILL);
        }
    }

    /// Marks an instance as stopped by the agent (so its exit is no crash); its pid and exit
    /// signal, or None if it is not running here.
    fn mark_stopping(&self, id: &str) -> Option<(u32, watch::Receiver<bool>)> {
        let running = lock(&self.inner.running);
        let r = running.get(id)?;
        r.stopping.store(true, Ordering::Relaxed);
        Some((r.record.pid, r.exited.clone()))
    }

    /// The activity handle of a local instance, for the gateway to mark requests in flight.
    pub fn activity(&self, id: &str) -> Option<Arc<Activity>> {
        lock(&self.inner.running)
            .get(id)
            .map(|r| r.activity.clone())
    }

    /// Raises an instance's label (after taint): it stops serving its old label, serves the new
    /// one if that label has no instance yet, and its record says so.
    pub async fn relabel(&self, id: &str, label: &str) -> Result<(), AgentError> {
        let record = {
            let mut running = lock(&self.inner.running);
            let r = running
                .get_mut(id)
                .ok_or_else(|| AgentError::UnknownInstance(id.to_owned()))?;
            let old = record_key(&r.record);
            r.record.label = label.to_owned();
            // A tainted instance no longer counts toward its old label's desired count.
            r.record.kept = false;
            let record = r.record.clone();
            let mut serving = lock(&self.inner.serving);
            if let Some(old) = old {
                if matches!(serving.get(&old), Some(Serving::Ready(x)) if x.id == id) {
                    serving.remove(&old);
                }
            }
            if let Some(new) = record_key(&record) {
                serving
                    .entry(new)
                    .or_insert_with(|| Serving::Ready(record.clone()));
            }
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

    /// The last `lines` lines an instance of this node printed, running or recently exited.
    pub fn logs(&self, id: &str, lines: usize) -> Result<String, AgentError> {
        let path = lock(&self.inner.running)
            .get(id)
            .map(|r| r.log.clone())
            .or_else(|| {
                lock(&self.inner.exited)
                    .iter()
                    .find(|(x, _, _)| x == id)
                    .map(|(_, _, p)| p.clone())
            })
            .ok_or_else(|| AgentError::UnknownInstance(id.to_owned()))?;
        Ok(process::log_tail(&path, lines))
    }

    /// Stops every instance, removes the node's records and ends its lease.
    pub async fn shutdown(&self) {
        let _ = self.inner.stopping.send(true);
        self.drain_slots(None);
        let ids: Vec<String> = lock(&self.inner.running).keys().cloned().collect();
        let kills = ids.iter().map(|id| self.kill(id));
        futures_util::future::join_all(kills).await;
        self.inner.bridge.remove_if_created();
        self.inner.cgroups.remove();
        let _ = self.inner.store.delete(&keys::node(self.node())).await;
        let _ = self.inner.store.revoke_lease(self.lease()).await;
        tracing::info!(node = %self.node(), stopped = ids.len(), "agent stopped");
    }
}

fn driver_for(kind: DriverKind) -> &'static dyn driver::Driver {
    match kind {
        DriverKind::Process => &process::ProcessDriver,
        DriverKind::Sandbox => &sandbox::SandboxDriver,
    }
}

enum Ready {
    Yes,
    Exited,
    /// What was still missing.
    TimedOut(String),
}

/// Waits until the app at `addr` is ready, the process exits, or `timeout` passes. Ready means
/// accepting a TCP connection and, when the app names a health path, answering it 2xx or 3xx.
async fn wait_ready(
    addr: &str,
    health: Option<&str>,
    mut exited: watch::Receiver<bool>,
    timeout: Duration,
) -> Ready {
    let started = tokio::time::Instant::now();
    let deadline = started + timeout;
    let mut pause = Duration::from_millis(1);
    // What the health path said last; `None` until it has answered anything.
    let mut answer: Option<String> = None;
    let mut accepted = false;
    loop {
        if *exited.borrow() {
            return Ready::Exited;
        }
        if let Ok(conn) = net::connect(addr).await {
            let Some(path) = health else {
                return Ready::Yes;
            };
            accepted = true;
            // An app that accepts and never answers must not hold the start past its timeout;
            // a check the deadline cuts short leaves the earlier answer standing.
            match tokio::time::timeout_at(deadline, health::check(conn, path)).await {
                Ok(Ok(status)) if (200..400).contains(&status) => return Ready::Yes,
                Ok(Ok(status)) => answer = Some(format!("answered {status}")),
                Ok(Err(e)) => answer = Some(format!("gave no HTTP answer ({e})")),
                Err(_) => {}
            }
        }
        if tokio::time::Instant::now() >= deadline {
            let missing = match (health, answer) {
                (Some(path), Some(a)) => {
                    format!("its health path {path} {a}; it must answer 2xx or 3xx")
                }
                (Some(path), None) if accepted => format!("its health path {path} did not answer"),
                _ => "it must listen on 127.0.0.1:$PORT".to_owned(),
            };
            return Ready::TimedOut(missing);
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = exited.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
        // Most apps accept within tens of milliseconds: poll at the timer's resolution until
        // then, so a start is not rounded up to the next of a doubling series of polls, and
        // back off for slow ones.
        if started.elapsed() >= FAST_POLL {
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
}
