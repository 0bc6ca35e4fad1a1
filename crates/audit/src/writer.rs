//! The log's one writer: a thread that takes queued records in batches, chains them, appends
//! them to the current segment and fsyncs a batch when a durable record is in it (group
//! commit), then resolves every durable record of the batch at once. It starts from the tail
//! the previous run left: a torn last line is cut, and a run that did not end with `stopped` is
//! recorded as a gap.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use warden_core::audit::{AuditError, Event, NodeEvent, Record};

use crate::chain::{self, Links, GENESIS};
use crate::{retain, segments, LogError, Settings, Shared};

/// Most records written in one batch.
const BATCH: usize = 1024;

/// How often an idle writer tries again to write the gap of records it could not write (a
/// full disk freed, an overflow with nothing queued after it): the log heals, and a node that
/// refuses access while it cannot record serves again, without waiting for a record to come.
const RETRY: Duration = Duration::from_secs(1);

/// What the queue carries.
pub(crate) enum Msg {
    /// A record, and who waits for it to be fsync'd.
    Record(Event, Option<oneshot::Sender<Result<(), AuditError>>>),
    /// Stop after everything queued before.
    Stop,
}

pub(crate) struct Writer {
    dir: PathBuf,
    node: String,
    file: File,
    path: PathBuf,
    len: u64,
    seq: u64,
    hash: String,
    settings: Settings,
    shared: Arc<Shared>,
}

/// Opens a segment to append to, mode 0600, and fsyncs its directory so that a new segment's
/// name survives a crash as its records do.
fn open_segment(path: &Path) -> Result<File, LogError> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| LogError::io(path, e))?;
    if let Some(dir) = path.parent() {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| LogError::io(dir, e))?;
    }
    Ok(file)
}

/// The last complete record of the log, reading segments from the newest; a torn last line
/// (no newline after it) is cut from the file, and said in the returned notes.
fn tail(segs: &[PathBuf], notes: &mut Vec<Event>) -> Result<Option<(Links, String)>, LogError> {
    for (i, path) in segs.iter().enumerate().rev() {
        let bytes = std::fs::read(path).map_err(|e| LogError::io(path, e))?;
        let end = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        if end < bytes.len() && i + 1 == segs.len() {
            let file = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| LogError::io(path, e))?;
            file.set_len(end as u64)
                .and_then(|()| file.sync_all())
                .map_err(|e| LogError::io(path, e))?;
            notes.push(Event::Gap {
                why: format!(
                    "the last line of {} was torn ({} bytes of a write the previous run did not finish); it was cut at start",
                    segments::display(path),
                    bytes.len() - end
                ),
                lost: Some(1),
            });
        }
        let text = String::from_utf8_lossy(&bytes[..end]);
        let mut unreadable = 0u64;
        for line in text.lines().rev() {
            match serde_json::from_str::<Links>(line) {
                Ok(links) => {
                    if unreadable > 0 {
                        notes.push(Event::Gap {
                            why: format!(
                                "{unreadable} unreadable lines at the end of {}",
                                segments::display(path)
                            ),
                            lost: None,
                        });
                    }
                    return Ok(Some((links, line.to_owned())));
                }
                Err(_) => unreadable += 1,
            }
        }
    }
    Ok(None)
}

// === impl Writer ===

