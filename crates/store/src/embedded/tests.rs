#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use super::*;

#[tokio::test]
async fn concurrent_writes_share_commits() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(EmbeddedStore::open(&dir.path().join("s.redb")).unwrap());
    let before = store.commits();
    // All 200 puts are queued before the writer can finish its first fsync, so they must be
    // committed in far fewer transactions than writes.
    let puts = (0..200u32).map(|i| {
        let s = store.clone();
        async move { s.put(&format!("k/{i}"), vec![1], None).await }
    });
    for r in futures_util::future::join_all(puts).await {
        r.unwrap();
    }
    let commits = store.commits() - before;
    assert!(
        commits < 100,
        "200 concurrent writes took {commits} commits"
    );
    assert_eq!(store.list("k").await.unwrap().entries.len(), 200);
}

#[tokio::test]
async fn data_and_revisions_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let rev = {
        let s = EmbeddedStore::open(&path).unwrap();
        s.put("a/b", b"kept".to_vec(), None).await.unwrap()
    };
    let s = EmbeddedStore::open(&path).unwrap();
    let e = s.get("a/b").await.unwrap().unwrap();
    assert_eq!((e.value.as_slice(), e.mod_revision), (&b"kept"[..], rev));
    assert!(
        s.put("a/c", vec![], None).await.unwrap() > rev,
        "revisions continue after reopen"
    );
}

#[test]
fn garbage_file_is_a_clear_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    std::fs::write(&path, vec![0x5a; 64 * 1024]).unwrap();
    let err = EmbeddedStore::open(&path)
        .err()
        .expect("garbage must not open");
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(matches!(err, StoreError::Open { .. }));
}

#[tokio::test]
async fn truncated_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    {
        let s = EmbeddedStore::open(&path).unwrap();
        for i in 0..200u32 {
            s.put(&format!("k/{i}"), vec![7; 1000], None).await.unwrap();
        }
    }
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len / 3).unwrap();
    drop(f);
    match EmbeddedStore::open(&path) {
        Err(e) => assert!(e.to_string().contains("store.redb"), "{e}"),
        // redb may repair a truncated tail; then every read must still answer without panicking.
        Ok(s) => {
            let _ = s.list("k").await;
        }
    }
}
