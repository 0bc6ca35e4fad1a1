//! The conformance suite against the embedded backend.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use warden_store::{EmbeddedStore, Store};

/// A store in a fresh directory under the system temp dir. The directory is left behind on
/// purpose: conformance checks outlive any guard we could hand back through `Arc<dyn Store>`.
async fn fresh() -> Arc<dyn Store> {
    let dir = tempfile::Builder::new()
        .prefix("warden-store-test")
        .tempdir()
        .unwrap()
        .keep();
    Arc::new(EmbeddedStore::open(&dir.join("store.redb")).unwrap())
}

warden_store_conformance::store_conformance!(fresh());
