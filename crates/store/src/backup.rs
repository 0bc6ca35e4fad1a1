//! Backups: a consistent snapshot of every durable record, sealed, and putting one back.
//!
//! A backup holds the records that outlive their writer (apps, users, the lattice, health
//! reports): keys attached to a lease (instances, nodes, sessions) describe processes and logins
//! of the moment and are left out, as a restart would drop them anyway. Values are kept byte for
//! byte (base64).
//!
//! A backup is sealed: `digest` is the SHA-256 of its revision and every key and value, `mac` an
//! HMAC-SHA256 of that digest under the backup key of the warden that took it (its data dir's
//! `backup-key`, which the operator keeps with the backups). [`verify`] checks both; a restore
//! also checks that every record decodes as its key says and names what its key names, before
//! the first is written.

use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::{Revision, Store, StoreError};

/// What a backup file says it is.
pub const FORMAT: &str = "warden-store-backup/2";
/// Backups written before they were sealed: restored only with `--force`.
pub const FORMAT_UNSEALED: &str = "warden-store-backup/1";

/// A snapshot of the store's durable records.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Backup {
    /// [`FORMAT`] (or [`FORMAT_UNSEALED`] for an old backup).
    pub format: String,
    /// The store revision the snapshot was taken at.
    pub revision: Revision,
    /// The records, in key order.
    pub records: Vec<Record>,
    /// `sha256:` and the hex SHA-256 of the format, revision and every key and value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// `hmac-sha256:` and the hex HMAC of the digest under the backup key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// One record of a backup.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
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
    /// The backup does not prove itself: no digest or MAC, or one that does not match.
    #[error("the backup does not prove itself: {0}")]
    Unverified(String),
    /// Records do not decode, or do not name what their key names.
    #[error("{} record(s) of the backup are damaged: {}", .0.len(), describe(.0))]
    Damaged(Vec<(String, String)>),
    /// The store refused a write.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn describe(damaged: &[(String, String)]) -> String {
    damaged
        .iter()
        .map(|(k, why)| format!("{k:?}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

// === impl Backup ===

impl Backup {
    /// The digest of the format, revision and every key and value, as `sha256:HEX`.
    pub fn compute_digest(&self) -> String {
        let mut h = Sha256::new();
        let mut field = |b: &[u8]| {
            h.update((b.len() as u64).to_le_bytes());
            h.update(b);
        };
        field(self.format.as_bytes());
        field(&self.revision.to_le_bytes());
        field(&(self.records.len() as u64).to_le_bytes());
        for r in &self.records {
            field(r.key.as_bytes());
            field(r.value.as_bytes());
        }
        format!("sha256:{}", hex(&h.finalize()))
    }

    /// Sets the digest and its MAC under `key`.
    pub fn seal(&mut self, key: &[u8]) {
        let digest = self.compute_digest();
        self.mac = Some(mac(key, &digest));
        self.digest = Some(digest);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn mac(key: &[u8], digest: &str) -> String {
    // HMAC takes a key of any length.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    m.update(digest.as_bytes());
    format!("hmac-sha256:{}", hex(&m.finalize().into_bytes()))
}

/// Checks that `backup` is whole (its digest) and was sealed under `key` (its MAC). `key` is
/// `None` when the operator has none to give: then the backup is unverified.
pub fn verify(backup: &Backup, key: Option<&[u8]>) -> Result<(), RestoreError> {
    let unverified = |s: &str| Err(RestoreError::Unverified(s.to_owned()));
    if backup.format == FORMAT_UNSEALED {
        return unverified("it was written before backups were sealed (format 1), so nothing shows whether it was changed");
    }
    let Some(digest) = &backup.digest else {
        return unverified("it has no digest");
    };
    if *digest != backup.compute_digest() {
        return unverified(
            "its records do not match its digest: it was damaged or edited after it was written",
        );
    }
    let Some(key) = key else {
        return unverified("no backup key was given to check its MAC with");
    };
    let sealed = backup.mac.as_deref().unwrap_or_default();
    let expected = mac(key, digest);
    if !bool::from(sealed.as_bytes().ct_eq(expected.as_bytes())) {
        return unverified("its MAC does not match the backup key: it was edited, or sealed by another warden's key");
    }
    Ok(())
}

/// A consistent snapshot of every record not attached to a lease, sealed under `key`.
pub async fn snapshot(store: &dyn Store, key: &[u8]) -> Result<Backup, StoreError> {
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
    let mut b = Backup {
        format: FORMAT.to_owned(),
        revision: listing.revision,
        records,
        digest: None,
        mac: None,
    };
    b.seal(key);
    Ok(b)
}

/// Reads a backup from its file's bytes.
pub fn parse(bytes: &[u8]) -> Result<Backup, RestoreError> {
    let b: Backup =
        serde_json::from_slice(bytes).map_err(|e| RestoreError::Format(e.to_string()))?;
    if b.format != FORMAT && b.format != FORMAT_UNSEALED {
        return Err(RestoreError::Format(format!(
            "its format is {:?}",
            b.format
        )));
    }
    Ok(b)
}

/// Every record of `backup`, decoded and checked: its value is base64 of a record that decodes
/// as its key says and names what its key names, and no key comes twice.
pub fn records(backup: &Backup) -> Result<Vec<(String, Vec<u8>)>, RestoreError> {
    let mut values = Vec::with_capacity(backup.records.len());
    let mut damaged = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for r in &backup.records {
        if !seen.insert(r.key.as_str()) {
            damaged.push((r.key.clone(), "the key comes twice".to_owned()));
            continue;
        }
        match base64::engine::general_purpose::STANDARD.decode(&r.value) {
            Err(e) => damaged.push((r.key.clone(), format!("its value is not base64: {e}"))),
            Ok(v) => match warden_core::model::check_record(&r.key, &v) {
                Err(e) => damaged.push((r.key.clone(), e.to_string())),
                Ok(()) => values.push((r.key.clone(), v)),
            },
        }
    }
    match damaged.is_empty() {
        true => Ok(values),
        false => Err(RestoreError::Damaged(damaged)),
    }
}

/// Writes every record of `backup` into `store`; returns how many. Every record is checked
/// ([`records`]) before the first is written, so a damaged backup writes nothing. The seal is
/// the caller's to [`verify`] first.
pub async fn restore(store: &dyn Store, backup: &Backup) -> Result<usize, RestoreError> {
    let values = records(backup)?;
    for (key, value) in &values {
        store.put(key, value.clone(), None).await?;
    }
    Ok(values.len())
}
