//! Reading a store file through before anything writes to it: a damaged file is refused with
//! the file untouched, never half-repaired or rewritten by a start that then fails.
//!
//! The file is opened read-only and every record of every table is read, inside a guard that
//! turns a panic of the engine into an error. A file that needs recovery (its writer was
//! killed, as after `kill -9`) cannot be opened read-only: a copy of it is recovered and read
//! instead, and only if that works is the file itself opened for writing.

use std::path::{Path, PathBuf};

use redb::{Database, ReadOnlyDatabase, ReadableDatabase, ReadableTable, TableDefinition};

use super::{KV, LEASES, LEASE_KEYS, LOG, META};
use crate::StoreError;

/// What reading the file through found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Records of the key-value table.
    pub records: usize,
    /// Whether the file needed recovery (its last writer did not close it).
    pub recovered: bool,
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

/// Reads every table of `db` through; the number of key-value records.
fn read_through(db: &impl ReadableDatabase) -> Result<usize, String> {
    let txn = db.begin_read().map_err(|e| e.to_string())?;
    fn all<K: redb::Key + 'static, V: redb::Value + 'static>(
        txn: &redb::ReadTransaction,
        t: TableDefinition<K, V>,
    ) -> Result<usize, String> {
        let table = match txn.open_table(t) {
            Ok(t) => t,
            // A store made by an older warden may lack a table; it is created on open.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
            Err(e) => return Err(e.to_string()),
        };
        let mut n = 0;
        for row in table.iter().map_err(|e| e.to_string())? {
            let (k, v) = row.map_err(|e| e.to_string())?;
            let _ = (k.value(), v.value());
            n += 1;
        }
        Ok(n)
    }
    let records = all(&txn, KV)?;
    all(&txn, LOG)?;
    all(&txn, META)?;
    all(&txn, LEASES)?;
    all(&txn, LEASE_KEYS)?;
    Ok(records)
}

/// Reads `path` through without writing to it.
pub fn verify(path: &Path) -> Result<Report, StoreError> {
    let opened = quietly(|| ReadOnlyDatabase::open(path));
    match opened {
        Err(_) => Err(damaged(path, "the storage engine could not parse it")),
        Ok(Ok(db)) => {
            let records = quietly(|| read_through(&db))
                .map_err(|_| damaged(path, "the storage engine failed reading it"))?
                .map_err(|e| damaged(path, e))?;
            Ok(Report {
                records,
                recovered: false,
            })
        }
        Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => Err(StoreError::Open {
            path: path.display().to_string(),
            reason: "another warden process has it open; stop that one or use another --data-dir"
                .into(),
        }),
        Ok(Err(redb::DatabaseError::RepairAborted)) => verify_copy(path),
        Ok(Err(e)) => Err(damaged(path, e)),
    }
}

/// Reads `path` through as [`verify`] does, then also opens a copy of it for writing, as
/// `warden up` will: some damage (to the allocator's state) only shows to a writer. For
/// `warden store check`, which must refuse every file that `warden up` would.
pub fn verify_thoroughly(path: &Path) -> Result<Report, StoreError> {
    let first = verify(path)?;
    let copy = verify_copy(path)?;
    Ok(Report {
        records: copy.records,
        recovered: first.recovered,
    })
}

/// Recovers a copy of `path` and reads it through.
fn verify_copy(path: &Path) -> Result<Report, StoreError> {
    let copy: PathBuf = path.with_extension("redb.verifying");
    let _ = std::fs::remove_file(&copy);
    std::fs::copy(path, &copy).map_err(|e| StoreError::Open {
        path: path.display().to_string(),
        reason: format!("cannot copy it to {} to check it: {e}", copy.display()),
    })?;
    let checked = quietly(|| -> Result<usize, String> {
        let db = Database::open(&copy).map_err(|e| e.to_string())?;
        read_through(&db)
    });
    let _ = std::fs::remove_file(&copy);
    let records = checked
        .map_err(|_| damaged(path, "the storage engine failed recovering it"))?
        .map_err(|e| damaged(path, e))?;
    Ok(Report {
        records,
        recovered: true,
    })
}
