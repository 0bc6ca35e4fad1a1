//! The life of instances on this node: start (JIT, from a slot, or a spare handed out), monitor,
//! readiness, records in the store, and stop. This module owns the table of running instances,
//! the instance each (app, label, owner) is served by, and the node's and apps' instance counts.
//!
//! [`start`] holds the start path, [`ready`] the readiness wait, [`handout`] what hands an
//! instance to the request waiting for it, [`monitor`] a started process's end. Pools and restarts are other
//! modules' state; this one takes slots from the pools and reports crashes to the restarts.

mod drain;
mod handout;
mod health;
mod monitor;
pub(crate) mod peer_owner;
pub(crate) mod ready;
mod start;
mod stop;
mod table;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use warden_core::{
    keys, Activity, AppSpec, InstanceError, InstanceRecord, InstanceState, Lifetime, Owner,
    RelabelHook, StartPath,
};
use warden_store::{put_json, Store};

use crate::drivers::Drivers;
use crate::metrics::Metrics;
use crate::paths::Paths;
use crate::pools::Pools;
use crate::restarts::{Admission, Restarts, Ticket};
use crate::sync::lock;
use crate::{logs, AgentError};
use warden_cluster::node::Node;

pub(crate) use drain::Kept;
pub(crate) use start::Purpose;
use table::Table;

/// Time an instance gets to exit after SIGTERM before SIGKILL.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(3);
/// Logs of this many exited instances stay readable; older ones are deleted.
const KEEP_EXITED_LOGS: usize = 64;

type StartResult = Option<Result<InstanceRecord, InstanceError>>;
/// (app, label, user): the user is empty for shared instances.
type ServeKey = (String, String, String);

/// Who serves an (app, label, owner): an instance being started, or a ready one.
enum Serving {
    Starting(watch::Receiver<StartResult>),
    Ready(InstanceRecord),
}

/// A running instance.
struct Running {
    record: InstanceRecord,
    exited: watch::Receiver<bool>,
    activity: Arc<Activity>,
    idle_timeout: Duration,
    /// Set when the agent stops the instance itself, so its exit is not a crash.
    stopping: Arc<AtomicBool>,
    log: PathBuf,
    /// It holds a socket to its app's database, logged in at its label's role: a taint must
    /// stop it rather than raise its label (its connections at the old label could write down).
    data: bool,
    /// The uid its TCP port's listener must have (`Started::owner`), checked per connection.
    listener_uid: Option<u32>,
    /// A connection to the app made while it started, for the request that waited for the
    /// start (`handout.rs::keep_first`); taken by [`Lifecycle::dial`].
    first: Option<std::net::TcpStream>,
}

#[derive(Default)]
struct Counts {
    per_app: HashMap<String, u32>,
    total: u32,
}

/// What the lifecycle needs of the rest of the agent.
pub(crate) struct Deps {
    pub store: Arc<dyn Store>,
    pub node: Arc<Node>,
    pub paths: Paths,
    pub max_instances: u32,
    pub drivers: Arc<Drivers>,
    pub pools: Arc<Pools>,
    pub restarts: Arc<Restarts>,
    pub metrics: Arc<Metrics>,
    pub stopping: watch::Receiver<bool>,
    /// Brings release slugs this node did not build.
    pub slugs: Arc<warden_slugs::Fetcher>,
    /// Apps' databases, if this node has a data server.
    pub data: Option<Arc<dyn warden_core::data::DataPlane>>,
}

/// The instances of this node.
///
/// Its locks are each held alone and never across an `.await`: no path takes one of them while
/// holding another, so they have no order to get wrong. Whatever must agree across the running
/// instances and the serving map is one lock, `table` (see [`table`]).
pub(crate) struct Lifecycle {
    deps: Deps,
    table: Mutex<Table>,
    counts: Mutex<Counts>,
    /// Logs of exited instances, oldest first: (id, app, path).
    exited: Mutex<VecDeque<(String, String, PathBuf)>>,
    /// Told of every relabel (`Instances::on_relabel`): this process's gateway.
    relabelled: Mutex<Vec<RelabelHook>>,
}

fn backoff_error(spec: &AppSpec, left: std::time::Duration, last_exit: String) -> InstanceError {
    AgentError::Backoff {
        app: spec.name.clone(),
        retry_after: left,
        last_exit,
    }
    .into()
}

