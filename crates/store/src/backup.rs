//! Backups: a consistent snapshot of every durable record, and putting one back.
//!
//! A backup holds the records that outlive their writer (apps, users, the lattice, health
//! reports): keys attached to a lease (instances, nodes, sessions) describe processes and logins
//! of the moment and are left out, as a restart would drop them anyway. Values are kept byte for
//! byte (base64), so a record warden cannot decode today is kept as it was.

use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::{Revision, Store, StoreError};

/// What a backup file says it is.
pub const FORMAT: &str = "warden-store-backup/1";

/// A snapshot of the store's durable records.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Backup {
    /// Always [`FORMAT`].
    pub format: String,
    /// The store revision the snapshot was taken at.
    pub revision: Revision,
    /// The records, in key order.
    pub records: Vec<Record>,
}

/// One record of a backup.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Record {
    /// The key.
    pub key: String,
    /// The value, base64.
    pub value: String,
}

/// Why a backup cannot be put back.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The file is not a warden backup, or is of another version.
    #[error("not a warden store backup ({0}); a backup starts with {{\"format\":\"{FORMAT}\"")]
    Format(String),
    /// A value is not base64.
    #[error("the record {key:?} of the backup is damaged: {reason}")]
    Damaged {
        /// Its key.
        key: String,
        /// Why.
        reason: String,
    },
    /// The store refused a write.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A consistent snapshot of every record not attached to a lease.
pub async fn snapshot(store: &dyn Store) -> Result<Backup, StoreError> {
    let listing = store.list("").await?;
    let records = listing
        .entries
        .into_iter()
        .filter(|e| e.lease.is_none())
        .map(|e| Record {
            key: e.key,
            value: base64::engine::general_purpose::STANDARD.encode(e.value),
        })
        .collect();
    Ok(Backup {
        format: FORMAT.to_owned(),
        revision: listing.revision,
        records,
    })
}

/// Reads a backup from its file's bytes.
pub fn parse(bytes: &[u8]) -> Result<Backup, RestoreError> {
    let b: Backup =
        serde_json::from_slice(bytes).map_err(|e| RestoreError::Format(e.to_string()))?;
    if b.format != FORMAT {
        return Err(RestoreError::Format(format!(
            "its format is {:?}",
            b.format
        )));
    }
    Ok(b)
}

/// Writes every record of `backup` into `store`; returns how many. Every value is checked
/// before the first is written, so a damaged backup writes nothing.
pub async fn restore(store: &dyn Store, backup: &Backup) -> Result<usize, RestoreError> {
    let mut values = Vec::with_capacity(backup.records.len());
    for r in &backup.records {
        let v = base64::engine::general_purpose::STANDARD
            .decode(&r.value)
            .map_err(|e| RestoreError::Damaged {
                key: r.key.clone(),
                reason: e.to_string(),
            })?;
        values.push((r.key.as_str(), v));
    }
    for (key, value) in values {
        store.put(key, value, None).await?;
    }
    Ok(backup.records.len())
}
