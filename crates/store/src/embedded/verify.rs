//! Proving a store file sound before anything writes to it: a damaged file is refused with the
//! file untouched, never half-repaired or rewritten by a start that then fails.
//!
//! [`prove`] is the one check: `warden up` runs it (through [`EmbeddedStore::open`]) before it
//! writes a byte, and `warden store check` runs it and nothing else, so the two cannot disagree.
//! It opens the file read-only and decodes every record and log entry (checksums included), then
//! runs on a copy of the file everything opening it for writing does (recovery after a killed
//! writer, creating tables, rewriting an older record format) and decodes everything again:
//! some damage (to the allocator's state) only shows to a writer. Only then is the file itself
//! opened for writing. Every step runs inside a guard that turns a panic of the engine into an
//! error.
//!
//! A file the operating system will not let warden read or write is reported as such, with the
//! file's owner and mode to check: it is no sign of damage, and restoring a backup over it would
//! throw a sound store away.
//!
//! [`EmbeddedStore::open`]: super::EmbeddedStore::open

use std::path::{Path, PathBuf};

use redb::{ReadOnlyDatabase, ReadableDatabase, ReadableTable, TableDefinition};

use super::format::ReadError;
use super::{codec, format, KV, LEASES, LEASE_KEYS, LOG, META};
use crate::StoreError;

/// What reading the file through found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Records of the key-value table (damaged ones included).
    pub records: usize,
    /// Whether the file needed recovery (its last writer did not close it).
    pub recovered: bool,
    /// Records and log entries whose checksum or layout is wrong, with why. A start skips and
    /// reports them; `warden store check` fails on them.
    pub damaged: Vec<(String, String)>,
}

/// The error for a read through `path` that stopped: a refused access as such (the file may
/// be sound), anything else as damage.
fn read_failure(path: &Path, e: &ReadError) -> StoreError {
    match e.io() {
        Some(io) if is_access(io) => no_access(path, "read", io),
        _ => damaged(path, e),
    }
}

/// Runs `f`, turning a panic of the engine into `Err` without printing it: a damaged file is
/// input, and its error is reported as such. (The panic hook is process-wide; this runs while
/// a store is opened, before the store serves anyone.)
pub(crate) fn quietly<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(previous);
    r
}

fn damaged(path: &Path, what: impl std::fmt::Display) -> StoreError {
    StoreError::Open {
        path: path.display().to_string(),
        reason: format!(
            "the file is damaged ({what}); it was left as it is. Restore a backup with `warden store restore BACKUP --data-dir DIR`, or move it away to start with an empty store"
        ),
    }
}

/// The operating system refused access to the file: says so, and that the file may be sound.
pub(crate) fn no_access(path: &Path, doing: &str, e: &std::io::Error) -> StoreError {
    StoreError::Open {
        path: path.display().to_string(),
        reason: format!(
            "warden may not {doing} it ({e}); this says nothing about its contents, which may well be sound. Run warden as the user that owns the file, or give that user access to it and its directory (see `ls -l {}`); do not restore a backup over it",
            path.display()
        ),
    }
}

/// Whether `e` is the operating system refusing access, rather than the contents being bad.
pub(crate) fn is_access(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{PermissionDenied, ReadOnlyFilesystem};
    matches!(e.kind(), PermissionDenied | ReadOnlyFilesystem)
}

/// The error for a failure of the engine to open `path`: a refused access as such, another
/// warden as such, anything else as damage.
pub(crate) fn open_failure(path: &Path, doing: &str, e: redb::DatabaseError) -> StoreError {
    match e {
        redb::DatabaseError::Storage(redb::StorageError::Io(io)) if is_access(&io) => {
            no_access(path, doing, &io)
        }
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Open {
            path: path.display().to_string(),
            reason: "another warden process has it open; stop that one or use another --data-dir"
                .into(),
        },
        e => damaged(path, e),
    }
}

/// Reads every table of `db` through, decoding every record and log entry.
fn read_through(db: &impl ReadableDatabase) -> Result<Report, ReadError> {
    let txn = db.begin_read()?;
    let format = format::of_read(&txn)?;
    let mut report = Report {
        records: 0,
        recovered: false,
        damaged: Vec::new(),
    };
    report.records = each(&txn, KV, |k, v| {
        if let Err(e) = codec::decode_in(format, k, v) {
            report.damaged.push((k.to_owned(), e.to_string()));
        }
    })?;
    each(&txn, LOG, |rev, v| {
        if let Err(e) = codec::decode_event_in(format, rev, v) {
            report.damaged.push((format!("log@{rev}"), e.to_string()));
        }
    })?;
    each(&txn, META, |_, _| ())?;
    each(&txn, LEASES, |_, _| ())?;
    each(&txn, LEASE_KEYS, |_, _| ())?;
    Ok(report)
}

