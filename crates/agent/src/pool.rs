//! The slot pool and the warm pool: the work of a start done before a request needs it (seed
//! 002 §4.6: the tap pool and AOT).
//!
//! A slot is a sandbox prepared up to the point where only the app is missing: namespaces,
//! mounts, loopback, the connection socket, all waiting in `sandbox-init` for its start message.
//! Taking one sends the message (the label's part of the environment), so a request waits only
//! for the app itself. Slots are per app and prepared from the app's spec of the time; one
//! prepared from another spec is thrown away instead of used.
//!
//! A spare is a whole instance already running for one label, held back from routing (state
//! `spare`) until a request takes it. It then becomes an ordinary instance of the app's lifetime:
//! shared by the label, that user's, or that one request's.
//!
//! Each node keeps its own pools at the sizes the app asks for, refills them right after a take
//! and on every supervision tick, trims what is no longer asked for, and backs off when refills
//! fail (a broken app must not be started in a tight loop).

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nix::sys::signal::Signal;
use tokio::io::AsyncReadExt;
use tokio::process::Child;
use warden_core::{AppSpec, InstanceState, StartPath};

use crate::driver::{Launch, Started};
use crate::{keep, lock, process, sandbox, Agent, AgentError, Owner, Purpose};

/// How long a refill waits after a take; see [`Agent::refill_soon`].
const REFILL_DELAY: std::time::Duration = std::time::Duration::from_millis(20);
/// Spares starting at once on a node, over all apps and labels.
const MAX_SPARE_STARTS: u32 = 16;
/// Spares of one app starting at once, so that an app whose spares hang until their start
/// timeout cannot hold every start of the node.
const MAX_SPARE_STARTS_PER_APP: u32 = 8;

/// (app, label); the label is empty for slots, which serve any label.
type PoolKey = (String, String);

/// A prepared sandbox waiting for its app.
pub(crate) struct Slot {
    /// The id the instance will have; its directory and log are already named after it.
    pub id: String,
    log: PathBuf,
    fingerprint: Vec<u8>,
    child: Child,
    addr: String,
    control: std::os::unix::net::UnixStream,
    prepared: Arc<AtomicBool>,
    held: sandbox::Held,
}

/// The pools of this node.
#[derive(Default)]
pub(crate) struct Pools {
    slots: Mutex<HashMap<String, VecDeque<Slot>>>,
    /// Spare starts in progress.
    pending: Mutex<HashMap<PoolKey, u32>>,
    /// Refill failures in a row, and when the next refill may be tried.
    failures: Mutex<HashMap<PoolKey, (u32, Instant)>>,
    /// App deletions seen so far. A refill planned from a spec read before a delete must not
    /// bring the deleted app's pool back: it compares this count with the one it started from.
    deletions: AtomicU64,
}

/// What of a spec a prepared slot depends on.
fn fingerprint(spec: &AppSpec) -> Vec<u8> {
    serde_json::to_vec(&(
        &spec.command,
        &spec.workdir,
        &spec.env,
        &spec.limits,
        spec.driver,
        spec.network,
    ))
    .unwrap_or_default()
}

impl Slot {
    /// Sends the start message: the app starts in the prepared sandbox.
    pub(crate) fn go(
        mut self,
        env: std::collections::BTreeMap<String, String>,
    ) -> Result<Started, String> {
        let sent = self
            .control
            .write_all(&sandbox::go_message(env))
            .and_then(|()| self.control.shutdown(std::net::Shutdown::Write));
        if let Err(e) = sent {
            kill_slot(&self);
            return Err(format!(
                "the prepared sandbox did not take its start message: {e}"
            ));
        }
        let mut held = self.held;
        held.control = Some(self.control);
        Ok(Started {
            child: self.child,
            addr: self.addr,
            held,
        })
    }
}

fn kill_slot(slot: &Slot) {
    if let Some(pid) = slot.child.id() {
        process::signal_group(pid, Signal::SIGKILL);
    }
}

