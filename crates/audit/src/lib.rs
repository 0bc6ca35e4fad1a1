//! The node's audit log (issue 35): segment files of JSON lines under `<data dir>/audit/`, each
//! record chained by hash to the one before (`chain.rs`), written by one thread in batches
//! (`writer.rs`), its head anchored in the store with a MAC (`anchor.rs`), checked by `verify.rs`,
//! old segments dropped by `retain.rs`. Roles record through [`warden_core::audit::Audit`],
//! which [`Log`] implements; they never see this crate.
//!
//! Recording never blocks: the queue is bounded, and what does not fit is counted and written
//! as a `gap` record. Nothing here logs or stores a secret; records carry none (see the seam).
#![forbid(unsafe_code)]

mod anchor;
mod chain;
mod retain;
mod segments;
mod verify;
mod writer;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use warden_core::audit::{
    Audit, AuditError, AuditFuture, AuditStats, DurableFuture, Event, NodeEvent, Query, Record,
    Verified,
};
use warden_store::Store;

pub use anchor::Anchor;
use writer::{Msg, Writer};

/// How long an overflow of the queue stays an alarm in `health`.
const OVERFLOW_ALARM_MS: u64 = 5 * 60 * 1000;

/// Records a query answers unless it asks fewer.
pub const DEFAULT_LIMIT: usize = 1000;

/// The log's settings (defaults in the binary's `config/`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// A segment past this many bytes is closed and a new one begun.
    pub segment_bytes: u64,
    /// Old segments are dropped while all but the current one hold more than this.
    pub retain_bytes: u64,
    /// Segments last written longer ago than this are dropped.
    pub retain_age: Duration,
    /// Records queued at most; more are counted and recorded as a gap.
    pub queue: usize,
    /// How often the head is anchored in the store while it moves.
    pub anchor_every: Duration,
    /// Fail closed (`--audit required`): while the log cannot record, [`Audit::refusing`] says
    /// why and the roles refuse access; else they serve on with the alarm.
    pub required: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            segment_bytes: 64 * 1024 * 1024,
            retain_bytes: 1024 * 1024 * 1024,
            retain_age: Duration::from_secs(365 * 24 * 3600),
            queue: 65_536,
            anchor_every: Duration::from_secs(2),
            required: false,
        }
    }
}

/// Why the log could not open.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// A file or directory of the log.
    #[error("{path}: {source}; check the audit directory's permissions and free space")]
    Io {
        /// Which.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The first write failed.
    #[error("the audit log cannot write its first records: {0}")]
    Start(String),
}

impl LogError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        LogError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// What the writer thread and the handles share.
#[derive(Default)]
pub(crate) struct Shared {
    /// Records that could not be written and are not yet counted into a written gap record:
    /// while it is not 0, the log does not hold everything recorded (what `refusing` loads).
    dropped: AtomicU64,
    /// Records that could not be written since start.
    lost_total: AtomicU64,
    /// Why the last of them were lost.
    lost_why: Mutex<Option<String>>,
    /// The last write's error, if it failed.
    error: Mutex<Option<String>>,
    /// When the queue last overflowed (ms since the epoch; 0: never).
    overflowed_ms: AtomicU64,
    /// The last record written: seq and hash.
    head: Mutex<(u64, String)>,
    /// The sequence number last anchored in the store by this run (0: none yet). Retention
    /// never drops a segment holding it or anything after it, so the store's anchor always
    /// names a record the log keeps, and verify may call an anchor before the oldest record
    /// kept a replaced log.
    anchored: AtomicU64,
    /// Tests hold this to stop the writer with the first record of its next batch taken.
    #[cfg(test)]
    hold: Mutex<()>,
    /// The writer waits on `hold`.
    #[cfg(test)]
    held: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn lost(&self, n: u64, why: &str) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
        self.lost_total.fetch_add(n, Ordering::Relaxed);
        if let Ok(mut w) = self.lost_why.lock() {
            *w = Some(why.to_owned());
        }
    }

    fn why_lost(&self) -> String {
        self.lost_why
            .lock()
            .ok()
            .and_then(|w| w.clone())
            .unwrap_or_else(|| "records were lost".into())
    }

    fn set_error(&self, e: Option<String>) {
        if let Ok(mut slot) = self.error.lock() {
            *slot = e;
        }
    }

    fn error(&self) -> Option<String> {
        self.error.lock().ok().and_then(|e| e.clone())
    }
}