impl Writer {
    /// Opens the log under `dir` and writes what the start found and `started`, fsync'd.
    pub(crate) fn open(
        dir: &Path,
        node: &str,
        settings: Settings,
        shared: Arc<Shared>,
    ) -> Result<Self, LogError> {
        std::fs::create_dir_all(dir).map_err(|e| LogError::io(dir, e))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| LogError::io(dir, e))?;
        let segs = segments::list(dir)?;
        let mut notes = Vec::new();
        let (seq, hash) = match tail(&segs, &mut notes)? {
            Some((links, line)) => {
                let stopped = serde_json::from_str::<Record>(&line).is_ok_and(|r| {
                    r.event
                        == Event::Node {
                            event: NodeEvent::Stopped,
                            node: None,
                        }
                });
                if !stopped {
                    notes.push(Event::Gap {
                        why: format!(
                            "the previous run ended without stopping at seq {}: records it had queued and not written are lost",
                            links.seq
                        ),
                        lost: None,
                    });
                }
                (links.seq, links.hash)
            }
            None => (0, GENESIS.to_owned()),
        };
        let path = match segs.last() {
            Some(p) => p.clone(),
            None => dir.join(segments::name(seq + 1)),
        };
        let file = open_segment(&path)?;
        let len = file.metadata().map_err(|e| LogError::io(&path, e))?.len();
        let mut w = Writer {
            dir: dir.to_owned(),
            node: node.to_owned(),
            file,
            path,
            len,
            seq,
            hash,
            settings,
            shared,
        };
        w.publish();
        notes.push(Event::Node {
            event: NodeEvent::Started,
            node: None,
        });
        let batch = notes.into_iter().map(|e| Msg::Record(e, None)).collect();
        w.write_batch(batch, true);
        if let Some(e) = w.shared.error() {
            return Err(LogError::Start(e));
        }
        Ok(w)
    }

    /// Takes batches from `rx` until it closes or says stop.
    pub(crate) fn run(mut self, rx: Receiver<Msg>) {
        loop {
            let first = match rx.recv_timeout(RETRY) {
                Ok(m) => m,
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {
                    if self.shared.dropped.load(Ordering::Acquire) > 0 {
                        self.write_batch(Vec::new(), true);
                    }
                    continue;
                }
            };
            #[cfg(test)]
            {
                self.shared.held.store(true, Ordering::Release);
                drop(self.shared.hold.lock());
                self.shared.held.store(false, Ordering::Release);
            }
            let mut batch = vec![first];
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            let stop = batch.iter().any(|m| matches!(m, Msg::Stop));
            self.write_batch(batch, stop);
            if stop {
                return;
            }
        }
    }

    /// Seals `e` as the next record into `buf`.
    fn push(&mut self, buf: &mut String, e: &Event) {
        let (line, hash) = chain::seal(
            self.seq + 1,
            warden_core::model::now_ms(),
            &self.node,
            e,
            &self.hash,
        );
        buf.push_str(&line);
        buf.push('\n');
        self.seq += 1;
        self.hash = hash;
    }

    /// Appends `batch` (fsync'd if a durable record is in it or `sync`), then answers its
    /// waiters. A failed write is cut back, counted as lost and said by a gap once writes work.
    fn write_batch(&mut self, batch: Vec<Msg>, sync: bool) {
        let (seq0, hash0) = (self.seq, self.hash.clone());
        let mut buf = String::new();
        // Counted out of `dropped` only once its gap is written: until then the node that
        // requires its log refuses access.
        let lost = self.shared.dropped.load(Ordering::Acquire);
        if lost > 0 {
            let why = self.shared.why_lost();
            self.push(
                &mut buf,
                &Event::Gap {
                    why,
                    lost: Some(lost),
                },
            );
        }
        let (mut waiters, mut count) = (Vec::new(), 0u64);
        for m in batch {
            if let Msg::Record(e, w) = m {
                self.push(&mut buf, &e);
                count += 1;
                waiters.extend(w);
            }
        }
        let sync = sync || !waiters.is_empty();
        let written = self
            .file
            .write_all(buf.as_bytes())
            .and_then(|()| match sync {
                true => self.file.sync_data(),
                false => Ok(()),
            });
        match written {
            Ok(()) => {
                self.len += buf.len() as u64;
                self.shared.set_error(None);
                if lost > 0 && self.shared.dropped.fetch_sub(lost, Ordering::AcqRel) == lost {
                    if let Ok(mut w) = self.shared.lost_why.lock() {
                        *w = None;
                    }
                }
                self.publish();
                for w in waiters {
                    let _ = w.send(Ok(()));
                }
                if self.len >= self.settings.segment_bytes {
                    self.rotate();
                }
            }
            Err(e) => {
                // Cut what may have been half written, so the file ends on a whole record.
                let _ = self.file.set_len(self.len);
                (self.seq, self.hash) = (seq0, hash0);
                let why = format!("cannot write {}: {e}", self.path.display());
                tracing::error!(error = %why, "the audit log cannot write; the gap is recorded once it can");
                // `lost` is still in `dropped`; this batch's records join it.
                self.shared.lost(count, &why);
                self.shared.set_error(Some(why.clone()));
                for w in waiters {
                    let _ = w.send(Err(AuditError::Unavailable(why.clone())));
                }
            }
        }
    }

    /// Starts a new segment, then drops old ones past retention (each drop is recorded).
    fn rotate(&mut self) {
        let path = self.dir.join(segments::name(self.seq + 1));
        match open_segment(&path) {
            Ok(file) => {
                let _ = self.file.sync_all();
                (self.file, self.path, self.len) = (file, path, 0);
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot start a new audit segment; appending to the current one");
                return;
            }
        }
        let anchored = self.shared.anchored.load(Ordering::Acquire);
        let pruned = retain::prune(&self.dir, &self.path, &self.settings, anchored);
        if !pruned.is_empty() {
            let batch = pruned.into_iter().map(|e| Msg::Record(e, None)).collect();
            self.write_batch(batch, true);
        }
    }

    /// Makes the head visible to the anchor task.
    fn publish(&self) {
        if let Ok(mut head) = self.shared.head.lock() {
            *head = (self.seq, self.hash.clone());
        }
    }
}