// === impl Agent (pools) ===

impl Agent {
    /// A prepared slot of `spec`'s app, if one is waiting. Slots whose sandbox died or that were
    /// prepared from another spec are thrown away on the way.
    pub(crate) fn take_slot(&self, spec: &AppSpec) -> Option<Slot> {
        let fp = fingerprint(spec);
        let mut stale = Vec::new();
        let found = {
            let mut pools = lock(&self.inner.pools.slots);
            let queue = pools.get_mut(&spec.name)?;
            let mut found = None;
            while let Some(mut s) = queue.pop_front() {
                if s.fingerprint == fp && matches!(s.child.try_wait(), Ok(None)) {
                    found = Some(s);
                    break;
                }
                stale.push(s);
            }
            found
        };
        for s in stale {
            self.discard_slot(s);
        }
        found
    }

    /// Hands out a spare of `spec`'s app for `label` to `owner`, if one is waiting.
    pub(crate) fn take_spare(
        &self,
        spec: &AppSpec,
        label: &str,
        owner: &Owner,
    ) -> Option<warden_core::InstanceRecord> {
        let t = Instant::now();
        let record = {
            let mut running = lock(&self.inner.running);
            let r = running
                .values_mut()
                .filter(|r| {
                    r.record.app == spec.name
                        && r.record.label == label
                        && r.record.state == InstanceState::Spare
                        && !r.stopping.load(Ordering::Relaxed)
                })
                .min_by_key(|r| r.record.started_at_ms)?;
            r.record.state = InstanceState::Ready;
            r.record.owner = match owner {
                Owner::User(u) => Some(u.clone()),
                _ => None,
            };
            r.activity
                .last_used_ms
                .store(warden_core::model::now_ms(), Ordering::Relaxed);
            r.record.clone()
        };
        // The record is published behind the request: the gateway asking has the record
        // already, and a store commit is the slowest part of a hand-out.
        let (agent, published) = (self.clone(), record.clone());
        tokio::spawn(async move { agent.publish_taken(published).await });
        self.inner
            .metrics
            .started(crate::metrics::Path::Warm, t.elapsed());
        tracing::info!(app = %spec.name, label, instance = %record.id, "spare instance handed out");
        self.refill_soon(spec);
        Some(record)
    }

    /// Writes the record of a handed-out spare; if the instance exited meanwhile, makes sure
    /// the record does not outlive it.
    async fn publish_taken(&self, record: warden_core::InstanceRecord) {
        let key = warden_core::keys::instance(&record.app, &record.id);
        let store = &*self.inner.store;
        if let Err(e) = warden_store::put_json(store, &key, &record, Some(self.lease())).await {
            tracing::warn!(instance = %record.id, error = %e, "publishing a handed-out spare failed");
        }
        if !lock(&self.inner.running).contains_key(&record.id) {
            let _ = store.delete(&key).await;
        }
    }

    /// Refills the pools of `spec`'s app once the request that just took from them is likely
    /// served: a start forks and builds a sandbox, which on a small machine would compete with
    /// that very request for the CPU. The app's spec is read again then: it may have changed or
    /// been deleted meanwhile, and a delete may still be stopping its spares.
    pub(crate) fn refill_soon(&self, spec: &AppSpec) {
        let (agent, app) = (self.clone(), spec.name.clone());
        tokio::spawn(async move {
            tokio::time::sleep(REFILL_DELAY).await;
            let seen = agent.deletions_seen();
            if let Ok(current) = agent.load_spec(&app).await {
                agent.refill(&current, seen);
            }
        });
    }

    /// The count of app deletions seen, to pass to [`Agent::refill`] with a spec read after it.
    pub(crate) fn deletions_seen(&self) -> u64 {
        self.inner.pools.deletions.load(Ordering::SeqCst)
    }

