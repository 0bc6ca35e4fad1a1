//! The start path: a spare handed out, or a new instance from a slot or a driver; then its
//! monitor, its records and the wait until it is ready.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};
use tracing::Instrument;
use warden_core::{
    data::{DataError, DataSocket},
    keys,
    model::now_ms,
    Activity, AppSpec, DriverKind, InstanceRecord, InstanceState, Owner, StartPath,
};
use warden_store::put_json;

use super::monitor::Monitor;
use super::ready::{wait_ready, wait_running, Listening, Ready};
use super::{record_key, Lifecycle, Running, KEEP_EXITED_LOGS};
use crate::drivers::launch::Started;
use crate::drivers::{Launch, LaunchError};
use crate::metrics;
use crate::sync::lock;
use crate::{logs, AgentError};

/// Why an instance is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// A request needs it, and waits for it.
    Serve,
    /// A rollout replaces an instance of an earlier spec with it: no request waits, and the
    /// old instance drains once this one is ready, so its ready record is in the store first
    /// (the gateways route to it before the old one leaves them).
    Replace,
    /// The app's desired count wants it.
    Kept,
    /// The warm pool wants it.
    Spare,
}

/// Told the moment a start a request waits for is ready, with the instance's record: the
/// instance is in the table as ready, and the connection that came with its readiness is kept
/// for the request. [`Lifecycle::ensure`] hands the instance to the waiting request from it,
/// and that request runs next on the same thread, before the start's bookkeeping behind it.
pub(crate) type OnReady<'a> = Box<dyn FnOnce(&InstanceRecord) + Send + 'a>;

/// A launched instance, before it is ready.
struct Launched {
    id: String,
    /// When the start began (before its database socket, if any, and its launch).
    began: Instant,
    path: metrics::Path,
    started: Started,
    /// The instance's socket to its app's database, held as long as the instance runs.
    data: Option<DataSocket>,
}

/// An instance of a data app before its launch: its id, the socket made in its directory,
/// and the environment that names the socket.
struct DataPrepared {
    id: String,
    socket: DataSocket,
    env: BTreeMap<String, String>,
}

/// Ends the wait on a started sandbox's control socket. Init's word (with its probe's
/// connection) may have come after a poll of the agent's own saw the app ready: nobody will
/// read it, and the socket lives as long as the instance, so what is in it is dropped.
fn done_waiting(listening: Option<Listening>) {
    if let Some(l) = listening {
        l.drain();
    }
}

// === impl Lifecycle (start) ===

impl Lifecycle {
    /// Starts an instance of `spec` for `label` and `owner` (or hands out a spare, for a request
    /// of a warm app) and returns once it is ready.
    pub(crate) async fn start(
        self: &Arc<Self>,
        spec: &AppSpec,
        label: &str,
        owner: &Owner,
        purpose: Purpose,
    ) -> Result<InstanceRecord, AgentError> {
        self.start_telling(spec, label, owner, purpose, None).await
    }

    /// [`Lifecycle::start`], and for a start a request waits for (`Purpose::Serve`), `ready`
    /// is called with the instance the moment it is ready and routable (see [`OnReady`]); this
    /// then returns only once the start's bookkeeping behind the request is done (its record
    /// written: see [`Lifecycle::publish_behind`]). Not called when the start fails or a spare
    /// is handed out instead.
    pub(crate) async fn start_telling(
        self: &Arc<Self>,
        spec: &AppSpec,
        label: &str,
        owner: &Owner,
        purpose: Purpose,
        ready: Option<OnReady<'_>>,
    ) -> Result<InstanceRecord, AgentError> {
        if purpose == Purpose::Serve && spec.start == StartPath::Warm {
            if let Some(r) = self.take_spare(spec, label, owner) {
                return Ok(r);
            }
        }
        if let Some(release) = &spec.release {
            self.deps
                .slugs
                .ensure(&self.deps.paths.slugs, release)
                .await
                .map_err(|e| AgentError::Launch {
                    app: spec.name.clone(),
                    source: e.into(),
                })?;
        }
        self.reserve(spec)?;
        let began = Instant::now();
        let prepared = self.prepare_data(spec, label, owner).await;
        let launched = match prepared.and_then(|d| self.launch(spec, label, purpose, d, began)) {
            Ok(l) => l,
            Err((id, source)) => {
                self.release(&spec.name);
                crate::drivers::leftovers::remove_instance_dir(&self.deps.paths.instance(&id));
                // Nothing ran, so its log says nothing: one empty file per failed start would
                // pile up (the error itself is in the app's status).
                let log = self.deps.paths.log(&spec.name, &id);
                if std::fs::metadata(&log).is_ok_and(|m| m.len() == 0) {
                    let _ = std::fs::remove_file(&log);
                }
                return Err(AgentError::Launch {
                    app: spec.name.clone(),
                    source,
                });
            }
        };
        let span =
            tracing::info_span!("instance", app = %spec.name, label, instance = %launched.id);
        self.run(spec, label, owner, purpose, launched, ready)
            .instrument(span)
            .await
    }