/// Calls `f` on every row of table `t`; how many rows there are.
fn each<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::ReadTransaction,
    t: TableDefinition<K, V>,
    mut f: impl FnMut(K::SelfType<'_>, V::SelfType<'_>),
) -> Result<usize, ReadError> {
    use redb::TableHandle;
    let table = match txn.open_table(t) {
        Ok(t) => t,
        // A store made by an older warden may lack a table; it is created on open.
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(source) => {
            return Err(ReadError::Table {
                table: t.name().to_owned(),
                source,
            })
        }
    };
    let rows = |source| ReadError::Rows {
        table: t.name().to_owned(),
        source,
    };
    let mut n = 0;
    for row in table.iter().map_err(rows)? {
        let (k, v) = row.map_err(rows)?;
        f(k.value(), v.value());
        n += 1;
    }
    Ok(n)
}

/// Proves `path` sound without writing to it: what `warden up` runs before it writes, and all
/// `warden store check` runs. `Err` when the file cannot be used at all; damaged records are
/// listed in the report.
pub fn prove(path: &Path) -> Result<Report, StoreError> {
    // Asked first and plainly, so that a refused access is never mistaken for damage.
    std::fs::File::open(path).map_err(|e| no_access_or(path, "read", e))?;
    let recovered = match quietly(|| ReadOnlyDatabase::open(path)) {
        Err(_) => return Err(damaged(path, "the storage engine could not parse it")),
        Ok(Ok(db)) => {
            quietly(|| read_through(&db))
                .map_err(|_| damaged(path, "the storage engine failed reading it"))?
                .map_err(|e| read_failure(path, &e))?;
            false
        }
        Ok(Err(redb::DatabaseError::RepairAborted)) => true,
        Ok(Err(e)) => return Err(open_failure(path, "read", e)),
    };
    let report = prove_copy(path)?;
    Ok(Report {
        recovered,
        ..report
    })
}

fn no_access_or(path: &Path, doing: &str, e: std::io::Error) -> StoreError {
    if is_access(&e) {
        no_access(path, doing, &e)
    } else {
        StoreError::Open {
            path: path.display().to_string(),
            reason: format!("cannot {doing} it: {e}"),
        }
    }
}

/// Opens a copy of `path` as `warden up` opens the file itself, and reads the copy through.
fn prove_copy(path: &Path) -> Result<Report, StoreError> {
    let copy: PathBuf = path.with_extension("redb.verifying");
    let _ = std::fs::remove_file(&copy);
    std::fs::copy(path, &copy).map_err(|e| StoreError::Open {
        path: path.display().to_string(),
        reason: format!(
            "cannot copy it to {} to check it ({e}); the file itself may be sound: give warden room and write access in its directory",
            copy.display()
        ),
    })?;
    let checked = quietly(|| -> Result<Report, StoreError> {
        let db = super::open_prepared(&copy)?;
        read_through(&db).map_err(|e| read_failure(path, &e))
    });
    let _ = std::fs::remove_file(&copy);
    match checked {
        Err(_) => Err(damaged(
            path,
            "the storage engine failed opening it for writing",
        )),
        // Errors about the copy are about the file.
        Ok(Err(StoreError::Open { reason, .. })) => Err(StoreError::Open {
            path: path.display().to_string(),
            reason: reason.replace(&copy.display().to_string(), &path.display().to_string()),
        }),
        Ok(Err(e)) => Err(damaged(path, e)),
        Ok(Ok(report)) => Ok(report),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read refused by the operating system halfway through says so and that the file may be
    /// sound; any other failure of the read is damage, with a backup to restore.
    #[test]
    fn a_refused_read_is_no_sign_of_damage() {
        let path = Path::new("/var/lib/warden/store.redb");
        let refused = ReadError::Rows {
            table: "kv".into(),
            source: redb::StorageError::Io(std::io::ErrorKind::PermissionDenied.into()),
        };
        let StoreError::Open { reason, .. } = read_failure(path, &refused) else {
            panic!("an open error");
        };
        assert!(reason.contains("may well be sound"), "{reason}");
        assert!(!reason.contains("damaged"), "{reason}");

        let broken = ReadError::Rows {
            table: "kv".into(),
            source: redb::StorageError::Corrupted("a bad page".into()),
        };
        let StoreError::Open { reason, .. } = read_failure(path, &broken) else {
            panic!("an open error");
        };
        assert!(
            reason.contains("damaged") && reason.contains("a bad page"),
            "{reason}"
        );
    }
}