    /// Notes that an app was deleted and throws its slots away.
    pub(crate) fn app_deleted(&self, app: &str) {
        // Counted first: a refill that reads the count after the slots are gone must see it.
        self.inner.pools.deletions.fetch_add(1, Ordering::SeqCst);
        self.drain_slots(Some(app));
    }

    /// Starts what `spec`'s pools lack on this node, unless an app was deleted since `seen`
    /// (from [`Agent::deletions_seen`] before `spec` was read): `spec` may be the deleted
    /// app's, and the next tick refills from a fresh listing anyway.
    pub(crate) fn refill(&self, spec: &AppSpec, seen: u64) {
        if *self.inner.stopping.borrow() || self.deletions_seen() != seen {
            return;
        }
        match spec.start {
            StartPath::Jit => {}
            StartPath::Slot => {
                let key = (spec.name.clone(), String::new());
                let have = lock(&self.inner.pools.slots)
                    .get(&spec.name)
                    .map_or(0, VecDeque::len);
                for _ in have..spec.slots as usize {
                    if !self.pool_may_try(&key) {
                        break;
                    }
                    if let Err(e) = self.prepare_slot(spec) {
                        tracing::warn!(app = %spec.name, error = %e, "preparing a sandbox slot failed");
                        self.pool_failed(&key);
                        break;
                    }
                }
            }
            StartPath::Warm => {
                for (label, &want) in &spec.warm {
                    // A few spares start at a time: a thousand at once would starve the
                    // node's lease renewal and the requests being served.
                    let (starting, of_app) = {
                        let pending = lock(&self.inner.pools.pending);
                        let all: u32 = pending.values().sum();
                        let app: u32 = pending
                            .iter()
                            .filter(|((a, _), _)| *a == spec.name)
                            .map(|(_, n)| n)
                            .sum();
                        (all, app)
                    };
                    if starting >= MAX_SPARE_STARTS || of_app >= MAX_SPARE_STARTS_PER_APP {
                        break;
                    }
                    let key = (spec.name.clone(), label.clone());
                    let pending = lock(&self.inner.pools.pending)
                        .get(&key)
                        .copied()
                        .unwrap_or(0);
                    let have = self.spares(&spec.name, label) + pending as usize;
                    let room = (MAX_SPARE_STARTS - starting).min(MAX_SPARE_STARTS_PER_APP - of_app)
                        as usize;
                    for _ in (have..want as usize).take(room) {
                        if !self.pool_may_try(&key) || !self.inner.keeper.may_start(&key) {
                            break;
                        }
                        self.start_spare(spec, key.clone());
                    }
                }
            }
        }
    }

    /// Stops slots and spares that no app asks for any more (deleted app, other start path,
    /// smaller pool, changed spec).
    pub(crate) fn trim_pools(&self, specs: &[AppSpec]) {
        let by_name: HashMap<&str, &AppSpec> = specs.iter().map(|s| (s.name.as_str(), s)).collect();
        let mut extra = Vec::new();
        lock(&self.inner.pools.slots).retain(|app, queue| {
            match by_name.get(app.as_str()) {
                Some(s) if s.start == StartPath::Slot => {
                    let fp = fingerprint(s);
                    let (keep, stale): (VecDeque<Slot>, VecDeque<Slot>) =
                        queue.drain(..).partition(|x| x.fingerprint == fp);
                    *queue = keep;
                    extra.extend(stale);
                    while queue.len() > s.slots as usize {
                        extra.extend(queue.pop_back());
                    }
                }
                _ => extra.extend(queue.drain(..)),
            }
            !queue.is_empty()
        });
        for s in extra {
            self.discard_slot(s);
        }
        let mut spares: HashMap<PoolKey, Vec<(u64, String)>> = HashMap::new();
        for r in lock(&self.inner.running).values() {
            if r.record.state == InstanceState::Spare && !r.stopping.load(Ordering::Relaxed) {
                spares
                    .entry((r.record.app.clone(), r.record.label.clone()))
                    .or_default()
                    .push((r.record.started_at_ms, r.record.id.clone()));
            }
        }
        for ((app, label), mut ids) in spares {
            let want = by_name
                .get(app.as_str())
                .filter(|s| s.start == StartPath::Warm)
                .and_then(|s| s.warm.get(&label).copied())
                .unwrap_or(0) as usize;
            // The newest go first; the oldest are the warmest.
            ids.sort();
            for (_, id) in ids.into_iter().skip(want) {
                tracing::info!(%app, %label, instance = %id, "stopping a spare the pool no longer wants");
                let agent = self.clone();
                tokio::spawn(async move {
                    let _ = agent.kill(&id).await;
                });
            }
        }
    }

