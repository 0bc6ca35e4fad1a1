//! Server connections kept idle per role between clients, each app's bound on server
//! connections and on clients waiting for one, and the cancel keys the proxy has handed out.
//!
//! The bound is per app (its database on its server), whatever the role and the instance:
//! every server connection, busy or idle, holds one of the app's permits until it closes. A
//! client past it waits (bounded in number and time) for one of the app's connections to
//! come back or close; past those bounds it is refused. So a flood of clients costs only
//! its app: the server keeps connections for every other one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};

use super::upstream::{ServerConn, UpstreamError};
use super::{Limits, ServerAddr, Target};

/// How often a waiting client looks again even if no release woke it (a connection closed
/// by the sweep, or two releases while it was looking, wake no one).
const RECHECK: Duration = Duration::from_millis(100);

/// Server connections per role, shared by every listener of a node: instances of the same
/// label (and user) share one role, so they share its idle connections. Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    limits: Limits,
    /// Idle connections per target, oldest first.
    idle: Mutex<HashMap<Target, Vec<ServerConn>>>,
    /// The key the proxy gave a client → where its server connection is.
    cancels: Mutex<HashMap<(i32, i32), CancelEntry>>,
    /// Each app's bound, by server and database.
    apps: Mutex<HashMap<(ServerAddr, String), Arc<AppSlots>>>,
}

/// One app's server connections and the clients waiting for one.
struct AppSlots {
    /// One permit per server connection the app may have open, busy or idle.
    conns: Arc<Semaphore>,
    /// Clients waiting now.
    waiting: AtomicUsize,
    /// Told when one of the app's connections comes back or closes.
    freed: Notify,
}

/// Why a client got no server connection.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AcquireError {
    /// The app has every server connection it may have, and as many clients waiting as may
    /// wait (or this one waited its time out).
    #[error(
        "too many connections for this app's database: all {conns} of its server connections \
         are in use{}",
        if *.waited { " and none came free in time" } else { " and enough clients wait already" }
    )]
    Full {
        /// The app's bound.
        conns: usize,
        /// Whether this client waited before it was refused.
        waited: bool,
    },
    /// The server could not be reached or refused the login.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

struct CancelEntry {
    /// Only a cancel through the listener the key was given on counts: a key is no way to
    /// reach another instance's session, even if it leaked.
    listener: u64,
    server: ServerAddr,
    key: (i32, i32),
    forwarding: Arc<Forwarding>,
}

/// The cancels forwarded for one client's session that PostgreSQL has not finished with. Its
/// server connection goes back to the pool only once there are none: a cancel still on its
/// way would stop the next client's query (pgbouncer#717).
#[derive(Default)]
pub(crate) struct Forwarding {
    pending: AtomicUsize,
    done: Notify,
}

/// One forwarded cancel, counted until dropped.
pub(crate) struct Forwarded(Arc<Forwarding>);

impl Drop for Forwarded {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.done.notify_waiters();
        }
    }
}

impl Forwarding {
    /// Whether every cancel forwarded for the session was handled within `timeout`. Called
    /// after the session's key is forgotten, so no new one can start.
    pub(crate) async fn settled(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Made before the count is read, so a drop in between still wakes it.
            let done = self.done.notified();
            if self.pending.load(Ordering::Acquire) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, done).await.is_err() {
                return self.pending.load(Ordering::Acquire) == 0;
            }
        }
    }
}

// === impl Pool ===