/// A node's audit log: open with [`Log::open`], record through [`Audit`], close with
/// [`Log::close`].
pub struct Log {
    dir: PathBuf,
    node: String,
    key: [u8; 32],
    store: Arc<dyn Store>,
    shared: Arc<Shared>,
    tx: SyncSender<Msg>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    anchor_every: Duration,
    required: bool,
    /// The key of change bodies' digests: derived from the audit key, apart from the anchors'.
    body_key: [u8; 32],
}

// === impl Log ===

impl Log {
    /// Opens `node`'s log under `dir` (made 0700 if missing), checks its tail, records what
    /// the start found and `started`, and starts the writer. Anchors go to `store`, MAC'd
    /// under `key`.
    pub fn open(
        dir: &Path,
        node: &str,
        key: [u8; 32],
        store: Arc<dyn Store>,
        settings: Settings,
    ) -> Result<Arc<Log>, LogError> {
        let shared = Arc::new(Shared::default());
        let (tx, rx) = sync_channel(settings.queue.max(1));
        let (anchor_every, required) = (settings.anchor_every, settings.required);
        let w = Writer::open(dir, node, settings, shared.clone())?;
        let thread = std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || w.run(rx))
            .map_err(|e| LogError::io(dir, e))?;
        Ok(Arc::new(Log {
            dir: dir.to_owned(),
            node: node.to_owned(),
            key,
            store,
            shared,
            tx,
            writer: Mutex::new(Some(thread)),
            anchor_every,
            required,
            body_key: anchor::body_key(&key),
        }))
    }

    /// Anchors the head in the store while it moves, until `stop` turns true (the caller owns
    /// the task).
    pub fn anchor_task(
        &self,
        stop: watch::Receiver<bool>,
    ) -> impl std::future::Future<Output = ()> {
        anchor::run(
            self.store.clone(),
            self.shared.clone(),
            self.key,
            self.node.clone(),
            self.anchor_every,
            stop,
        )
    }

    /// Records `stopped` (fsync'd), stops the writer and anchors the final head.
    pub async fn close(&self) {
        let (done_tx, done_rx) = oneshot::channel();
        let stopped = Event::Node {
            event: NodeEvent::Stopped,
            node: None,
        };
        let tx = self.tx.clone();
        let thread = self.writer.lock().ok().and_then(|mut t| t.take());
        // Sent blocking, off the runtime: the writer drains the queue, and a full one must
        // neither lose the stop record nor keep the writer from ever hearing `Stop` (which a
        // `try_send` did, and `close` then waited for the thread forever).
        let _ = tokio::task::spawn_blocking(move || {
            let _ = tx.send(Msg::Record(stopped, Some(done_tx)));
            let _ = tx.send(Msg::Stop);
            if let Some(t) = thread {
                let _ = t.join();
            }
        })
        .await;
        match done_rx.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "the audit log did not record its stop"),
            Err(_) => {
                tracing::warn!("the audit log did not record its stop: its writer had stopped")
            }
        }
        anchor::publish(&*self.store, &self.shared, &self.key, &self.node, 0).await;
    }

    fn send(&self, m: Msg) -> Result<(), AuditError> {
        match self.tx.try_send(m) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.shared
                    .overflowed_ms
                    .store(warden_core::model::now_ms(), Ordering::Relaxed);
                self.shared
                    .lost(1, "the audit queue was full: records were dropped rather than slow the request path");
                Err(AuditError::Unavailable("the audit queue is full".into()))
            }
            Err(TrySendError::Disconnected(_)) => {
                self.shared.lost(1, "the audit writer had stopped");
                Err(AuditError::Unavailable(
                    "the audit writer has stopped".into(),
                ))
            }
        }
    }
}