fn serve_key(app: &str, label: &str, owner: &Owner) -> Option<ServeKey> {
    match owner {
        Owner::Request => None,
        _ => Some((app.to_owned(), label.to_owned(), owner.user().to_owned())),
    }
}

fn record_key(r: &InstanceRecord) -> Option<ServeKey> {
    match r.lifetime {
        Lifetime::PerRequest => None,
        _ => Some((r.app.clone(), r.label.clone(), r.user_key().to_owned())),
    }
}

// === impl Lifecycle ===

impl Lifecycle {
    pub(crate) fn new(deps: Deps) -> Arc<Self> {
        Arc::new(Self {
            deps,
            table: Mutex::default(),
            counts: Mutex::default(),
            exited: Mutex::default(),
            relabelled: Mutex::default(),
        })
    }

    /// Tells `hook` of every relabel from now on (see [`Lifecycle::relabel`]).
    pub(crate) fn on_relabel(&self, hook: RelabelHook) {
        lock(&self.relabelled).push(hook);
    }

    /// Tells the relabel hooks that `id` serves `label` now (`None`: it is being stopped).
    fn tell_relabelled(&self, id: &str, label: Option<&str>) {
        let hooks = lock(&self.relabelled).clone();
        for hook in hooks {
            hook(id, label);
        }
    }

    fn stopping(&self) -> bool {
        *self.deps.stopping.borrow()
    }

    /// A ready instance of `spec`'s app for `label` and `owner`. Shared and per-user instances
    /// are started once and handed out again; concurrent callers share one start. A
    /// per-request instance is always new and never handed out again: stop it with
    /// [`Lifecycle::retire`] after its request.
    pub(crate) async fn ensure(
        self: &Arc<Self>,
        spec: &AppSpec,
        label: &str,
        owner: &Owner,
    ) -> Result<InstanceRecord, InstanceError> {
        if self.stopping() {
            return Err(AgentError::ShuttingDown.into());
        }
        let crash_owner = owner.user();
        let Some(key) = serve_key(&spec.name, label, owner) else {
            // Every request starts its own instance; in a run of crashes, only one per backoff
            // window does, and the rest get its answer.
            let _ticket = self.admitted(&spec.name, label, crash_owner).await?;
            let r = self.start(spec, label, owner, Purpose::Serve).await;
            if let Err(e) = &r {
                self.count_start_failure(&spec.name, label, crash_owner, e);
            }
            let r = r?;
            self.deps.restarts.started(&spec.name, label, crash_owner);
            return Ok(r);
        };
        let mut rx = loop {
            // Admitted before the serving map is looked at: no lock is held while waiting.
            let admission = self.deps.restarts.admit(&spec.name, label, crash_owner);
            let mut done = {
                let mut table = lock(&self.table);
                match (table.serving.get(&key), admission) {
                    (Some(Serving::Ready(r)), _) => return Ok(r.clone()),
                    (Some(Serving::Starting(rx)), _) => break rx.clone(),
                    // The last instance crashed: nothing starts until its backoff is over.
                    (None, Admission::Backoff(left, last_exit)) => {
                        return Err(backoff_error(spec, left, last_exit));
                    }
                    (None, Admission::Wait(done)) => done,
                    (None, Admission::Go(ticket)) => {
                        // A warm app's spare is handed out here, on the caller's task: a start
                        // task would only take it, a wake of another thread later.
                        let t = std::time::Instant::now();
                        let spare = (spec.start == StartPath::Warm)
                            .then(|| handout::take_spare_from(&mut table, spec, label, owner))
                            .flatten();
                        if let Some(r) = spare {
                            table.serve_if_free(&r.id);
                            drop(table);
                            drop(ticket);
                            self.deps.restarts.started(&spec.name, label, crash_owner);
                            self.handed_out(spec, &r, t);
                            return Ok(r);
                        }
                        let (tx, rx) = watch::channel(None);
                        table
                            .serving
                            .insert(key.clone(), Serving::Starting(rx.clone()));
                        // The start runs on its own task so that a caller giving up does not
                        // leave a half-started instance behind.
                        let (me, owner, spec) = (self.clone(), owner.clone(), spec.clone());
                        tokio::spawn(async move {
                            // The waiting requests have the instance as soon as it is ready,
                            // before the start's bookkeeping behind them (`start::OnReady`).
                            // The ticket is let go when the requests are told, so whether it
                            // is still here says whether they were (not `tx`: with no request
                            // left waiting, its send keeps no value).
                            let ticket = Mutex::new(Some(ticket));
                            let tell = |r: &InstanceRecord| {
                                me.settle_and_tell(&key, &tx, Ok(r.clone()));
                                lock(&ticket).take();
                            };
                            let result = me
                                .start_telling(
                                    &spec,
                                    &key.1,
                                    &owner,
                                    Purpose::Serve,
                                    Some(Box::new(tell)),
                                )
                                .await;
                            // Not told: the start failed, or handed out a spare. A failure is
                            // counted before the ticket goes, so the next start waits it out.
                            let untold = lock(&ticket).take();
                            if let Some(ticket) = untold {
                                if let Err(e) = &result {
                                    me.count_start_failure(&key.0, &key.1, &key.2, e);
                                }
                                me.settle_and_tell(&key, &tx, result.map_err(InstanceError::from));
                                drop(ticket);
                            }
                        });
                        break rx;
                    }
                }
            };
            let _ = done.changed().await;
        };
        let shutting_down = || InstanceError::from(AgentError::ShuttingDown);
        let done = rx
            .wait_for(|r| r.is_some())
            .await
            .map_err(|_| shutting_down())?;
        done.clone().unwrap_or_else(|| Err(shutting_down()))
    }

