//! The state store: one trait every role talks to, and its backends.
//!
//! This crate owns the key-value contract of DESIGN.md (get with content hash and revision, get
//! the hash alone, whole-token prefix lists, put, delete, compare-and-swap on revision, watch a
//! prefix from a revision, leases whose keys vanish on expiry) and the embedded backend built on
//! redb, and the etcd backend for clusters (`etcd/`), and the one way to follow a prefix (`follow.rs`). It knows nothing of apps, users or instances beyond typed JSON helpers; the meaning of
//! keys belongs to `warden-core`.
//!
//! Values may hold password hashes; this crate never logs values, only keys and revisions.
#![forbid(unsafe_code)]

use std::time::Duration;

use async_trait::async_trait;
use serde::{de::DeserializeOwned, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

pub mod backup;
pub mod embedded;
pub mod etcd;
pub mod follow;

pub use embedded::EmbeddedStore;
pub use etcd::{EtcdOptions, EtcdStore, EtcdTls};
pub use follow::{Follower, Update};

/// A global, monotonically increasing write counter. Every put or delete gets the next one.
pub type Revision = u64;
/// A lease handle. Keys written under a lease are deleted when it expires or is revoked.
pub type LeaseId = u64;
/// SHA-256 of a value, for cheap change detection.
pub type Hash = [u8; 32];

/// The SHA-256 of `value`, as stored beside every entry.
pub fn content_hash(value: &[u8]) -> Hash {
    Sha256::digest(value).into()
}

/// One stored key with its value and metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key.
    pub key: String,
    /// The value bytes.
    pub value: Vec<u8>,
    /// SHA-256 of `value`.
    pub hash: Hash,
    /// Revision that created the key (kept across updates).
    pub create_revision: Revision,
    /// Revision of the last write to the key; the token for compare-and-swap.
    pub mod_revision: Revision,
    /// Lease the key is attached to, if any.
    pub lease: Option<LeaseId>,
}

/// A consistent snapshot of the keys under a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// Entries in key order.
    pub entries: Vec<Entry>,
    /// Store revision of the snapshot: watch from `revision + 1` to see every later change.
    pub revision: Revision,
    /// Keys under the prefix whose records are damaged beyond reading, with why: left out of
    /// `entries`, so that one never hides the others.
    pub damaged: Vec<(String, String)>,
}

/// What happened to a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// The key was written; the new value.
    Put(Vec<u8>),
    /// The key was deleted (explicitly or by lease expiry).
    Delete,
}

/// One change seen by a watcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Revision of the change.
    pub revision: Revision,
    /// Key changed.
    pub key: String,
    /// The change.
    pub kind: EventKind,
}

/// Outcome of a compare-and-swap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CasOutcome {
    /// The expectation held and the write happened at this revision.
    Done(Revision),
    /// The key's mod revision was not the expected one (`None`: the key is absent).
    Conflict {
        /// The key's current mod revision.
        current: Option<Revision>,
    },
}

/// Store failures. Messages name what failed and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The data file could not be opened.
    #[error("cannot open store file {path}: {reason}")]
    Open {
        /// File path.
        path: String,
        /// What went wrong, with advice.
        reason: String,
    },
    /// The engine failed to read or write.
    #[error("store {op} failed: {reason}")]
    Engine {
        /// Operation that failed.
        op: &'static str,
        /// Engine message.
        reason: String,
    },
    /// A record does not have the expected layout.
    #[error("store record {key:?} is damaged: {reason}")]
    Corrupt {
        /// Key of the record.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A value did not decode as the expected JSON type.
    #[error("store value at {key:?} is not valid: {reason}")]
    Decode {
        /// Key of the record.
        key: String,
        /// Decoder message.
        reason: String,
    },
    /// The lease does not exist (never granted, expired or revoked).
    #[error("lease {0:x} does not exist (it expired or was revoked); grant a new one")]
    LeaseNotFound(LeaseId),
    /// A watch asked for history the store no longer keeps.
    #[error("revision {requested} has been compacted (oldest kept is {oldest}); list again and watch from the listing's revision")]
    Compacted {
        /// Revision asked for.
        requested: Revision,
        /// Oldest revision still available.
        oldest: Revision,
    },
    /// The disk holding the store is full: nothing can be written until space is freed.
    /// Writes resume by themselves once it is; nothing acknowledged is lost.
    #[error("the store cannot write: the disk holding it is full ({reason}); free space on it and writes resume by themselves")]
    NoSpace {
        /// The engine's message.
        reason: String,
    },
    /// The store has shut down.
    #[error("the store is closed")]
    Closed,
    /// The store address is not understood.
    #[error("unknown store {0:?}; use \"embedded\" or \"etcd://HOST:PORT[,HOST:PORT...]\"")]
    UnknownBackend(String),
}

