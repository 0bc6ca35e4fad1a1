//! Which record layout a store file holds, and rewriting a file of the old layout in the new.
//!
//! The `meta` table's `format` row names the layout ([`codec`](super::codec)); a file without
//! it was written before records carried checksums (format 1). Opening such a file for writing
//! rewrites every sound record and log entry with its checksum, in one transaction, and sets
//! `format` to 2: after that, every read checks every record. A format-1 record whose value no
//! longer matches its hash is left byte for byte as it was, so it reads as damaged in format 2
//! too, and is reported, never sealed as if it were sound.

use redb::{Database, ReadTransaction, ReadableTable, WriteTransaction};

use super::codec::{self, FORMAT};
use super::{KV, LOG, META};
use crate::StoreError;

/// The record layout of the file `txn` reads.
pub(super) fn of_read(txn: &ReadTransaction) -> Result<u64, ReadError> {
    use redb::TableHandle;
    match txn.open_table(META) {
        Ok(meta) => Ok(meta
            .get("format")
            .map_err(|source| ReadError::Rows {
                table: META.name().to_owned(),
                source,
            })?
            .map_or(1, |v| v.value())),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(1),
        Err(source) => Err(ReadError::Table {
            table: META.name().to_owned(),
            source,
        }),
    }
}

/// Rewrites a format-1 file in format 2; does nothing to a format-2 file.
pub(super) fn migrate(db: &Database) -> Result<(), StoreError> {
    let err = |e: redb::Error| StoreError::Engine {
        op: "migrate",
        reason: e.to_string(),
    };
    let txn = db.begin_write().map_err(|e| err(e.into()))?;
    let format = txn
        .open_table(META)
        .map_err(|e| err(e.into()))?
        .get("format")
        .map_err(|e| err(e.into()))?
        .map_or(1, |v| v.value());
    match format {
        1 => {}
        FORMAT => return Ok(()),
        other => {
            return Err(StoreError::Corrupt {
                key: "meta/format".into(),
                reason: format!(
                    "the file says its records are in format {other}, which this warden does not know; run the warden that wrote it, or restore a backup"
                ),
            })
        }
    }
    rewrite(&txn).map_err(err)?;
    txn.open_table(META)
        .map_err(|e| err(e.into()))?
        .insert("format", FORMAT)
        .map_err(|e| err(e.into()))?;
    txn.commit().map_err(|e| err(e.into()))?;
    tracing::info!("store records now carry checksums (format {FORMAT})");
    Ok(())
}

fn rewrite(txn: &WriteTransaction) -> Result<(), redb::Error> {
    let mut kv = txn.open_table(KV)?;
    let mut sealed = Vec::new();
    for row in kv.iter()? {
        let (k, v) = row?;
        match codec::decode_v1_record(k.value(), v.value()) {
            Ok(e) => sealed.push((
                e.key.clone(),
                codec::encode_record(&e.key, e.create_revision, e.mod_revision, e.lease, &e.value),
            )),
            Err(e) => tracing::warn!(error = %e, "a damaged record is kept as it is"),
        }
    }
    for (k, v) in sealed {
        kv.insert(k.as_str(), v.as_slice())?;
    }
    let mut log = txn.open_table(LOG)?;
    let mut sealed = Vec::new();
    for row in log.iter()? {
        let (rev, v) = row?;
        if let Ok(ev) = codec::decode_v1_event(rev.value(), v.value()) {
            sealed.push((
                ev.revision,
                codec::encode_event(ev.revision, &ev.key, &ev.kind),
            ));
        }
    }
    for (rev, v) in sealed {
        log.insert(rev, v.as_slice())?;
    }
    Ok(())
}

/// Why reading a store file through stopped (rather than finding a damaged record, which the
/// report lists).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    /// A read transaction could not begin.
    #[error("cannot begin reading it: {0}")]
    Begin(#[from] redb::TransactionError),
    /// A table could not be opened.
    #[error("cannot open its table {table}: {source}")]
    Table {
        /// The table.
        table: String,
        /// Why.
        source: redb::TableError,
    },
    /// A table's rows could not be read.
    #[error("cannot read its table {table}: {source}")]
    Rows {
        /// The table.
        table: String,
        /// Why.
        source: redb::StorageError,
    },
}

// === impl ReadError ===

impl ReadError {
    /// The operating system's error underneath, when that is what stopped the read.
    pub(super) fn io(&self) -> Option<&std::io::Error> {
        let storage = match self {
            Self::Begin(redb::TransactionError::Storage(s))
            | Self::Table {
                source: redb::TableError::Storage(s),
                ..
            }
            | Self::Rows { source: s, .. } => s,
            _ => return None,
        };
        match storage {
            redb::StorageError::Io(e) => Some(e),
            _ => None,
        }
    }
}