    /// Leave to start an instance of (app, label, owner) now ([`Restarts::admit`]): waits for
    /// the start of this window under way, if any, and then asks again.
    async fn admitted(&self, app: &str, label: &str, owner: &str) -> Result<Ticket, InstanceError> {
        loop {
            match self.deps.restarts.admit(app, label, owner) {
                Admission::Go(ticket) => return Ok(ticket),
                Admission::Backoff(left, last_exit) => {
                    return Err(AgentError::Backoff {
                        app: app.to_owned(),
                        retry_after: left,
                        last_exit,
                    }
                    .into());
                }
                Admission::Wait(mut done) => {
                    let _ = done.changed().await;
                }
            }
        }
    }

    /// Counts a failed start as a crash of (app, label, owner) when the app is at fault, so the
    /// next start waits out a backoff and the app's status says why. The one place that judges
    /// start failures (requests, kept instances and rollouts all come here):
    /// - a program that cannot be run (missing, not executable) or an instance not ready in
    ///   time: the app's fault, counted;
    /// - an instance that ran and exited: its monitor counted it already;
    /// - the node's own troubles (a full disk, no free port or uid), a full app or node, a
    ///   shutdown: not the app's, or one app's trouble would hold every other back.
    pub(crate) fn count_start_failure(&self, app: &str, label: &str, owner: &str, e: &AgentError) {
        let the_apps = match e {
            AgentError::Launch { source, .. } => source.is_the_apps(),
            AgentError::Timeout { .. } => true,
            _ => false,
        };
        if the_apps {
            self.deps
                .restarts
                .crashed(app, label, owner, "", &e.to_string(), "");
        }
    }

    /// Makes a kept instance the one its label is served by, unless one already is: the label
    /// its record has now, not the one `r` says.
    pub(crate) fn serve_if_free(&self, r: &InstanceRecord) {
        lock(&self.table).serve_if_free(&r.id);
    }

    /// The activity handle of a local instance, for the gateway to mark requests in flight.
    pub(crate) fn activity(&self, id: &str) -> Option<Arc<Activity>> {
        lock(&self.table)
            .running
            .get(id)
            .map(|r| r.activity.clone())
    }

