//! The log's files: segments named by the sequence number of their first record
//! (`00000000000000000001.jsonl`), oldest first.

use std::path::{Path, PathBuf};

use crate::LogError;

/// The name of the segment whose first record is `seq`.
pub(crate) fn name(seq: u64) -> String {
    format!("{seq:020}.jsonl")
}

/// Every segment under `dir`, oldest first.
pub(crate) fn list(dir: &Path) -> Result<Vec<PathBuf>, LogError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LogError::io(dir, e)),
    };
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| LogError::io(dir, e))?.path();
        let seq = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".jsonl"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(seq) = seq {
            found.push((seq, path));
        }
    }
    found.sort();
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

/// A segment's file name, for reports.
pub(crate) fn display(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}