/// A stream of changes under a prefix, in revision order.
pub struct Watch {
    rx: mpsc::Receiver<Result<Event, StoreError>>,
}

// === impl Watch ===

impl Watch {
    /// Wraps a channel fed by a backend.
    pub fn from_channel(rx: mpsc::Receiver<Result<Event, StoreError>>) -> Self {
        Self { rx }
    }

    /// The next change; `None` when the store closed. An `Err` ends the watch: the caller must
    /// list again and start a new watch.
    pub async fn next(&mut self) -> Option<Result<Event, StoreError>> {
        self.rx.recv().await
    }
}

/// The key-value contract every backend fulfils (checked by the `warden-store-conformance`
/// crate, run against each backend by its tests).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The entry at `key`.
    async fn get(&self, key: &str) -> Result<Option<Entry>, StoreError>;
    /// The content hash and mod revision at `key`, without the value.
    async fn get_hash(&self, key: &str) -> Result<Option<(Hash, Revision)>, StoreError>;
    /// Every entry whose key lies under `prefix` by whole `/`-separated tokens.
    async fn list(&self, prefix: &str) -> Result<Listing, StoreError>;
    /// Every entry whose key begins with the text `start`, tokens or not: for names joined
    /// within one token, as `apps/demo~worker/spec` joins an app and its process type, which a
    /// listing by whole tokens can only find by reading every app.
    async fn list_text_prefix(&self, start: &str) -> Result<Listing, StoreError>;
    /// Writes `value` at `key`, optionally attached to a lease. Durable when it returns.
    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError>;
    /// Deletes `key`; the revision of the delete, or `None` when the key was absent.
    async fn delete(&self, key: &str) -> Result<Option<Revision>, StoreError>;
    /// Writes (`Some`) or deletes (`None`) `key` only if its mod revision is `expected`
    /// (`None`: only if the key is absent).
    async fn compare_and_swap(
        &self,
        key: &str,
        expected: Option<Revision>,
        value: Option<Vec<u8>>,
        lease: Option<LeaseId>,
    ) -> Result<CasOutcome, StoreError>;
    /// Changes under `prefix` with revision >= `from` (0: from now on).
    async fn watch(&self, prefix: &str, from: Revision) -> Result<Watch, StoreError>;
    /// A new lease that expires `ttl` after its last keep-alive.
    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError>;
    /// Restarts the lease's TTL.
    async fn keep_alive(&self, lease: LeaseId) -> Result<(), StoreError>;
    /// Ends the lease now, deleting its keys.
    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), StoreError>;
    /// Whether writes work now: `Err` says why not (a full disk, an I/O error), until a write
    /// succeeds again.
    fn ready(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Reads `key` as JSON of type `T`, with its mod revision.
pub async fn get_json<T: DeserializeOwned>(
    store: &dyn Store,
    key: &str,
) -> Result<Option<(T, Revision)>, StoreError> {
    match store.get(key).await? {
        None => Ok(None),
        Some(e) => Ok(Some((decode(&e.key, &e.value)?, e.mod_revision))),
    }
}

/// Writes `value` as JSON at `key`.
pub async fn put_json<T: Serialize>(
    store: &dyn Store,
    key: &str,
    value: &T,
    lease: Option<LeaseId>,
) -> Result<Revision, StoreError> {
    let bytes = serde_json::to_vec(value).map_err(|e| StoreError::Decode {
        key: key.to_owned(),
        reason: e.to_string(),
    })?;
    store.put(key, bytes, lease).await
}

/// Decodes a JSON value read from `key`.
pub fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Decode {
        key: key.to_owned(),
        reason: e.to_string(),
    })
}

/// A store backend, as `warden up --store` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// The embedded redb store, in the data directory.
    Embedded,
    /// An etcd cluster.
    Etcd(EtcdOptions),
}

impl std::str::FromStr for Backend {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, StoreError> {
        match s {
            "embedded" => Ok(Self::Embedded),
            s if s.starts_with("etcd://") => EtcdOptions::parse(s)
                .map(Self::Etcd)
                .ok_or_else(|| StoreError::UnknownBackend(s.to_owned())),
            other => Err(StoreError::UnknownBackend(other.to_owned())),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Embedded => f.write_str("embedded"),
            Self::Etcd(o) => write!(f, "etcd://{}", o.endpoints.join(",")),
        }
    }
}

/// Opens the store `backend` names (`Embedded` keeps its file in `data_dir`).
pub async fn open(
    backend: &Backend,
    data_dir: &std::path::Path,
) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    match backend {
        Backend::Embedded => Ok(std::sync::Arc::new(EmbeddedStore::open(
            &data_dir.join("store.redb"),
        )?)),
        Backend::Etcd(o) => Ok(std::sync::Arc::new(EtcdStore::connect(o).await?)),
    }
}