    /// Starts the instance's process: from a prepared slot when the app has one waiting, else
    /// through its driver. On failure, the id whose directory to remove and why.
    fn launch(
        &self,
        spec: &AppSpec,
        label: &str,
        purpose: Purpose,
        data: Option<DataPrepared>,
        began: Instant,
    ) -> Result<Launched, (String, LaunchError)> {
        let slot = match (spec.start, purpose, &data) {
            (StartPath::Slot, Purpose::Serve | Purpose::Replace | Purpose::Kept, None) => {
                self.deps.pools.take_slot(spec)
            }
            _ => None,
        };
        if let Some(slot) = slot {
            let id = slot.id.clone();
            let env = BTreeMap::from([("WARDEN_LABEL".to_owned(), label.to_owned())]);
            let went = slot.go(env);
            // Asked once the app has its message: the ask wakes the supervisor's task,
            // perhaps on the runtime's other thread, which the start need not wait for.
            self.deps.pools.refill_soon(&spec.name);
            return match went {
                Ok(started) => Ok(Launched {
                    id,
                    began,
                    path: metrics::Path::Slot,
                    started,
                    data: None,
                }),
                Err(e) => Err((id, e)),
            };
        }
        let (id, data_env, socket) = match data {
            Some(d) => (d.id, d.env, Some(d.socket)),
            None => (warden_core::id::short_id(), BTreeMap::new(), None),
        };
        let dir = self.deps.paths.instance(&id);
        let log = self.deps.paths.log(&spec.name, &id);
        let run = match warden_slugs::run_spec(&self.deps.paths.slugs, spec) {
            Ok(run) => run,
            Err(e) => return Err((id, e.into())),
        };
        let mut env = match self.deps.drivers.base_env(&run, &id) {
            Ok(env) => env,
            Err(e) => return Err((id, e)),
        };
        env.insert("WARDEN_LABEL".into(), label.to_owned());
        env.extend(data_env);
        let started = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| LaunchError::Create {
                path: dir.clone(),
                source,
            })
            .and_then(|()| {
                let launch = Launch {
                    spec: &run,
                    env,
                    log: &log,
                    dir: &dir,
                    build: false,
                };
                let driver = spec.driver_on(self.deps.drivers.default().0);
                self.deps.drivers.get(driver).start(&launch)
            });
        match started {
            Ok(started) => Ok(Launched {
                id,
                began,
                path: metrics::Path::Jit,
                started,
                data: socket,
            }),
            Err(e) => Err((id, e)),
        }
    }

    /// For an app with `data`: the instance's id, its directory, and a socket in it that logs
    /// in as the role of `label` (and the owner's user). The socket's directory is where the
    /// instance sees it: `/data/.pg` in a sandbox (its private directory is mounted there),
    /// the directory itself for a process. `None` for other apps.
    async fn prepare_data(
        &self,
        spec: &AppSpec,
        label: &str,
        owner: &Owner,
    ) -> Result<Option<DataPrepared>, (String, LaunchError)> {
        if !spec.data {
            return Ok(None);
        }
        let id = warden_core::id::short_id();
        let Some(plane) = &self.deps.data else {
            return Err((id, DataError(crate::drivers::data::NO_SERVER.into()).into()));
        };
        let sandboxed = spec.driver_on(self.deps.drivers.default().0) == DriverKind::Sandbox;
        let dir = self.deps.paths.instance(&id);
        // A process type (`worker`) reaches its app's database, as its label's role.
        let app = spec.owning_app();
        let place = match crate::drivers::data::place(&dir, app, sandboxed) {
            Ok(p) => p,
            Err(e) => return Err((id, e)),
        };
        let user = owner.reserved_for();
        let socket = match plane
            .attach(app, label, user.as_deref(), &place.socket)
            .await
        {
            Ok(s) => s,
            Err(e) => return Err((id, e.into())),
        };
        let env = place.env;
        Ok(Some(DataPrepared { id, socket, env }))
    }

    /// Records a launched instance, hands its process to a monitor and waits until it is
    /// ready.
    async fn run(
        self: &Arc<Self>,
        spec: &AppSpec,
        label: &str,
        owner: &Owner,
        purpose: Purpose,
        launched: Launched,
        ready_hook: Option<OnReady<'_>>,
    ) -> Result<InstanceRecord, AgentError> {
        let Launched {
            id,
            began,
            path,
            started,
            data,
        } = launched;
        let app = spec.name.as_str();
        let log = self.deps.paths.log(app, &id);
        let Started {
            child,
            addr,
            held,
            listening,
            owner: listener_uid,
        } = started;
        let pid = child.id().unwrap_or(0);
        let mut record = InstanceRecord {
            id: id.clone(),
            app: app.to_owned(),
            label: label.to_owned(),
            node: self.deps.node.id().to_owned(),
            addr: addr.clone(),
            pid,
            state: InstanceState::Starting,
            started_at_ms: now_ms(),
            lifetime: spec.lifetime,
            user: owner.reserved_for(),
            kept: purpose == Purpose::Kept,
            generation: spec.generation(label),
            release: spec.release.as_ref().map(|r| r.number),
        };
        let (exit_tx, exit_rx) = watch::channel(false);
        let (status_tx, status_rx) = oneshot::channel::<String>();
        let stopping = Arc::new(AtomicBool::new(false));
        lock(&self.table).running.insert(
            id.clone(),
            Running {
                record: record.clone(),
                exited: exit_rx.clone(),
                activity: Arc::new(Activity::new()),
                idle_timeout: Duration::from_millis(spec.idle_timeout_ms),
                stopping: stopping.clone(),
                log: log.clone(),
                data: spec.data,
                listener_uid,
                first: None,
            },
        );
        let driver = spec.driver_on(self.deps.drivers.default().0);
        tracing::info!(pid, %addr, ?driver, "instance starting");
        let monitor = Monitor {
            record: record.clone(),
            child,
            held,
            stopping,
            status: status_tx,
            exited: exit_tx,
            _data: data,
        };
        tokio::spawn(monitor.run(self.clone()).in_current_span());
        let key = keys::instance(app, &id);
        // A start a request waits for is recorded behind it, as its end is: its commit (the
        // CPU of redb and of the fsync) would run beside the app's own start on the request's
        // path, 0.35-0.45 ms of a slot start here (docs/BENCHMARKS.md). A start still under way
        // after `PUBLISH_BEHIND` is then recorded as starting. Any other start is recorded
        // before anything counts on it.
        let behind = purpose == Purpose::Serve;
        if behind {
            let (me, id) = (self.clone(), id.clone());
            tokio::spawn(async move { me.publish_behind(id).await }.in_current_span());
        } else {
            self.publish_or_stop(&key, &record).await?;
        }
        let (ready, first, waited) = self
            .wait_started(spec, &addr, listener_uid, listening, exit_rx)
            .await;
        match ready {
            Ready::Yes => {}
            Ready::Exited => {
                let status = status_rx.await.unwrap_or_else(|_| "unknown status".into());
                return Err(AgentError::Exited {
                    app: app.to_owned(),
                    status,
                    log_tail: logs::tail(&log, logs::TAIL_LINES),
                });
            }
            Ready::TimedOut(waiting_for) => {
                let _ = self.kill(&id).await;
                return Err(AgentError::Timeout {
                    app: app.to_owned(),
                    waited_ms: spec.start_timeout_ms,
                    waiting_for,
                    log_tail: logs::tail(&log, logs::TAIL_LINES),
                });
            }
            Ready::Foreign(why) => {
                let _ = self.kill(&id).await;
                tracing::warn!(app, "{why}");
                return Err(AgentError::NotOwnListener {
                    app: app.to_owned(),
                    why,
                });
            }
        }
        let took = began.elapsed();
        self.deps.metrics.started(path, took);
        let spare = purpose == Purpose::Spare;
        record.state = if spare {
            InstanceState::Spare
        } else {
            InstanceState::Ready
        };
        self.finish(&key, &record, &log, behind).await?;
        let kept = behind && first.is_some_and(|first| self.keep_first(&id, first));
        let said = move || {
            tracing::info!(ms = took.as_millis() as u64, path = ?path, spare, "instance ready");
        };
        if !behind {
            done_waiting(waited);
            said();
            return Ok(record);
        }
        // The log line (its formatting and write: 0.03-0.05 ms here) and the end of the wait
        // on init's control socket come behind the request too.
        let bookkeeping = self.clone().behind(id, kept, move || {
            said();
            done_waiting(waited);
        });
        match ready_hook {
            // The request told is now this thread's next task (tokio's LIFO slot), and runs as
            // soon as this task waits in `behind`'s first sleep. A spawn here instead would
            // push that request to where the runtime's other worker takes it: a wake of that
            // worker, 0.1-0.2 ms on this machine, before the request could go on
            // (docs/BENCHMARKS.md, "The waiting request told first").
            Some(tell) => {
                tell(&record);
                bookkeeping.await;
            }
            None => {
                tokio::spawn(bookkeeping.in_current_span());
            }
        }
        Ok(record)
    }

    /// Waits until a started instance is ready (see `ready.rs`), counting how it was seen.
    async fn wait_started(
        &self,
        spec: &AppSpec,
        addr: &warden_core::InstanceAddr,
        owner: Option<u32>,
        listening: Option<std::os::unix::net::UnixStream>,
        exited: watch::Receiver<bool>,
    ) -> (Ready, Option<std::net::TcpStream>, Option<Listening>) {
        let timeout = Duration::from_millis(spec.start_timeout_ms);
        if !spec.listens() {
            return (wait_running(exited, timeout).await, None, None);
        }
        let mut listening = listening.and_then(Listening::new);
        let health = spec.health_path.as_deref();
        let ready = wait_ready(addr, owner, health, exited, timeout, listening.as_mut()).await;
        let mut first = None;
        if matches!(ready, Ready::Yes) {
            let told = listening.as_ref().is_some_and(Listening::told);
            self.deps.metrics.seen_ready(told);
            first = listening.as_mut().and_then(Listening::take_first);
        }
        (ready, first, listening)
    }

    /// Makes a ready instance (or spare) the running record, unless it exited meanwhile, and
    /// publishes it: a spare before it can be handed out, any other before this returns but
    /// an instance a request waits for (`behind`), which `run` publishes after that request
    /// has it (see [`Lifecycle::publish_behind`]).
    async fn finish(
        self: &Arc<Self>,
        key: &str,
        record: &InstanceRecord,
        log: &std::path::Path,
        behind: bool,
    ) -> Result<(), AgentError> {
        let spare = record.state == InstanceState::Spare;
        if spare {
            // Published before it can be handed out, so a hand-out's own write comes last.
            self.publish_or_stop(key, record).await?;
        }
        let still_running = match lock(&self.table).running.get_mut(&record.id) {
            // Being drained or stopped meanwhile: it must not come back into routing.
            Some(r)
                if r.stopping.load(Ordering::Relaxed)
                    || r.record.state == InstanceState::Draining =>
            {
                false
            }
            Some(r) => {
                r.record = record.clone();
                true
            }
            None => false,
        };
        if !still_running {
            // Exited between accepting and now; the monitor already cleaned up.
            if spare {
                let _ = self.deps.store.delete(key).await;
            }
            return Err(AgentError::Exited {
                app: record.app.clone(),
                status: "exited right after starting".into(),
                log_tail: logs::tail(log, logs::TAIL_LINES),
            });
        }
        // One handed to a waiting request (`behind`) is published by the caller, after that
        // request has it.
        if !spare && !behind {
            self.publish_or_stop(key, record).await?;
        }
        Ok(())
    }

    /// Counts a new instance against the app's and the node's maximum, or says which is full.
    fn reserve(&self, spec: &AppSpec) -> Result<(), AgentError> {
        let mut c = lock(&self.counts);
        let node_max = self.deps.max_instances;
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
        let mut c = lock(&self.counts);
        if let Some(n) = c.per_app.get_mut(app) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_app.remove(app);
            }
        }
        c.total = c.total.saturating_sub(1);
    }

    /// Writes the record of an instance no request waits for (a spare, a kept instance); if the
    /// store refuses (a lost lease under a start storm, a full disk), stops the instance, which
    /// would otherwise run unrecorded and count against the node's maximum until it exited by
    /// itself. A start a request waits for serves that request instead, and its record is
    /// written behind it until the store takes it (`publish_behind`).
    async fn publish_or_stop(&self, key: &str, record: &InstanceRecord) -> Result<(), AgentError> {
        let lease = self.deps.node.lease();
        match put_json(&*self.deps.store, key, record, Some(lease)).await {
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot record a starting instance; stopping it");
                let _ = self.kill(&record.id).await;
                Err(e.into())
            }
        }
    }

    /// Drops every trace of an exited instance but its log, which stays readable for a while;
    /// returns the state it was in.
    pub(super) async fn forget(
        &self,
        record: &InstanceRecord,
        status: &str,
    ) -> Option<InstanceState> {
        let id = &record.id;
        let gone = {
            let mut table = lock(&self.table);
            let gone = table.running.remove(id);
            if let Some(key) = gone.as_ref().and_then(|r| record_key(&r.record)) {
                table.unserve(&key, id);
            }
            gone
        };
        if let Some(r) = &gone {
            self.release(&r.record.app);
            tracing::info!(%status, "instance exited");
            let mut exited = lock(&self.exited);
            exited.push_back((id.clone(), r.record.app.clone(), r.log.clone()));
            while exited.len() > KEEP_EXITED_LOGS {
                if let Some((_, _, old)) = exited.pop_front() {
                    let _ = std::fs::remove_file(old);
                }
            }
        }
        crate::drivers::leftovers::remove_instance_dir(&self.deps.paths.instance(id));
        if let Err(e) = self
            .deps
            .store
            .delete(&keys::instance(&record.app, id))
            .await
        {
            tracing::warn!(error = %e, "could not remove the instance record; its lease will");
        }
        gone.map(|r| r.record.state)
    }
}
