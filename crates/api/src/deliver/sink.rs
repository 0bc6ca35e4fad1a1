//! Where a release's progress goes: the pusher's connection, while it listens, and the
//! release's log file. Both are bounded: build output is hostile (a dependency's install
//! script prints what it likes), and warden's process also runs the gateway.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use tokio::sync::mpsc;
use warden_api_types::ReleaseEvent;
use warden_core::builds::Output;

/// Most bytes of output one release keeps and sends; the rest is dropped, once said so.
const MAX_OUTPUT: u64 = 8 << 20;
/// Events queued for a client that reads slowly; beyond, output lines are dropped for it (the
/// log keeps them) and only the final event waits.
pub(super) const QUEUE: usize = 1024;

/// A release's progress.
#[derive(Clone)]
pub(super) struct Sink(Arc<Inner>);

struct Inner {
    tx: mpsc::Sender<Bytes>,
    log: Mutex<Option<std::fs::File>>,
    written: AtomicU64,
    truncated: AtomicBool,
}

impl Sink {
    /// Progress to `tx` and to a new private file at `log`.
    pub(super) fn new(tx: mpsc::Sender<Bytes>, log: Option<PathBuf>) -> Self {
        let file = log.and_then(|path| {
            use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
            let dir = path.parent()?;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .ok()?;
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(&path)
                .ok()
        });
        Self(Arc::new(Inner {
            tx,
            log: Mutex::new(file),
            written: AtomicU64::new(0),
            truncated: AtomicBool::new(false),
        }))
    }

    fn send(&self, event: &ReleaseEvent) {
        let mut line = line(event);
        line.push('\n');
        let _ = self.0.tx.try_send(Bytes::from(line));
    }

    /// The final event: waits for room, as the client must hear how the release ended.
    pub(super) async fn finish(&self, event: ReleaseEvent) {
        let mut line = line(&event);
        line.push('\n');
        let _ = self.0.tx.send(Bytes::from(line)).await;
    }

    /// A line of progress, to the client and the log.
    pub(super) fn line(&self, text: &str) {
        if self.log_only(text) {
            self.send(&ReleaseEvent::Log { log: text.into() });
        }
    }

    /// A line into the release's log only (the client hears of it in the final event);
    /// false once the release's output is over its bound.
    pub(super) fn log_only(&self, text: &str) -> bool {
        let n = self
            .0
            .written
            .fetch_add(text.len() as u64 + 1, Ordering::Relaxed);
        if n > MAX_OUTPUT {
            if !self.0.truncated.swap(true, Ordering::Relaxed) {
                let note = format!("(output truncated: more than {MAX_OUTPUT} bytes)");
                self.append(&note);
                self.send(&ReleaseEvent::Log { log: note });
            }
            return false;
        }
        self.append(text);
        true
    }

    fn append(&self, text: &str) {
        if let Some(f) = self
            .0
            .log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            let _ = writeln!(f, "{text}");
        }
    }

    /// The sink as a build's output.
    pub(super) fn output(&self) -> Output {
        let me = self.clone();
        Arc::new(move |text: &str| me.line(text))
    }
}

/// An event as one line of JSON, its objects' keys in sorted order as they always were (a
/// release's fields included), so that clients reading the raw lines see no change.
fn line(event: &ReleaseEvent) -> String {
    serde_json::to_value(event)
        .map(|v| v.to_string())
        .unwrap_or_default()
}

/// The file at `path`, or its last `tail` bytes, as text (invalid UTF-8 replaced, never the
/// whole output lost to one bad byte); `None` when it cannot be read.
pub(crate) fn read_tail(path: &std::path::Path, tail: Option<u64>) -> Option<String> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let from = tail.map_or(0, |t| len.saturating_sub(t));
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut bytes = Vec::new();
    f.take(len - from).read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The last `tail` bytes of `all` (from a character start), or all of it.
pub(crate) fn cut_tail(all: String, tail: Option<u64>) -> String {
    match tail.and_then(|t| all.len().checked_sub(usize::try_from(t).ok()?)) {
        Some(mut at) if at > 0 => {
            while !all.is_char_boundary(at) {
                at += 1;
            }
            all[at..].to_owned()
        }
        _ => all,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_tail_is_read_by_seeking_and_bad_bytes_do_not_lose_the_rest() {
        let path = std::env::temp_dir().join(format!("warden-tail-{}.log", std::process::id()));
        std::fs::write(&path, b"first line\n\xff\xfebad\nlast line\n").unwrap();
        let all = super::read_tail(&path, None).unwrap();
        assert_eq!(all, "first line\n\u{fffd}\u{fffd}bad\nlast line\n");
        assert_eq!(super::read_tail(&path, Some(10)).unwrap(), "last line\n");
        assert_eq!(super::read_tail(&path, Some(1 << 40)).unwrap(), all);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(super::cut_tail("aé\nend".to_owned(), Some(5)), "\nend");
        assert_eq!(super::cut_tail("abc".to_owned(), Some(9)), "abc");
    }
}
