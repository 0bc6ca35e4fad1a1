//! The embedded backend: a redb file in the data directory.
//!
//! redb gives MVCC (readers never wait for the writer) and crash-safe commits. On top of it this
//! module adds what the [`Store`] contract needs: global revisions, a bounded change log for
//! watchers, and leases. Writes are group-committed one batch at a time, by the caller that finds
//! no commit under way or by the writer thread (`commit`); the `writer` module is one commit.

mod codec;
mod commit;
mod format;
mod listing;
pub mod verify;
mod watch;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, TableDefinition};
use tokio::sync::oneshot;

use crate::{CasOutcome, Entry, Hash, LeaseId, Listing, Revision, Store, StoreError, Watch};
use commit::Committer;
use listing::{list_in, Span, INLINE_LIST};
use writer::{Op, Writer};

const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const LEASES: TableDefinition<u64, u64> = TableDefinition::new("leases");
const LEASE_KEYS: TableDefinition<(u64, &str), ()> = TableDefinition::new("lease_keys");

/// State shared by readers, watchers and the writer thread.
struct Shared {
    /// The open file; `None` only while the writer reopens it after a failed write.
    db: RwLock<Option<Arc<Database>>>,
    path: PathBuf,
    /// Why writes fail, while they do (a full disk, an I/O error); `None` when they work.
    failing: Mutex<Option<StoreError>>,
    /// Every watcher, fed by the writer after each commit.
    watchers: watch::Registry,
    revision: AtomicU64,
    compacted: AtomicU64,
    commits: AtomicU64,
}

impl Shared {
    /// The open database, for one read or one transaction.
    fn db(&self) -> Result<Arc<Database>, StoreError> {
        self.db
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| StoreError::Engine {
                op: "read",
                reason:
                    "the store file is being reopened after a failed write; try again in a moment"
                        .into(),
            })
    }

    fn failure(&self) -> Option<StoreError> {
        self.failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_failure(&self, e: Option<StoreError>) {
        *self.failing.lock().unwrap_or_else(|p| p.into_inner()) = e;
    }
}

/// Opens (or creates) the redb file at `path` with every table, catching a panic of the engine
/// on a damaged file.
fn open_db(path: &Path) -> Result<Database, StoreError> {
    let open_err = |reason: String| StoreError::Open {
        path: path.display().to_string(),
        reason,
    };
    // redb reports damage as errors, but the file is input we did not write this run: a panic
    // deep in a parser must still become a clear message, not a crash.
    let db = verify::quietly(|| Database::create(path))
        .map_err(|_| open_err("the file is damaged (the storage engine could not parse it); restore it from a backup or move it away to start with an empty store".into()))?
        .map_err(|e| verify::open_failure(path, "write", e))?;
    let init = || -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        txn.open_table(KV)?;
        txn.open_table(LOG)?;
        txn.open_table(META)?;
        txn.open_table(LEASES)?;
        txn.open_table(LEASE_KEYS)?;
        txn.commit()?;
        Ok(())
    };
    verify::quietly(init)
        .map_err(|_| {
            open_err("the file is damaged; restore it from a backup or move it away".into())
        })?
        .map_err(|e| open_err(format!("{e}; the file is damaged or not a warden store")))?;
    Ok(db)
}

/// Opens (or creates) the file at `path` for writing and brings it to the current record format:
/// all that opening does to a file, run by [`verify::prove`] on a copy before it runs on the file.
fn open_prepared(path: &Path) -> Result<Database, StoreError> {
    let db = open_db(path)?;
    format::migrate(&db)?;
    writer::read_state(&db)?;
    Ok(db)
}

/// A [`Store`] kept in one redb file.
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    committer: Arc<Committer>,
    writer: Option<std::thread::JoinHandle<()>>,
}

fn read_err(e: impl Into<redb::Error>) -> StoreError {
    StoreError::Engine {
        op: "read",
        reason: e.into().to_string(),
    }
}

// === impl EmbeddedStore ===