impl Pool {
    /// A pool with these bounds. Inside a tokio runtime, it also closes connections idle past
    /// `idle_timeout` on its own, until the last clone is dropped.
    pub fn new(limits: Limits) -> Pool {
        let inner = Arc::new(Inner {
            limits,
            idle: Mutex::default(),
            cancels: Mutex::default(),
            apps: Mutex::default(),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(sweep(Arc::downgrade(&inner)));
        }
        Pool { inner }
    }

    /// The bounds this pool and its listeners keep.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// How many idle server connections the pool holds for `target`.
    pub fn idle(&self, target: &Target) -> usize {
        self.inner.idle().get(target).map_or(0, Vec::len)
    }

    /// How many apps the pool keeps a bound for: those with a server connection, busy or
    /// idle, or a client waiting for one (an app with none is forgotten at the next sweep).
    pub fn apps(&self) -> usize {
        self.inner.apps().len()
    }

    /// Forgets the app whose database is `database` on `server` (it was dropped): its idle
    /// connections are closed, and its bound goes once no connection or client holds it.
    pub fn forget(&self, server: &ServerAddr, database: &str) {
        let closed: Vec<ServerConn> = {
            let mut idle = self.inner.idle();
            let gone: Vec<Target> = idle
                .keys()
                .filter(|t| t.server == *server && t.database == database)
                .cloned()
                .collect();
            gone.iter()
                .filter_map(|t| idle.remove(t))
                .flatten()
                .collect()
        };
        // Closed outside the lock: each gives its slot back when dropped.
        drop(closed);
        self.inner.prune_apps();
    }

    /// How many clients of `target`'s app wait for a server connection now.
    pub fn waiting(&self, target: &Target) -> usize {
        self.inner.app(target).waiting.load(Ordering::SeqCst)
    }

    /// An idle connection that is still alive, else a new one within the app's bound: if
    /// the app is at it, an idle connection of another of its roles is closed to make room,
    /// else the client waits for one (see [`Limits::max_waiting_per_app`]).
    pub(crate) async fn acquire(&self, target: &Target) -> Result<ServerConn, AcquireError> {
        if let Some(conn) = self.idle_conn(target) {
            return Ok(conn);
        }
        let app = self.inner.app(target);
        let limits = &self.inner.limits;
        let slot = match self.inner.try_slot(&app, target) {
            Some(slot) => slot,
            None => {
                if app.waiting.fetch_add(1, Ordering::SeqCst) >= limits.max_waiting_per_app {
                    app.waiting.fetch_sub(1, Ordering::SeqCst);
                    return Err(AcquireError::Full {
                        conns: limits.max_server_per_app,
                        waited: false,
                    });
                }
                let waited = self.wait(&app, target).await;
                app.waiting.fetch_sub(1, Ordering::SeqCst);
                match waited {
                    Some(Ok(conn)) => return Ok(conn),
                    Some(Err(slot)) => slot,
                    None => {
                        return Err(AcquireError::Full {
                            conns: limits.max_server_per_app,
                            waited: true,
                        })
                    }
                }
            }
        };
        let mut conn = ServerConn::connect(target, limits.server_timeout).await?;
        conn.slot = Some(slot);
        Ok(conn)
    }

    /// Waits, up to the queue timeout, for an idle connection of `target` or a free slot of
    /// its app; `None` at the timeout.
    async fn wait(
        &self,
        app: &AppSlots,
        target: &Target,
    ) -> Option<Result<ServerConn, tokio::sync::OwnedSemaphorePermit>> {
        let deadline = tokio::time::Instant::now() + self.inner.limits.queue_timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            let _ = tokio::time::timeout(left.min(RECHECK), app.freed.notified()).await;
            if let Some(conn) = self.idle_conn(target) {
                return Some(Ok(conn));
            }
            if let Some(slot) = self.inner.try_slot(app, target) {
                return Some(Err(slot));
            }
        }
    }

    /// An idle connection of `target` that is still alive; dead or stale ones are closed.
    fn idle_conn(&self, target: &Target) -> Option<ServerConn> {
        let timeout = self.inner.limits.idle_timeout;
        loop {
            let conn = self.inner.idle().get_mut(target).and_then(Vec::pop);
            match conn {
                Some(c) if c.idle_since.elapsed() < timeout && c.is_quiet() => return Some(c),
                // Dead or stale: drop it (freeing its slot) and try the next.
                Some(_) => continue,
                None => return None,
            }
        }
    }

    /// Takes a connection back after its client left: reset and kept if `clean` (the client
    /// left between transactions) and the reset answered idle; closed otherwise.
    pub(crate) async fn release(&self, target: &Target, mut conn: ServerConn, clean: bool) {
        if !clean || !conn.reset(self.inner.limits.server_timeout).await {
            tracing::debug!("server connection closed, not reused");
        } else {
            conn.idle_since = Instant::now();
            let mut idle = self.inner.idle();
            let list = idle.entry(target.clone()).or_default();
            if list.len() < self.inner.limits.max_idle {
                list.push(conn);
            }
        }
        // Kept or closed, a client of the app waiting may now have it or its slot.
        self.inner.app(target).freed.notify_one();
    }

    /// Hands out a fresh key for a client of `listener` whose server connection is at
    /// `server` with `key`.
    pub(crate) fn register_cancel(
        &self,
        listener: u64,
        server: &ServerAddr,
        key: (i32, i32),
    ) -> (i32, i32) {
        let mut cancels = self.inner.cancels();
        loop {
            // A positive pid, as PostgreSQL's are; the secret is what makes it unguessable.
            let mine = (rand::random::<i32>() & i32::MAX, rand::random::<i32>());
            if let std::collections::hash_map::Entry::Vacant(e) = cancels.entry(mine) {
                e.insert(CancelEntry {
                    listener,
                    server: server.clone(),
                    key,
                    forwarding: Arc::default(),
                });
                return mine;
            }
        }
    }

