//! The slot pool and the warm pool's bookkeeping: the work of a start done before a request
//! needs it (seed 002 §4.6: the tap pool and AOT).
//!
//! A slot is a sandbox prepared up to the point where only the app is missing: namespaces,
//! mounts, loopback, the connection socket, all waiting in `sandbox-init` for its start message.
//! Taking one sends the message (the label's part of the environment), so a request waits only
//! for the app itself. Slots are per app and prepared from the app's spec of the time; one
//! prepared from another spec is thrown away instead of used. This module owns the slots.
//!
//! A spare is a whole instance already running for one label, held back from routing (state
//! `spare`) until a request takes it (see `crate::lifecycle`). This module counts the spare
//! starts under way and the pools' failures; `crate::supervise` starts spares and refills.
//!
//! Each node keeps its own pools at the sizes the app asks for, refills them right after a take
//! (a take asks with [`Pools::refill_soon`]) and on every supervision tick, trims what is no
//! longer asked for, and backs off when refills fail (a broken app must not be started in a
//! tight loop).

mod slot;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use warden_core::{AppSpec, StartPath};

pub(crate) use slot::Slot;

use crate::drivers::{Drivers, Launch, LaunchError};
use crate::metrics::Metrics;
use crate::paths::Paths;
use crate::sync::lock;
use crate::{logs, restarts};

/// (app, label); the label is empty for slots, which serve any label.
pub(crate) type PoolKey = (String, String);

/// The pools of this node.
pub(crate) struct Pools {
    slots: Mutex<HashMap<String, VecDeque<Slot>>>,
    /// Spare starts in progress.
    pending: Mutex<HashMap<PoolKey, u32>>,
    /// Refill failures in a row, and when the next refill may be tried.
    failures: Mutex<HashMap<PoolKey, (u32, Instant)>>,
    /// App deletions seen so far. A refill planned from a spec read before a delete must not
    /// bring the deleted app's pool back: it compares this count with the one it started from.
    deletions: AtomicU64,
    /// Apps whose pools were just taken from, for the supervisor to refill.
    refills: mpsc::UnboundedSender<String>,
    drivers: Arc<Drivers>,
    paths: Paths,
    metrics: Arc<Metrics>,
}

/// What of a spec a prepared slot depends on.
fn fingerprint(spec: &AppSpec) -> String {
    spec.generation("")
}

// === impl Pools ===

impl Pools {
    /// Pools that ask for refills on `refills`.
    pub(crate) fn new(
        drivers: Arc<Drivers>,
        paths: Paths,
        metrics: Arc<Metrics>,
        refills: mpsc::UnboundedSender<String>,
    ) -> Self {
        Self {
            slots: Mutex::default(),
            pending: Mutex::default(),
            failures: Mutex::default(),
            deletions: AtomicU64::new(0),
            refills,
            drivers,
            paths,
            metrics,
        }
    }

    /// A prepared slot of `spec`'s app, if one is waiting. Slots whose sandbox died or that were
    /// prepared from another spec are thrown away on the way. The caller asks for the refill
    /// ([`Pools::refill_soon`]) once the slot has its start message.
    pub(crate) fn take_slot(&self, spec: &AppSpec) -> Option<Slot> {
        let fp = fingerprint(spec);
        let mut stale = Vec::new();
        let found = {
            let mut pools = lock(&self.slots);
            let queue = pools.get_mut(&spec.name)?;
            let mut found = None;
            while let Some(mut s) = queue.pop_front() {
                if s.fingerprint == fp && s.alive() {
                    found = Some(s);
                    break;
                }
                stale.push(s);
            }
            found
        };
        for s in stale {
            self.discard(s);
        }
        found
    }

    /// Asks the supervisor to refill `app`'s pools once the request that just took from them
    /// is likely served.
    pub(crate) fn refill_soon(&self, app: &str) {
        let _ = self.refills.send(app.to_owned());
    }

    /// The count of app deletions seen, to compare with after reading a spec.
    pub(crate) fn deletions_seen(&self) -> u64 {
        self.deletions.load(Ordering::SeqCst)
    }

    /// Notes that an app was deleted and throws its slots away.
    pub(crate) fn app_deleted(&self, app: &str) {
        // Counted first: a refill that reads the count after the slots are gone must see it.
        self.deletions.fetch_add(1, Ordering::SeqCst);
        self.drain_slots(Some(app));
    }

    /// Prepares what `spec`'s slot pool lacks on this node.
    pub(crate) fn refill_slots(self: &Arc<Self>, spec: &AppSpec) {
        if spec.start != StartPath::Slot {
            return;
        }
        let key = (spec.name.clone(), String::new());
        let have = lock(&self.slots).get(&spec.name).map_or(0, VecDeque::len);
        for _ in have..spec.slots as usize {
            if !self.may_try(&key) {
                break;
            }
            if let Err(e) = self.prepare_slot(spec) {
                tracing::warn!(app = %spec.name, error = %e, "preparing a sandbox slot failed");
                self.failed(&key);
                break;
            }
        }
    }