/// The records of the log under `dir` that `q` wants, oldest first: the newest `limit`, or
/// with `after` the first `limit` after it (so a reader pages forward).
pub fn read(dir: &Path, q: &Query) -> Result<Vec<Record>, LogError> {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    let mut out = VecDeque::new();
    for path in segments::list(dir)? {
        let text = std::fs::read_to_string(&path).map_err(|e| LogError::io(&path, e))?;
        for line in text.lines() {
            let Ok(r) = serde_json::from_str::<Record>(line) else {
                continue;
            };
            if q.matches(&r) {
                out.push_back(r);
                if out.len() > limit {
                    if q.after.is_some() {
                        out.pop_back();
                        return Ok(out.into());
                    }
                    out.pop_front();
                }
            }
        }
    }
    Ok(out.into())
}

/// The node whose log lies under `dir`, as its newest record says (for a stopped warden whose
/// node name is not in its data dir).
pub fn node_of(dir: &Path) -> Result<Option<String>, LogError> {
    for path in segments::list(dir)?.iter().rev() {
        let text = std::fs::read_to_string(path).map_err(|e| LogError::io(path, e))?;
        if let Some(links) = text
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str::<chain::Links>(l).ok())
        {
            return Ok(Some(links.node));
        }
    }
    Ok(None)
}

/// Verifies the log of `node` under `dir` against its anchor in `store` (MAC under `key`):
/// for a log that is not open, e.g. a stopped warden's.
pub async fn verify_dir(
    dir: &Path,
    node: &str,
    key: &[u8; 32],
    store: &dyn Store,
) -> Result<Verified, AuditError> {
    let anchor = anchor::read(store, node).await.map_err(AuditError::Read)?;
    let (dir, node, key) = (dir.to_owned(), node.to_owned(), *key);
    tokio::task::spawn_blocking(move || verify::verify(&dir, &node, anchor.as_ref(), &key))
        .await
        .map_err(|e| AuditError::Read(e.to_string()))?
        .map_err(|e| AuditError::Read(e.to_string()))
}

impl Audit for Log {
    fn record(&self, e: Event) {
        let _ = self.send(Msg::Record(e, None));
    }

    fn record_durable(&self, e: Event) -> DurableFuture {
        let (tx, rx) = oneshot::channel();
        let sent = self.send(Msg::Record(e, Some(tx)));
        Box::pin(async move {
            sent?;
            rx.await
                .unwrap_or_else(|_| Err(AuditError::Unavailable("the audit writer stopped".into())))
        })
    }

    fn kept(&self) -> bool {
        true
    }

    fn health(&self) -> Result<(), String> {
        if let Some(e) = self.shared.error() {
            return Err(e);
        }
        let at = self.shared.overflowed_ms.load(Ordering::Relaxed);
        if at != 0 && warden_core::model::now_ms().saturating_sub(at) < OVERFLOW_ALARM_MS {
            return Err("the audit queue overflowed in the last 5 minutes: records were lost (a gap record says how many)".into());
        }
        Ok(())
    }

    fn required(&self) -> bool {
        self.required
    }

    fn digest(&self, body: &[u8]) -> String {
        anchor::body_digest(&self.body_key, body)
    }

    fn refusing(&self) -> Option<String> {
        if !self.required || self.shared.dropped.load(Ordering::Acquire) == 0 {
            return None;
        }
        let why = self
            .shared
            .error()
            .unwrap_or_else(|| self.shared.why_lost());
        Some(format!(
            "the audit log cannot write ({why}); this node refuses access until it can: free space under {}",
            self.dir.display()
        ))
    }

    fn stats(&self) -> AuditStats {
        AuditStats {
            head_seq: self.shared.head.lock().map(|h| h.0).unwrap_or(0),
            lost: self.shared.lost_total.load(Ordering::Relaxed),
        }
    }

    fn query(&self, q: Query) -> AuditFuture<'_, Vec<Record>> {
        let dir = self.dir.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || read(&dir, &q))
                .await
                .map_err(|e| AuditError::Read(e.to_string()))?
                .map_err(|e| AuditError::Read(e.to_string()))
        })
    }

    fn verify(&self) -> AuditFuture<'_, Verified> {
        Box::pin(verify_dir(&self.dir, &self.node, &self.key, &*self.store))
    }
}

#[cfg(test)]
mod tests;