    /// Forgets a key when its client leaves: no cancel is forwarded for it from now on. The
    /// answer tells when those forwarded before are done with.
    pub(crate) fn unregister_cancel(&self, mine: (i32, i32)) -> Option<Arc<Forwarding>> {
        self.inner.cancels().remove(&mine).map(|e| e.forwarding)
    }

    /// The server and server key for a cancel that arrived on `listener` with `mine`, if the
    /// proxy gave that key on that listener and its client is still there; the cancel counts
    /// as in flight for that session until the answer's [`Forwarded`] is dropped.
    pub(crate) fn find_cancel(
        &self,
        listener: u64,
        mine: (i32, i32),
    ) -> Option<(ServerAddr, (i32, i32), Forwarded)> {
        let cancels = self.inner.cancels();
        let e = cancels.get(&mine).filter(|e| e.listener == listener)?;
        // Counted under the map's lock, so a session that forgets its key after this sees it.
        e.forwarding.pending.fetch_add(1, Ordering::AcqRel);
        Some((e.server.clone(), e.key, Forwarded(e.forwarding.clone())))
    }
}

impl Inner {
    fn app(&self, target: &Target) -> Arc<AppSlots> {
        let mut apps = self.apps();
        let key = (target.server.clone(), target.database.clone());
        apps.entry(key)
            .or_insert_with(|| {
                Arc::new(AppSlots {
                    conns: Arc::new(Semaphore::new(self.limits.max_server_per_app)),
                    waiting: AtomicUsize::new(0),
                    freed: Notify::new(),
                })
            })
            .clone()
    }

    /// A free slot of the app, closing an idle connection of another of the app's roles for
    /// it if need be (the same role's idle ones were looked at first).
    fn try_slot(
        &self,
        app: &AppSlots,
        target: &Target,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if let Ok(slot) = app.conns.clone().try_acquire_owned() {
            return Some(slot);
        }
        let evicted = {
            let mut idle = self.idle();
            idle.iter_mut()
                .filter(|(t, _)| t.server == target.server && t.database == target.database)
                .find_map(|(_, list)| (!list.is_empty()).then(|| list.remove(0)))
        };
        // Closed outside the lock: its slot comes back when it is dropped.
        drop(evicted?);
        app.conns.clone().try_acquire_owned().ok()
    }

    /// Drops the bound of every app no connection, client or waiter holds, so the map does
    /// not grow with every app that ever had a client. Exact under the lock: an app's
    /// [`AppSlots`] is only had through the map, and each open connection holds a permit.
    fn prune_apps(&self) {
        let max = self.limits.max_server_per_app;
        self.apps().retain(|_, app| {
            Arc::strong_count(app) > 1
                || app.conns.available_permits() < max
                || app.waiting.load(Ordering::SeqCst) > 0
        });
    }

    fn apps(&self) -> MutexGuard<'_, HashMap<(ServerAddr, String), Arc<AppSlots>>> {
        self.apps.lock().unwrap_or_else(|e| e.into_inner())
    }

    // A poisoned lock only means a panic elsewhere mid-update of a map whose entries are
    // each whole; the maps stay usable.
    fn idle(&self) -> MutexGuard<'_, HashMap<Target, Vec<ServerConn>>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn cancels(&self) -> MutexGuard<'_, HashMap<(i32, i32), CancelEntry>> {
        self.cancels.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Closes connections idle past the bound, and forgets apps without any connection or
/// client, every half bound, while the pool lives.
async fn sweep(pool: Weak<Inner>) {
    let Some(period) = pool.upgrade().map(|p| p.limits.idle_timeout / 2) else {
        return;
    };
    let period = period.max(std::time::Duration::from_millis(100));
    loop {
        tokio::time::sleep(period).await;
        let Some(inner) = pool.upgrade() else { return };
        let timeout = inner.limits.idle_timeout;
        let stale: Vec<ServerConn> = {
            let mut idle = inner.idle();
            let mut stale = Vec::new();
            for list in idle.values_mut() {
                let (keep, old) = std::mem::take(list)
                    .into_iter()
                    .partition(|c| c.idle_since.elapsed() < timeout);
                *list = keep;
                stale.extend(old);
            }
            idle.retain(|_, list| !list.is_empty());
            stale
        };
        // Closed (their slots given back) before the apps without any are forgotten.
        drop(stale);
        inner.prune_apps();
    }
}