    /// Raises an instance's label (after taint): it stops serving its old label, serves the new
    /// one if that label has no instance yet, and its record says so.
    ///
    /// The instance stops being handed out for its old label before this returns, so the very
    /// next request of that label gets another, and this process's gateway is told at once
    /// ([`Lifecycle::on_relabel`]); the record is written in the background.
    pub(crate) fn relabel(&self, id: &str, label: &str) -> Result<(), AgentError> {
        let record = {
            let mut table = lock(&self.table);
            let r = table
                .running
                .get_mut(id)
                .ok_or_else(|| AgentError::UnknownInstance(id.to_owned()))?;
            // Two gateways may reach the same join: the second relabel changes nothing, and
            // must not take the instance out of this process's gateway's routing.
            if r.record.label == label {
                return Ok(());
            }
            if r.data {
                let old = record_key(&r.record);
                if let Some(old) = old {
                    table.unserve(&old, id);
                }
                drop(table);
                self.tell_relabelled(id, None);
                return Err(AgentError::DataTaint(id.to_owned()));
            }
            let old = record_key(&r.record);
            r.record.label = label.to_owned();
            // A tainted instance no longer counts toward its old label's desired count.
            r.record.kept = false;
            let record = r.record.clone();
            if let Some(old) = old {
                table.unserve(&old, id);
            }
            table.serve_if_free(id);
            record
        };
        // This process's gateway stops routing the old label to it now, whoever saw the taint;
        // other nodes' gateways learn it from the record below, and their pooled connections
        // through this node's port are cut (`cluster/src/server.rs`).
        self.tell_relabelled(id, Some(label));
        let (store, lease) = (self.deps.store.clone(), self.deps.node.lease());
        let id = id.to_owned();
        tokio::spawn(async move {
            // Other nodes' gateways learn the new label from this record: keep trying while
            // the store is unwell (this node's port already refuses the old label).
            let key = keys::instance(&record.app, &id);
            let mut pause = std::time::Duration::from_millis(50);
            for attempt in 0..12 {
                match put_json(&*store, &key, &record, Some(lease)).await {
                    Ok(_) => return,
                    Err(e) if attempt == 11 => {
                        tracing::error!(instance = %id, error = %e, "writing a tainted instance's new label failed; other nodes' gateways may route its old label to it until it stops")
                    }
                    Err(_) => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(std::time::Duration::from_secs(5));
                    }
                }
            }
        });
        Ok(())
    }

    /// The record of a running instance.
    pub(crate) fn record(&self, id: &str) -> Option<InstanceRecord> {
        lock(&self.table).running.get(id).map(|r| r.record.clone())
    }

    /// A running instance's record, the uid its port's listener must have (if checked), and,
    /// once, the connection kept from its start for the request that waited for it.
    pub(crate) fn dial(
        &self,
        id: &str,
    ) -> Option<(InstanceRecord, Option<u32>, Option<std::net::TcpStream>)> {
        let mut table = lock(&self.table);
        let r = table.running.get_mut(id)?;
        Some((r.record.clone(), r.listener_uid, r.first.take()))
    }

    /// Instances running on this node, ordered by app, label and id.
    pub(crate) fn instances(&self) -> Vec<InstanceRecord> {
        let mut v: Vec<_> = lock(&self.table)
            .running
            .values()
            .map(|r| r.record.clone())
            .collect();
        v.sort_by(|a, b| (&a.app, &a.label, &a.id).cmp(&(&b.app, &b.label, &b.id)));
        v
    }

    /// How many instances this node runs (spares and starting ones included).
    pub(crate) fn count(&self) -> u32 {
        lock(&self.counts).total
    }

    /// The last `lines` lines an instance of this node printed, running or recently exited.
    pub(crate) fn logs(&self, id: &str, lines: usize) -> Result<String, AgentError> {
        let running = lock(&self.table).running.get(id).map(|r| r.log.clone());
        let path = running
            .or_else(|| {
                lock(&self.exited)
                    .iter()
                    .find(|(x, _, _)| x == id)
                    .map(|(_, _, p)| p.clone())
            })
            .ok_or_else(|| AgentError::UnknownInstance(id.to_owned()))?;
        Ok(logs::tail(&path, lines))
    }

    /// When an instance of this node last wrote its log, running or recently exited.
    pub(crate) fn log_written(&self, id: &str) -> Option<std::time::SystemTime> {
        let running = lock(&self.table).running.get(id).map(|r| r.log.clone());
        let path = running.or_else(|| {
            lock(&self.exited)
                .iter()
                .find(|(x, _, _)| x == id)
                .map(|(_, _, p)| p.clone())
        })?;
        std::fs::metadata(path).and_then(|m| m.modified()).ok()
    }

    /// Spares of (app, label) that are not being stopped.
    pub(crate) fn spares(&self, app: &str, label: &str) -> usize {
        lock(&self.table)
            .running
            .values()
            .filter(|r| {
                r.record.app == app
                    && r.record.label == label
                    && r.record.state == InstanceState::Spare
                    && !r.stopping.load(Ordering::Relaxed)
            })
            .count()
    }

    /// Spares that are not being stopped, per (app, label): (started at, id), any order.
    pub(crate) fn spares_by_label(&self) -> HashMap<(String, String), Vec<(u64, String)>> {
        let mut spares: HashMap<(String, String), Vec<(u64, String)>> = HashMap::new();
        for r in lock(&self.table).running.values() {
            if r.record.state == InstanceState::Spare && !r.stopping.load(Ordering::Relaxed) {
                spares
                    .entry((r.record.app.clone(), r.record.label.clone()))
                    .or_default()
                    .push((r.record.started_at_ms, r.record.id.clone()));
            }
        }
        spares
    }

    /// Spares per (app, label), stopping ones included, for the metrics.
    pub(crate) fn spare_levels(&self) -> HashMap<(String, String), i64> {
        let mut spares: HashMap<(String, String), i64> = HashMap::new();
        for r in lock(&self.table).running.values() {
            if r.record.state == InstanceState::Spare {
                *spares
                    .entry((r.record.app.clone(), r.record.label.clone()))
                    .or_default() += 1;
            }
        }
        spares
    }

    /// Ready instances that have served nothing for their app's idle timeout, as of `now`:
    /// (id, app, idle timeout in ms). Kept instances are exempt: the desired count wants them.
    pub(crate) fn idle(&self, now: u64) -> Vec<(String, String, u64)> {
        lock(&self.table)
            .running
            .values()
            .filter(|r| {
                !r.record.kept
                    && r.record.state == InstanceState::Ready
                    && !r.idle_timeout.is_zero()
                    && !r.stopping.load(Ordering::Relaxed)
                    && r.activity
                        .idle_for(now)
                        .is_some_and(|d| d >= r.idle_timeout)
            })
            .map(|r| {
                (
                    r.record.id.clone(),
                    r.record.app.clone(),
                    r.idle_timeout.as_millis() as u64,
                )
            })
            .collect()
    }

    /// Instances of apps not in `known` that started before `listed_at`: (id, app).
    pub(crate) fn orphans(&self, known: &HashSet<&str>, listed_at: u64) -> Vec<(String, String)> {
        lock(&self.table)
            .running
            .values()
            .filter(|r| {
                !known.contains(r.record.app.as_str())
                    && r.record.started_at_ms < listed_at
                    && !r.stopping.load(Ordering::Relaxed)
            })
            .map(|r| (r.record.id.clone(), r.record.app.clone()))
            .collect()
    }

    /// Ids of the instances of `app`.
    pub(crate) fn ids_of(&self, app: &str) -> Vec<String> {
        lock(&self.table)
            .running
            .values()
            .filter(|r| r.record.app == app)
            .map(|r| r.record.id.clone())
            .collect()
    }

    /// Every running instance's log: (id, path).
    pub(crate) fn log_files(&self) -> Vec<(String, PathBuf)> {
        lock(&self.table)
            .running
            .values()
            .map(|r| (r.record.id.clone(), r.log.clone()))
            .collect()
    }

    /// Writes every running instance's record again, under the node's new lease.
    pub(crate) async fn republish(&self) -> Result<(), AgentError> {
        // Each record as the agent holds it when written, never a snapshot from before: a
        // relabel or a drain meanwhile must not be undone by an older copy.
        for r in self.instances() {
            self.write_current(&r.id).await?;
        }
        Ok(())
    }

    /// Stops every instance; returns how many there were.
    pub(crate) async fn stop_all(&self) -> usize {
        let ids: Vec<String> = lock(&self.table).running.keys().cloned().collect();
        let kills = ids.iter().map(|id| self.kill(id));
        futures_util::future::join_all(kills).await;
        ids.len()
    }
}

#[cfg(test)]
mod publish_tests;
#[cfg(test)]
mod tests;
