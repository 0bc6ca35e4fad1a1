//! The record written behind a request (`publish_behind`) when the store misbehaves.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use warden_core::keys;
use warden_store::{
    CasOutcome, EmbeddedStore, Entry, Hash, LeaseId, Listing, Revision, Store, StoreError, Watch,
};

use super::tests::{add_running, lifecycle_on, record};
use crate::sync::lock;

/// A store whose puts of instance records, while `failing`, are written and then answered with
/// an error, as a put that timed out after it landed is.
struct LandsButFails {
    inner: EmbeddedStore,
    failing: AtomicBool,
    failed: AtomicUsize,
}

#[async_trait]
impl Store for LandsButFails {
    async fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        self.inner.get(key).await
    }
    async fn get_hash(&self, key: &str) -> Result<Option<(Hash, Revision)>, StoreError> {
        self.inner.get_hash(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        self.inner.list(prefix).await
    }
    async fn list_text_prefix(&self, start: &str) -> Result<Listing, StoreError> {
        self.inner.list_text_prefix(start).await
    }
    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError> {
        let rev = self.inner.put(key, value, lease).await?;
        if key.starts_with("instances/") && self.failing.load(Ordering::SeqCst) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Engine {
                op: "put",
                reason: "timed out (injected by the test, after the write landed)".into(),
            });
        }
        Ok(rev)
    }
    async fn delete(&self, key: &str) -> Result<Option<Revision>, StoreError> {
        self.inner.delete(key).await
    }
    async fn compare_and_swap(
        &self,
        key: &str,
        expected: Option<Revision>,
        value: Option<Vec<u8>>,
        lease: Option<LeaseId>,
    ) -> Result<CasOutcome, StoreError> {
        self.inner
            .compare_and_swap(key, expected, value, lease)
            .await
    }
    async fn watch(&self, prefix: &str, from: Revision) -> Result<Watch, StoreError> {
        self.inner.watch(prefix, from).await
    }
    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        self.inner.grant_lease(ttl).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.inner.keep_alive(lease).await
    }
    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.inner.revoke_lease(lease).await
    }
}

#[test]
fn a_record_whose_failed_write_landed_after_its_instance_ended_is_removed() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(LandsButFails {
        inner: EmbeddedStore::open(&dir.path().join("store.redb")).unwrap(),
        failing: AtomicBool::new(true),
        failed: AtomicUsize::new(0),
    });
    let life = lifecycle_on(&rt, dir.path(), store.clone());
    let r = record("i1");
    let key = keys::instance(&r.app, &r.id);
    add_running(&life, &r);
    rt.spawn(life.clone().publish_behind(r.id.clone()));
    rt.block_on(async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while store.failed.load(Ordering::SeqCst) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "no write was tried");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The instance ends (its monitor removed the record, which was not there yet) while
        // the writer waits to try again; the write that "failed" is in the store.
        lock(&life.table).running.remove(&r.id);
        assert!(store.get(&key).await.unwrap().is_some());
        while store.get(&key).await.unwrap().is_some() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the record of an instance gone stayed in the store"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
}