    /// Throws away every slot of `app` (or of every app).
    pub(crate) fn drain_slots(&self, app: Option<&str>) {
        let drained: Vec<Slot> = {
            let mut pools = lock(&self.inner.pools.slots);
            match app {
                Some(a) => pools.remove(a).map(Vec::from).unwrap_or_default(),
                None => pools.drain().flat_map(|(_, q)| q).collect(),
            }
        };
        for s in drained {
            self.discard_slot(s);
        }
    }

    /// Ready slots and spares per (app, label, kind), for the metrics.
    pub(crate) fn pool_levels(&self) -> Vec<(String, String, &'static str, i64)> {
        let mut out = Vec::new();
        for (app, queue) in lock(&self.inner.pools.slots).iter() {
            let n = queue
                .iter()
                .filter(|s| s.prepared.load(Ordering::Relaxed))
                .count();
            out.push((app.clone(), String::new(), "slot", n as i64));
        }
        let mut spares: HashMap<PoolKey, i64> = HashMap::new();
        for r in lock(&self.inner.running).values() {
            if r.record.state == InstanceState::Spare {
                *spares
                    .entry((r.record.app.clone(), r.record.label.clone()))
                    .or_default() += 1;
            }
        }
        out.extend(
            spares
                .into_iter()
                .map(|((app, label), n)| (app, label, "spare", n)),
        );
        out
    }

    fn spares(&self, app: &str, label: &str) -> usize {
        lock(&self.inner.running)
            .values()
            .filter(|r| {
                r.record.app == app
                    && r.record.label == label
                    && r.record.state == InstanceState::Spare
                    && !r.stopping.load(Ordering::Relaxed)
            })
            .count()
    }

    fn start_spare(&self, spec: &AppSpec, key: PoolKey) {
        *lock(&self.inner.pools.pending)
            .entry(key.clone())
            .or_default() += 1;
        let (agent, spec) = (self.clone(), spec.clone());
        tokio::spawn(async move {
            let result = agent
                .start_instance(&spec, &key.1, &Owner::Shared, Purpose::Spare)
                .await;
            if let Some(n) = lock(&agent.inner.pools.pending).get_mut(&key) {
                *n = n.saturating_sub(1);
            }
            match result {
                Ok(_) => {
                    lock(&agent.inner.pools.failures).remove(&key);
                    agent.inner.keeper.started(&key.0, &key.1);
                    // Keeps a large fill going at its pace rather than the tick's, by the
                    // app's current spec: a pool made smaller or an app changed meanwhile
                    // must not be refilled from the spec this start began with.
                    let seen = agent.deletions_seen();
                    if let Ok(current) = agent.load_spec(&spec.name).await {
                        agent.refill(&current, seen);
                    }
                }
                // A full node is no crash: the pool waits and tries again.
                Err(AgentError::Full { .. }) => agent.pool_failed(&key),
                // The monitor already counted an instance that exited.
                Err(AgentError::Exited { .. } | AgentError::ShuttingDown) => {}
                Err(e) => {
                    tracing::warn!(app = %key.0, label = %key.1, error = %e, "starting a spare instance failed");
                    agent
                        .inner
                        .keeper
                        .crashed(&key.0, &key.1, &e.to_string(), "");
                }
            }
        });
    }

