//! Retention: the oldest segments go once the log is past its size or they are past their
//! age. Each drop becomes a `pruned` record naming the last record dropped and its hash, so
//! verify starts the chain there rather than calling the missing start tampering. No segment
//! holding the record anchored in the store, or any after it, is dropped.

use std::path::Path;
use std::time::SystemTime;

use warden_core::audit::Event;

use crate::chain::Links;
use crate::{segments, Settings};

/// The last record of the segment at `path`.
fn last_links(path: &Path) -> Option<Links> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Links>(l).ok())
}

/// Drops segments older than `current` past retention, each only if it ends before record
/// `anchored` (the one the store's anchor names: a segment holding it stays until a later
/// anchor, so the anchor always names a record the log keeps); the `pruned` records to write.
pub(crate) fn prune(dir: &Path, current: &Path, settings: &Settings, anchored: u64) -> Vec<Event> {
    let Ok(segs) = segments::list(dir) else {
        return Vec::new();
    };
    let sized: Vec<(std::path::PathBuf, u64, Option<SystemTime>)> = segs
        .into_iter()
        .filter(|p| p != current)
        .filter_map(|p| {
            let m = std::fs::metadata(&p).ok()?;
            Some((p, m.len(), m.modified().ok()))
        })
        .collect();
    let mut total: u64 = sized.iter().map(|(_, len, _)| len).sum();
    let now = SystemTime::now();
    let mut pruned = Vec::new();
    for (path, len, modified) in sized {
        let old = modified
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age > settings.retain_age);
        if total <= settings.retain_bytes && !old {
            break;
        }
        let Some(links) = last_links(&path) else {
            break;
        };
        if links.seq >= anchored {
            break;
        }
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(error = %e, file = %path.display(), "cannot drop an old audit segment");
            break;
        }
        total -= len;
        pruned.push(Event::Pruned {
            up_to_seq: links.seq,
            hash: links.hash,
        });
    }
    pruned
}
