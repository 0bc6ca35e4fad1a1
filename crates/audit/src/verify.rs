//! Verify: walks a node's segments and checks that sequence numbers run on without holes,
//! each record's `prev` is the hash of the one before, each hash is what its bytes make, every
//! record is this node's, and the anchor in the store (MAC checked) names a record the log
//! holds. Reports the first bad spot. Reads files only: it runs on a live log (the writer only
//! appends) or a stopped one.

use std::path::{Path, PathBuf};

use warden_core::audit::{Event, Problem, Record, Verified};

use crate::anchor::{self, Anchor};
use crate::chain::{self, Links, GENESIS};
use crate::{segments, LogError};

struct Walk {
    node: String,
    records: u64,
    /// The last record read: its seq and hash.
    head: Option<(u64, String)>,
    /// Where the log starts, when not at 1: (file, first seq, its prev).
    start: Option<(String, u64, String)>,
    /// `pruned` records read: (up_to_seq, hash).
    pruned: Vec<(u64, String)>,
    /// The anchor's seq, and where it was found with which hash.
    anchor_seq: Option<u64>,
    at_anchor: Option<(String, u64, String)>,
}

fn problem(file: &str, line: u64, seq: Option<u64>, what: &str, detail: String) -> Problem {
    Problem {
        file: file.to_owned(),
        line,
        seq,
        what: what.to_owned(),
        detail,
    }
}

// === impl Walk ===

impl Walk {
    /// Checks one segment's lines; the first problem, if any.
    fn segment(&mut self, path: &Path) -> Result<Option<Problem>, LogError> {
        let file = segments::display(path);
        let bytes = std::fs::read(path).map_err(|e| LogError::io(path, e))?;
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.split('\n').collect();
        let parsed: Vec<Option<Links>> = lines
            .iter()
            .map(|l| serde_json::from_str::<Links>(l).ok())
            .collect();
        for (i, line) in lines.iter().enumerate() {
            let n = i as u64 + 1;
            let expected = self.head.as_ref().map(|(s, _)| s + 1);
            if i + 1 == lines.len() {
                if !line.is_empty() {
                    return Ok(Some(problem(&file, n, expected, "truncated tail",
                        "the last line is cut short (no newline): the file was truncated or a write was torn".into())));
                }
                break;
            }
            let Some(links) = &parsed[i] else {
                return Ok(Some(problem(
                    &file,
                    n,
                    expected,
                    "edited",
                    "the line is not a record (unreadable JSON)".into(),
                )));
            };
            if !chain::hash_holds(line, links) {
                return Ok(Some(problem(&file, n, Some(links.seq), "edited",
                    format!("record {}'s hash is not what its bytes make: it was changed after it was written", links.seq))));
            }
            if links.node != self.node {
                return Ok(Some(problem(
                    &file,
                    n,
                    Some(links.seq),
                    "not this node's chain",
                    format!(
                        "record {} is node {:?}'s, not {:?}'s",
                        links.seq, links.node, self.node
                    ),
                )));
            }
            match (&self.head, expected) {
                (Some((_, hash)), Some(want)) => {
                    if links.seq != want {
                        let next = parsed.get(i + 1).and_then(|l| l.as_ref()).map(|l| l.seq);
                        let what = if links.seq < want || next == Some(want) {
                            "reordered"
                        } else {
                            "missing"
                        };
                        return Ok(Some(problem(
                            &file,
                            n,
                            Some(want),
                            what,
                            format!(
                                "record {want} was expected here but record {} is",
                                links.seq
                            ),
                        )));
                    }
                    if links.prev != *hash {
                        return Ok(Some(problem(&file, n, Some(links.seq), "edited",
                            format!("record {} does not follow the one before (its prev is not that record's hash): a record before it was changed or replaced", links.seq))));
                    }
                }
                _ => {
                    if links.seq == 1 && links.prev != GENESIS {
                        return Ok(Some(problem(
                            &file,
                            n,
                            Some(1),
                            "edited",
                            "the first record does not start a chain".into(),
                        )));
                    }
                    if links.seq != 1 {
                        self.start = Some((file.clone(), links.seq, links.prev.clone()));
                    }
                }
            }
            if let Ok(r) = serde_json::from_str::<Record>(line) {
                if let Event::Pruned { up_to_seq, hash } = r.event {
                    self.pruned.push((up_to_seq, hash));
                }
            }
            if self.anchor_seq == Some(links.seq) {
                self.at_anchor = Some((file.clone(), n, links.hash.clone()));
            }
            self.records += 1;
            self.head = Some((links.seq, links.hash.clone()));
        }
        Ok(None)
    }

