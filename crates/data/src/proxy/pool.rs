//! Server connections kept idle per role between clients, and the cancel keys the proxy has
//! handed out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use super::upstream::{ServerConn, UpstreamError};
use super::{Limits, ServerAddr, Target};

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
}

struct CancelEntry {
    /// Only a cancel through the listener the key was given on counts: a key is no way to
    /// reach another instance's session, even if it leaked.
    listener: u64,
    server: ServerAddr,
    key: (i32, i32),
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

    /// An idle connection that is still alive, else a new one.
    pub(crate) async fn acquire(&self, target: &Target) -> Result<ServerConn, UpstreamError> {
        let timeout = self.inner.limits.idle_timeout;
        loop {
            let conn = self.inner.idle().get_mut(target).and_then(Vec::pop);
            match conn {
                Some(c) if c.idle_since.elapsed() < timeout && c.is_quiet() => return Ok(c),
                // Dead or stale: drop it and try the next.
                Some(_) => continue,
                None => break,
            }
        }
        ServerConn::connect(target, self.inner.limits.server_timeout).await
    }

    /// Takes a connection back after its client left: reset and kept if `clean` (the client
    /// left between transactions) and the reset answered idle; closed otherwise.
    pub(crate) async fn release(&self, target: &Target, mut conn: ServerConn, clean: bool) {
        if !clean || !conn.reset(self.inner.limits.server_timeout).await {
            tracing::debug!("server connection closed, not reused");
            return;
        }
        conn.idle_since = Instant::now();
        let mut idle = self.inner.idle();
        let list = idle.entry(target.clone()).or_default();
        if list.len() < self.inner.limits.max_idle {
            list.push(conn);
        }
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
                });
                return mine;
            }
        }
    }

    /// Forgets a key when its client leaves.
    pub(crate) fn unregister_cancel(&self, mine: (i32, i32)) {
        self.inner.cancels().remove(&mine);
    }

    /// The server and server key for a cancel that arrived on `listener` with `mine`, if the
    /// proxy gave that key on that listener.
    pub(crate) fn find_cancel(
        &self,
        listener: u64,
        mine: (i32, i32),
    ) -> Option<(ServerAddr, (i32, i32))> {
        let cancels = self.inner.cancels();
        let e = cancels.get(&mine).filter(|e| e.listener == listener)?;
        Some((e.server.clone(), e.key))
    }
}

impl Inner {
    // A poisoned lock only means a panic elsewhere mid-update of a map whose entries are
    // each whole; the maps stay usable.
    fn idle(&self) -> MutexGuard<'_, HashMap<Target, Vec<ServerConn>>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn cancels(&self) -> MutexGuard<'_, HashMap<(i32, i32), CancelEntry>> {
        self.cancels.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Closes connections idle past the bound, every half bound, while the pool lives.
async fn sweep(pool: Weak<Inner>) {
    let Some(period) = pool.upgrade().map(|p| p.limits.idle_timeout / 2) else {
        return;
    };
    let period = period.max(std::time::Duration::from_millis(100));
    loop {
        tokio::time::sleep(period).await;
        let Some(inner) = pool.upgrade() else { return };
        let timeout = inner.limits.idle_timeout;
        let mut idle = inner.idle();
        for list in idle.values_mut() {
            list.retain(|c| c.idle_since.elapsed() < timeout);
        }
        idle.retain(|_, list| !list.is_empty());
    }
}