impl EmbeddedStore {
    /// Opens (or creates) the store file at `path`. A damaged file, a file another process has
    /// open, or a file of another format gives [`StoreError::Open`] naming the file.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let open_err = |reason: String| StoreError::Open {
            path: path.display().to_string(),
            reason,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| open_err(format!("cannot create its directory: {e}")))?;
        }
        // Nothing writes to a file that was not proved sound first, by the same code that
        // `warden store check` runs.
        if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| match verify::is_access(&e) {
                    true => verify::no_access(path, "write", &e),
                    false => open_err(format!("cannot open it: {e}")),
                })?;
            let report = verify::prove(path)?;
            for (key, why) in &report.damaged {
                tracing::warn!(key = %key, reason = %why, "a damaged store record is skipped and reported; restore it from a backup, or delete and create it again");
            }
        }
        let db = open_prepared(path)?;
        let shared = Arc::new(Shared {
            db: RwLock::new(Some(Arc::new(db))),
            path: path.to_owned(),
            failing: Mutex::new(None),
            watchers: watch::Registry::default(),
            revision: AtomicU64::new(0),
            compacted: AtomicU64::new(0),
            commits: AtomicU64::new(0),
        });
        let writer = Writer::load(shared.clone()).map_err(|e| open_err(e.to_string()))?;
        let committer = Committer::new(writer);
        let thread = committer.clone();
        let writer = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || thread.run())
            .map_err(|e| open_err(format!("cannot start the writer thread: {e}")))?;
        Ok(Self {
            shared,
            committer,
            writer: Some(writer),
        })
    }

    /// How many transactions have been committed since open. Concurrent writes share commits, so
    /// this grows more slowly than the number of writes.
    pub fn commits(&self) -> u64 {
        self.shared.commits.load(Ordering::Relaxed)
    }

    async fn send<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Op,
    ) -> Result<T, StoreError> {
        let (tx, rx) = oneshot::channel();
        if let Some(lead) = self.committer.submit(make(tx))? {
            // Let the other tasks ready on this thread queue their writes into this commit.
            tokio::task::yield_now().await;
            // The commit's fsync blocks this thread. On a multi-threaded runtime the worker's
            // other tasks (a gateway's requests, in the same process) move to another thread
            // meanwhile, so a slow disk holds up no request; a current-thread runtime (tests)
            // has nowhere to move them.
            match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
                Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
                    tokio::task::block_in_place(|| lead.commit())
                }
                _ => lead.commit(),
            }
        }
        match rx.await {
            Ok(r) => r,
            // The writer dropped the answer: its batch failed in the engine (it records why
            // right after), or the writer is gone.
            Err(_) => {
                for _ in 0..50 {
                    if let Some(e) = self.shared.failure() {
                        return Err(e);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(StoreError::Closed)
            }
        }
    }

    /// Why writes fail now, if they do.
    pub fn failing(&self) -> Option<StoreError> {
        self.shared.failure()
    }

    /// A read of many records (a listing), on the blocking pool: its length is the caller's.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let shared = self.shared.clone();
        let r = tokio::task::spawn_blocking(move || f(&*shared.db()?))
            .await
            .map_err(|e| StoreError::Engine {
                op: "read",
                reason: e.to_string(),
            })?;
        self.explained(r)
    }

    /// The records in `span`: a short listing reads on the caller's thread, as a get does; past
    /// `INLINE_LIST` records it is read again on the blocking pool, never holding up the
    /// runtime's other tasks for long.
    async fn list_span(&self, span: Span) -> Result<Listing, StoreError> {
        if let Some(listing) = self.read_now(|db| list_in(db, &span, Some(INLINE_LIST)))? {
            return Ok(listing);
        }
        let whole = self.read(move |db| list_in(db, &span, None)).await?;
        whole.ok_or_else(|| StoreError::Engine {
            op: "list",
            reason: "a listing without a limit came back cut; this is a bug".into(),
        })
    }

    /// A read of one record, on the caller's thread: a lookup in redb's cache (or the page
    /// cache) costs a few microseconds, less than waking a blocking thread to do it and waking
    /// the caller again with the answer.
    fn read_now<T>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        // The blocking pool turned an engine panic (a damaged page) into an error; on the
        // caller's thread it must not end the caller's task instead.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.shared.db().and_then(|db| f(&db))
        }))
        .unwrap_or_else(|_| {
            Err(StoreError::Engine {
                op: "read",
                reason: "the storage engine failed on the store file, which may be damaged; back it up with `warden store backup` while reads work and restore it".into(),
            })
        });
        self.explained(r)
    }

    /// While writes fail the engine may refuse reads too: say the cause, not the echo.
    fn explained<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        r.map_err(|e| match self.shared.failure() {
            Some(cause) if writer::echo(&e) => cause,
            _ => e,
        })
    }
}

impl Drop for EmbeddedStore {
    // Closing the queue ends the writer after its current batch; waiting for it means the file
    // is released (and every answered write is on disk) when the store is gone.
    fn drop(&mut self) {
        self.committer.close();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        // Every watch ends with the store, as the etcd backend's do when its client goes.
        self.shared.watchers.close();
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        self.read_now(|db| {
            let txn = db.begin_read().map_err(read_err)?;
            let kv = txn.open_table(KV).map_err(read_err)?;
            match kv.get(key).map_err(read_err)? {
                Some(v) => Ok(Some(codec::decode_entry(key, v.value())?)),
                None => Ok(None),
            }
        })
    }

    async fn get_hash(&self, key: &str) -> Result<Option<(Hash, Revision)>, StoreError> {
        self.read_now(|db| {
            let txn = db.begin_read().map_err(read_err)?;
            let kv = txn.open_table(KV).map_err(read_err)?;
            match kv.get(key).map_err(read_err)? {
                Some(v) => {
                    let m = codec::decode_meta(key, v.value())?;
                    Ok(Some((m.hash, m.mod_revision)))
                }
                None => Ok(None),
            }
        })
    }

    async fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        self.list_span(Span::Under(prefix.trim_end_matches('/').to_owned()))
            .await
    }

    async fn list_text_prefix(&self, start: &str) -> Result<Listing, StoreError> {
        self.list_span(Span::Starting(start.to_owned())).await
    }

    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError> {
        let key = key.to_owned();
        self.send(|reply| Op::Put {
            key,
            value,
            lease,
            reply,
        })
        .await
    }

    async fn delete(&self, key: &str) -> Result<Option<Revision>, StoreError> {
        let key = key.to_owned();
        self.send(|reply| Op::Delete { key, reply }).await
    }

    async fn compare_and_swap(
        &self,
        key: &str,
        expected: Option<Revision>,
        value: Option<Vec<u8>>,
        lease: Option<LeaseId>,
    ) -> Result<CasOutcome, StoreError> {
        let key = key.to_owned();
        self.send(|reply| Op::Cas {
            key,
            expected,
            value,
            lease,
            reply,
        })
        .await
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<Watch, StoreError> {
        watch::start(self.shared.clone(), prefix, from)
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        self.send(|reply| Op::Grant { ttl, reply }).await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.send(|reply| Op::KeepAlive { lease, reply }).await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.send(|reply| Op::Revoke { lease, reply }).await
    }

    fn ready(&self) -> Result<(), StoreError> {
        self.shared.failure().map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests;
