//! Instance logs: where they are, warden's own lines in them, the cap on their size, and their
//! last lines for error messages.

use std::path::{Path, PathBuf};

/// Lines of an instance's output quoted in start errors and crash reports.
pub(crate) const TAIL_LINES: usize = 10;

/// The log file of instance `id` of `app` under `dir`.
pub(crate) fn path(dir: &Path, app: &str, id: &str) -> PathBuf {
    dir.join(format!("{app}-{id}.log"))
}

/// Adds a line of warden's own to an instance's log, where `warden logs` shows it beside the
/// app's output.
pub(crate) fn append(path: &Path, line: &str) {
    use std::io::Write;
    let written = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = written {
        tracing::warn!(log = %path.display(), error = %e, "could not add to an instance's log");
    }
}

/// Cuts `path` back to its newer half, from a line start, once it is larger than `max` bytes,
/// with a first line saying so. Apps append (O_APPEND) straight to the file, so their next
/// write lands at the new end; a line written while the cut runs may be lost, as with
/// logrotate's copytruncate. Returns whether the log was cut.
pub(crate) fn cap(path: &Path, max: u64) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let len = f.metadata()?.len();
    if len <= max {
        return Ok(false);
    }
    // One byte more than kept: if it is a newline, the kept part starts a line.
    let keep = max / 2 + 1;
    f.seek(SeekFrom::Start(len - keep))?;
    let mut tail = Vec::with_capacity(keep as usize);
    Read::by_ref(&mut f).take(keep).read_to_end(&mut tail)?;
    let from = tail.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
    let note = format!(
        "warden: this log reached {len} bytes (the limit is {max}, warden up --max-log-mb); older lines were dropped\n"
    );
    f.seek(SeekFrom::Start(0))?;
    f.write_all(note.as_bytes())?;
    f.write_all(&tail[from..])?;
    f.set_len((note.len() + tail.len() - from) as u64)?;
    Ok(true)
}

/// The last `lines` lines of a log file, for error messages.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(4096)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_over_its_cap_keeps_its_newer_half_from_a_line_start() {
        let dir = std::env::temp_dir().join(format!("warden-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("x.log");
        let lines: String = (0..1000).map(|i| format!("line {i:04}\n")).collect();
        std::fs::write(&log, &lines).unwrap();
        assert!(!cap(&log, 20_000).unwrap());
        assert!(cap(&log, 4_000).unwrap());
        let text = std::fs::read_to_string(&log).unwrap();
        let mut rest = text.lines();
        assert!(rest
            .next()
            .unwrap()
            .starts_with("warden: this log reached 10000 bytes"));
        let kept: Vec<&str> = rest.collect();
        assert_eq!(kept.first(), Some(&"line 0800"));
        assert_eq!(kept.last(), Some(&"line 0999"));
        assert_eq!(kept.len(), 200);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