    /// Throws away slots no app asks for any more (deleted app, other start path, smaller pool,
    /// changed spec).
    pub(crate) fn trim_slots(&self, by_name: &HashMap<&str, &AppSpec>) {
        let mut extra = Vec::new();
        lock(&self.slots).retain(|app, queue| {
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
            self.discard(s);
        }
    }

    /// Throws away every slot of `app` (or of every app).
    pub(crate) fn drain_slots(&self, app: Option<&str>) {
        let drained: Vec<Slot> = {
            let mut pools = lock(&self.slots);
            match app {
                Some(a) => pools.remove(a).map(Vec::from).unwrap_or_default(),
                None => pools.drain().flat_map(|(_, q)| q).collect(),
            }
        };
        for s in drained {
            self.discard(s);
        }
    }

    /// Prepared slots per app, for the metrics.
    pub(crate) fn slot_levels(&self) -> Vec<(String, i64)> {
        lock(&self.slots)
            .iter()
            .map(|(app, queue)| {
                let n = queue
                    .iter()
                    .filter(|s| s.prepared.load(Ordering::Relaxed))
                    .count();
                (app.clone(), n as i64)
            })
            .collect()
    }

    /// Spare starts under way: over all apps, and of `app`.
    pub(crate) fn spare_starts(&self, app: &str) -> (u32, u32) {
        let pending = lock(&self.pending);
        let all: u32 = pending.values().sum();
        let of_app: u32 = pending
            .iter()
            .filter(|((a, _), _)| a == app)
            .map(|(_, n)| n)
            .sum();
        (all, of_app)
    }

    /// Spare starts under way for (app, label).
    pub(crate) fn spare_starts_of(&self, key: &PoolKey) -> u32 {
        lock(&self.pending).get(key).copied().unwrap_or(0)
    }

    /// Counts a spare start of `key` as begun (`+1`) or ended (`-1`).
    pub(crate) fn count_spare_start(&self, key: &PoolKey, delta: i32) {
        let mut pending = lock(&self.pending);
        let n = pending.entry(key.clone()).or_default();
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            pending.remove(key);
        }
    }

    /// Whether `key`'s pool may try to refill now (it is not backing off).
    pub(crate) fn may_try(&self, key: &PoolKey) -> bool {
        lock(&self.failures)
            .get(key)
            .is_none_or(|(_, at)| Instant::now() >= *at)
    }

    /// A refill of `key` failed: back off.
    pub(crate) fn failed(&self, key: &PoolKey) {
        let mut failures = lock(&self.failures);
        let e = failures.entry(key.clone()).or_insert((0, Instant::now()));
        e.0 += 1;
        e.1 = Instant::now() + restarts::backoff(e.0);
    }

    /// A refill of `key` worked: no more backing off.
    pub(crate) fn succeeded(&self, key: &PoolKey) {
        lock(&self.failures).remove(key);
    }

    /// Starts `sandbox-init` for a new slot of `spec`'s app and queues it; a watcher notes when
    /// it is prepared, or drops it if preparing fails.
    fn prepare_slot(self: &Arc<Self>, spec: &AppSpec) -> Result<(), LaunchError> {
        let id = warden_core::id::short_id();
        let log = self.paths.log(&spec.name, &id);
        let dir = self
            .paths
            .create_instance(&id)
            .map_err(|source| LaunchError::Create {
                path: self.paths.instance(&id),
                source,
            })?;
        let run = match warden_slugs::run_spec(&self.paths.slugs, spec) {
            Ok(r) => r,
            Err(e) => {
                crate::drivers::leftovers::remove_instance_dir(&dir);
                return Err(e.into());
            }
        };
        let env = match self.drivers.base_env(&run, &id) {
            Ok(env) => env,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let launch = Launch {
            spec: &run,
            env,
            log: &log,
            dir: &dir,
            build: false,
        };
        let p = match self.drivers.sandbox().prepare(&launch) {
            Ok(p) => p,
            Err(e) => {
                crate::drivers::leftovers::remove_instance_dir(&dir);
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
            .map_err(|source| LaunchError::Sandbox {
                what: "watch the slot's control socket",
                source,
            })?;
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
        lock(&self.slots)
            .entry(spec.name.clone())
            .or_default()
            .push_back(slot);
        let pools = self.clone();
        let app = spec.name.clone();
        tokio::spawn(async move {
            pools.watch_slot(app, id, log, watch, prepared).await;
        });
        Ok(())
    }

    async fn watch_slot(
        &self,
        app: String,
        id: String,
        log: std::path::PathBuf,
        mut control: tokio::net::UnixStream,
        prepared: Arc<AtomicBool>,
    ) {
        let t = Instant::now();
        let key = (app.clone(), String::new());
        let mut byte = [0u8; 1];
        let ok =
            matches!(control.read(&mut byte).await, Ok(1) if byte[0] == warden_sandbox::PREPARED);
        drop(control);
        if ok {
            // Release: a take that sees it may read the control socket itself (`Slot::go`).
            prepared.store(true, Ordering::Release);
            self.metrics.slot_prepare.observe(t.elapsed().as_secs_f64());
            self.succeeded(&key);
            tracing::debug!(%app, slot = %id, ms = t.elapsed().as_millis() as u64, "sandbox slot prepared");
            return;
        }
        let tail = logs::tail(&log, logs::TAIL_LINES);
        tracing::warn!(%app, slot = %id, output = %tail, "a sandbox slot failed while preparing");
        self.failed(&key);
        let gone = {
            let mut pools = lock(&self.slots);
            pools.get_mut(&app).and_then(|q| {
                let i = q.iter().position(|s| s.id == id)?;
                q.remove(i)
            })
        };
        // A slot already taken is not here: the instance's own start reports the failure.
        if let Some(s) = gone {
            self.discard(s);
        }
    }

    fn discard(&self, slot: Slot) {
        let dir = self.paths.instance(&slot.id);
        slot.discard(dir);
    }
}