    /// Starts `sandbox-init` for a new slot of `spec`'s app and queues it; a watcher notes when
    /// it is prepared, or drops it if preparing fails.
    fn prepare_slot(&self, spec: &AppSpec) -> Result<(), String> {
        let id = warden_core::id::short_id();
        let dir = self.inner.config.instance_dir.join(&id);
        let log = self.log_path(&spec.name, &id);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let launch = Launch {
            spec,
            env: self.instance_env(spec, &id),
            log: &log,
            dir: &dir,
            bridge: &self.inner.bridge,
            cgroups: &self.inner.cgroups,
        };
        let p = match sandbox::prepare(&launch) {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let watch = p
            .control
            .try_clone()
            .and_then(|w| {
                w.set_nonblocking(true)?;
                tokio::net::UnixStream::from_std(w)
            })
            .map_err(|e| format!("cannot watch the slot's control socket: {e}"))?;
        let prepared = Arc::new(AtomicBool::new(false));
        let slot = Slot {
            id: id.clone(),
            log: log.clone(),
            fingerprint: fingerprint(spec),
            child: p.child,
            addr: p.addr,
            control: p.control,
            prepared: prepared.clone(),
            held: p.held,
        };
        lock(&self.inner.pools.slots)
            .entry(spec.name.clone())
            .or_default()
            .push_back(slot);
        let agent = self.clone();
        let app = spec.name.clone();
        tokio::spawn(async move {
            agent.watch_slot(app, id, log, watch, prepared).await;
        });
        Ok(())
    }

    async fn watch_slot(
        &self,
        app: String,
        id: String,
        log: PathBuf,
        mut control: tokio::net::UnixStream,
        prepared: Arc<AtomicBool>,
    ) {
        let t = Instant::now();
        let key = (app.clone(), String::new());
        let mut byte = [0u8; 1];
        let ok = matches!(control.read(&mut byte).await, Ok(1) if byte[0] == sandbox::PREPARED);
        drop(control);
        if ok {
            prepared.store(true, Ordering::Relaxed);
            self.inner
                .metrics
                .slot_prepare
                .observe(t.elapsed().as_secs_f64());
            lock(&self.inner.pools.failures).remove(&key);
            tracing::debug!(%app, slot = %id, ms = t.elapsed().as_millis() as u64, "sandbox slot prepared");
            return;
        }
        let tail = process::log_tail(&log, crate::LOG_TAIL_LINES);
        tracing::warn!(%app, slot = %id, output = %tail, "a sandbox slot failed while preparing");
        self.pool_failed(&key);
        let gone = {
            let mut pools = lock(&self.inner.pools.slots);
            pools.get_mut(&app).and_then(|q| {
                let i = q.iter().position(|s| s.id == id)?;
                q.remove(i)
            })
        };
        // A slot already taken is not here: the instance's own start reports the failure.
        if let Some(s) = gone {
            self.discard_slot(s);
        }
    }

    fn discard_slot(&self, slot: Slot) {
        kill_slot(&slot);
        let dir = self.inner.config.instance_dir.join(&slot.id);
        let _ = std::fs::remove_file(&slot.log);
        let Slot {
            mut child, held, ..
        } = slot;
        // The cgroups can only go once the sandbox's processes are gone.
        tokio::spawn(async move {
            let _ = child.wait().await;
            held.release().await;
            let _ = std::fs::remove_dir_all(dir);
        });
    }

    fn pool_may_try(&self, key: &PoolKey) -> bool {
        lock(&self.inner.pools.failures)
            .get(key)
            .is_none_or(|(_, at)| Instant::now() >= *at)
    }

    fn pool_failed(&self, key: &PoolKey) {
        let mut failures = lock(&self.inner.pools.failures);
        let e = failures.entry(key.clone()).or_insert((0, Instant::now()));
        e.0 += 1;
        e.1 = Instant::now() + keep::backoff(e.0);
    }
}