    /// The checks that need the whole walk: the start, and the anchor.
    fn end(&self, anchor: Option<&Anchor>, key: &[u8; 32], last_file: &str) -> Option<Problem> {
        if let Some((file, seq, prev)) = &self.start {
            let explained = self
                .pruned
                .iter()
                .any(|(up, h)| up + 1 == *seq && h == prev);
            if !explained {
                return Some(problem(file, 1, Some(*seq), "missing",
                    format!("the log starts at record {seq}, and no pruned record says records before it were dropped by retention")));
            }
        }
        let Some(a) = anchor else {
            if self.records == 0 {
                return None;
            }
            return Some(problem(last_file, 0, None, "anchor",
                format!("the store holds no anchor of node {:?}: the log cannot be tied to what was written (the store was replaced, or this log is not that node's)", self.node)));
        };
        if !anchor::holds(key, &self.node, a) {
            return Some(problem(last_file, 0, Some(a.seq), "anchor",
                "the anchor in the store does not carry this node's MAC: it was forged or the audit key changed".into()));
        }
        let head = self.head.as_ref().map_or(0, |(s, _)| *s);
        if head < a.seq {
            return Some(problem(last_file, 0, Some(head + 1), "truncated tail",
                format!("the log ends at record {head}, but record {} was written (the store's anchor names it)", a.seq)));
        }
        if let Some((file, first, _)) = self.start.as_ref().filter(|(_, f, _)| a.seq < *f) {
            // Retention never drops the anchored record (nor any after it): a log that starts
            // after it is another chain put in its place, whatever `pruned` record it carries.
            return Some(problem(file, 1, Some(*first), "anchor",
                format!("the log starts at record {first}, after record {} anchored in the store: retention never drops an anchored record, so the log was replaced", a.seq)));
        }
        match &self.at_anchor {
            Some((_, _, hash)) if *hash == a.hash => None,
            Some((file, line, _)) => Some(problem(file, *line, Some(a.seq), "anchor",
                format!("record {} is not the one anchored in the store: the log was replaced or rewritten up to here", a.seq))),
            None => Some(problem(last_file, 0, Some(a.seq), "missing",
                format!("record {} (anchored in the store) is not in the log", a.seq))),
        }
    }
}

/// Walks the log under `dir` of `node` and checks it against `anchor` (MAC under `key`).
pub(crate) fn verify(
    dir: &Path,
    node: &str,
    anchor: Option<&Anchor>,
    key: &[u8; 32],
) -> Result<Verified, LogError> {
    let segs: Vec<PathBuf> = segments::list(dir)?;
    let mut walk = Walk {
        node: node.to_owned(),
        records: 0,
        head: None,
        start: None,
        pruned: Vec::new(),
        anchor_seq: anchor.map(|a| a.seq),
        at_anchor: None,
    };
    let mut found = None;
    for path in &segs {
        if let Some(p) = walk.segment(path)? {
            found = Some(p);
            break;
        }
    }
    let last_file = segs
        .last()
        .map(|p| segments::display(p))
        .unwrap_or_default();
    if found.is_none() {
        found = walk.end(anchor, key, &last_file);
    }
    Ok(Verified {
        node: node.to_owned(),
        ok: found.is_none(),
        records: walk.records,
        head_seq: walk.head.as_ref().map_or(0, |(s, _)| *s),
        anchor_seq: anchor.map(|a| a.seq),
        problem: found,
    })
}
