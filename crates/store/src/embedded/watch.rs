//! Watchers of the embedded store.
//!
//! Every watcher is an entry in one registry: its prefix and the sending end of its channel.
//! After each commit the committer hands the commit's events to the registry, which sends each
//! event straight into the channel of every watcher whose prefix holds its key. A commit thus
//! wakes only the watchers it concerns, once each, with no task in between.
//!
//! A watcher that starts from an older revision, or whose channel is full when a commit comes,
//! is *lagging*: live events are not sent to it, and a task of its own reads the change log
//! instead, waiting for room in the channel, until it has delivered everything up to the last
//! commit the registry has seen; then it is live again. Nothing is lost or sent twice: each
//! entry keeps the next revision it expects and live sending skips anything below it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use redb::ReadableDatabase;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::{codec, read_err, Shared, LOG, META};
use crate::{Event, Revision, StoreError, Watch};

/// Room in each watcher's channel: past it, the watcher catches up from the log.
const CHANNEL: usize = 256;

type Tx = mpsc::Sender<Result<Event, StoreError>>;

/// Every watcher of one store.
#[derive(Default)]
pub(super) struct Registry {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The revision of the last commit whose events were handed out.
    published: Revision,
    next_id: u64,
    entries: Vec<Entry>,
    /// Set when the store closes: every channel is dropped and no entry is added.
    closed: bool,
}

struct Entry {
    id: u64,
    prefix: String,
    tx: Tx,
    /// Every change below it was delivered.
    next: Revision,
    /// Catching up from the log: live events are left to that task.
    lagging: bool,
    /// Where its catch-up task runs.
    runtime: tokio::runtime::Handle,
}

// === impl Registry ===

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that commits up to `revision` are published, with none to deliver: set at open,
    /// and after a failed commit reloads the writer's state.
    pub(super) fn published(&self, revision: Revision) {
        let mut inner = self.lock();
        inner.published = inner.published.max(revision);
    }

    /// Hands one commit's events (in revision order) to the watchers whose prefix holds them.
    /// Called by the committer after the commit is durable, one commit at a time.
    pub(super) fn publish(&self, shared: &Arc<Shared>, events: &[Event], revision: Revision) {
        let mut inner = self.lock();
        inner.published = inner.published.max(revision);
        let mut gone = Vec::new();
        for entry in inner.entries.iter_mut().filter(|e| !e.lagging) {
            for ev in events {
                if ev.revision < entry.next
                    || !warden_core::keys::under_prefix(&entry.prefix, &ev.key)
                {
                    continue;
                }
                match entry.tx.try_send(Ok(ev.clone())) {
                    Ok(()) => entry.next = ev.revision + 1,
                    Err(TrySendError::Full(_)) => {
                        // A slow reader: it reads this change and the rest from the log.
                        entry.lagging = true;
                        spawn_catch_up(shared, entry);
                        break;
                    }
                    Err(TrySendError::Closed(_)) => {
                        gone.push(entry.id);
                        break;
                    }
                }
            }
        }
        // A lagging watcher whose reader is gone goes too: its catch-up task would have removed
        // it, but a task whose runtime shut down never runs, and the entry would stay for good.
        inner
            .entries
            .retain(|e| !gone.contains(&e.id) && !e.tx.is_closed());
    }

    /// Watchers registered now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Ends every watch (their channels close) and refuses new ones.
    pub(super) fn close(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        inner.entries.clear();
    }
}

fn spawn_catch_up(shared: &Arc<Shared>, entry: &Entry) {
    let task = CatchUp {
        shared: shared.clone(),
        id: entry.id,
        prefix: entry.prefix.clone(),
        tx: entry.tx.clone(),
        from: entry.next,
    };
    entry.runtime.spawn(task.run());
}

pub(super) fn start(
    shared: Arc<Shared>,
    prefix: &str,
    from: Revision,
) -> Result<Watch, StoreError> {
    let prefix = prefix.trim_end_matches('/').to_owned();
    let (tx, rx) = mpsc::channel(CHANNEL);
    let mut inner = shared.watchers.lock();
    if inner.closed {
        return Err(StoreError::Closed);
    }
    // Read under the registry's lock: no commit is published meanwhile.
    let next = if from == 0 {
        shared.revision.load(Ordering::SeqCst) + 1
    } else {
        from
    };
    let compacted = shared.compacted.load(Ordering::SeqCst);
    if next <= compacted {
        return Err(StoreError::Compacted {
            requested: next,
            oldest: compacted + 1,
        });
    }
    let id = inner.next_id;
    inner.next_id += 1;
    let entry = Entry {
        id,
        prefix,
        tx,
        next,
        lagging: next <= inner.published,
        runtime: tokio::runtime::Handle::current(),
    };
    if entry.lagging {
        spawn_catch_up(&shared, &entry);
    }
    inner.entries.push(entry);
    Ok(Watch::from_channel(rx))
}

/// One lagging watcher's reading of the log.
struct CatchUp {
    shared: Arc<Shared>,
    id: u64,
    prefix: String,
    tx: Tx,
    from: Revision,
}

// === impl CatchUp ===

impl CatchUp {
    /// Delivers logged changes until the watcher has everything published, then makes it live
    /// again; or ends the watch on an error or a dropped receiver.
    async fn run(mut self) {
        loop {
            let read = match self.read().await {
                Ok(read) => read,
                Err(e) => {
                    self.forget();
                    let _ = self.tx.send(Err(e)).await;
                    return;
                }
            };
            let (events, revision) = read;
            for ev in events {
                if self.tx.send(Ok(ev)).await.is_err() {
                    self.forget();
                    return;
                }
            }
            let mut inner = self.shared.watchers.lock();
            let published = inner.published;
            let Some(entry) = inner.entries.iter_mut().find(|e| e.id == self.id) else {
                return;
            };
            if published <= revision {
                // Everything published was in the log read; what was committed after it and
                // not yet published is skipped by `next` when it is.
                entry.next = entry.next.max(revision + 1);
                entry.lagging = false;
                return;
            }
            self.from = revision + 1;
        }
    }

    fn forget(&self) {
        self.shared
            .watchers
            .lock()
            .entries
            .retain(|e| e.id != self.id);
    }

    /// The logged changes under the prefix from `from` on, and the revision the read saw.
    async fn read(&self) -> Result<(Vec<Event>, Revision), StoreError> {
        let (s, p, from) = (self.shared.clone(), self.prefix.clone(), self.from);
        let read = tokio::task::spawn_blocking(move || {
            let db = s.db()?;
            let txn = db.begin_read().map_err(read_err)?;
            let meta = txn.open_table(META).map_err(read_err)?;
            let get = |k: &str| -> Result<u64, StoreError> {
                Ok(meta
                    .get(k)
                    .map_err(read_err)?
                    .map(|v| v.value())
                    .unwrap_or(0))
            };
            let (revision, compacted) = (get("revision")?, get("compacted")?);
            if from <= compacted {
                return Err(StoreError::Compacted {
                    requested: from,
                    oldest: compacted + 1,
                });
            }
            let log = txn.open_table(LOG).map_err(read_err)?;
            let mut out = Vec::new();
            for row in log.range(from..).map_err(read_err)? {
                let (rev, bytes) = row.map_err(read_err)?;
                let ev = codec::decode_event(rev.value(), bytes.value())?;
                if warden_core::keys::under_prefix(&p, &ev.key) {
                    out.push(ev);
                }
            }
            Ok((out, revision))
        })
        .await;
        read.unwrap_or_else(|e| {
            Err(StoreError::Engine {
                op: "watch",
                reason: e.to_string(),
            })
        })
    }
}
