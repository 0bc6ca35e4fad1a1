//! The conformance suite against the etcd backend, on a real 3-member etcd cluster.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use warden_store::{EtcdOptions, EtcdStore, Store, StoreError};
use warden_test_support::etcd::EtcdCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_backend_passes_the_store_conformance_suite() {
    let cluster = EtcdCluster::start(3);
    let options = EtcdOptions::parse(&cluster.url()).unwrap();
    let store: Arc<dyn Store> = Arc::new(EtcdStore::connect(&options).await.unwrap());
    warden_store_conformance::run_all(store).await;
    drop(cluster);
}

async fn connect(cluster: &EtcdCluster) -> Arc<dyn Store> {
    let options = EtcdOptions::parse(&cluster.url()).unwrap();
    Arc::new(EtcdStore::connect(&options).await.unwrap())
}

/// One of three members killed in the middle of a stream of writes (and restarted later): every write is still
/// acknowledged (after failover), none of them is lost, and a watch opened before the kill
/// sees each of them once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_loses_no_acknowledged_write_and_no_watch_event() {
    let mut cluster = EtcdCluster::start(3);
    let store = connect(&cluster).await;
    let listing = store.list("loss").await.unwrap();
    let mut watch = store.watch("loss", listing.revision + 1).await.unwrap();
    let mut acknowledged = Vec::new();
    for i in 0..300u32 {
        if i == 100 {
            cluster.kill(0);
        }
        if i == 200 {
            cluster.restart(0);
        }
        let key = format!("loss/{i:03}");
        store
            .put(&key, i.to_le_bytes().to_vec(), None)
            .await
            .unwrap();
        acknowledged.push(key);
    }
    let listing = store.list("loss").await.unwrap();
    let kept: Vec<&str> = listing.entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        kept,
        acknowledged.iter().map(String::as_str).collect::<Vec<_>>()
    );
    let mut last = 0;
    for key in &acknowledged {
        let ev = tokio::time::timeout(std::time::Duration::from_secs(30), watch.next())
            .await
            .expect("a watch event within 30 s")
            .expect("watch open")
            .expect("the watch fails over instead of ending");
        assert_eq!(&ev.key, key);
        assert!(ev.revision > last);
        last = ev.revision;
    }
}

/// The store keeps etcd's history bounded by compacting it; a watch from a revision compacted
/// away ends with `Compacted`, so the watcher knows to list again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_compacted_revision_says_so() {
    let cluster = EtcdCluster::start(1);
    let options = EtcdOptions::parse(&cluster.url()).unwrap();
    let etcd = EtcdStore::connect(&options).await.unwrap();
    let first = etcd.put("c/a", b"1".to_vec(), None).await.unwrap();
    for i in 0..5u8 {
        etcd.put("c/a", vec![i], None).await.unwrap();
    }
    etcd.compact_history(2).await.unwrap();
    // Twice, as two nodes would: harmless.
    etcd.compact_history(2).await.unwrap();
    let store: Arc<dyn Store> = Arc::new(etcd);
    let outcome = match store.watch("c", first).await {
        Err(e) => Err(e),
        Ok(mut w) => w.next().await.unwrap(),
    };
    assert!(
        matches!(outcome, Err(StoreError::Compacted { .. })),
        "{outcome:?}"
    );
}

/// etcd compacts away the revisions a follower missed while its watch was down: it lists
/// again and delivers the difference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_lists_again_after_etcd_compacts_its_history() {
    let cluster = EtcdCluster::start(1);
    let options = EtcdOptions::parse(&cluster.url()).unwrap();
    let etcd = EtcdStore::connect(&options).await.unwrap();
    let store = connect(&cluster).await;
    warden_store_conformance::follower_lists_again_after_a_real_compaction(store, async move {
        etcd.compact_history(0).await.unwrap();
    })
    .await;
}

/// A listing larger than gRPC's default 4 MiB answer arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_past_four_mebibytes_arrives_whole() {
    let cluster = EtcdCluster::start(1);
    let store = connect(&cluster).await;
    for i in 0..6 {
        store
            .put(&format!("big/{i}"), vec![b'x'; 1024 * 1024], None)
            .await
            .unwrap();
    }
    let listing = store.list("big").await.unwrap();
    assert_eq!(listing.entries.len(), 6);
    assert!(listing.entries.iter().all(|e| e.value.len() == 1024 * 1024));
}
