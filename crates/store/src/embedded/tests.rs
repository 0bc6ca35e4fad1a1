#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use redb::ReadableTable;

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

#[tokio::test]
async fn a_backup_restores_every_durable_record_byte_for_byte_and_no_leased_one() {
    let dir = tempfile::tempdir().unwrap();
    let a = EmbeddedStore::open(&dir.path().join("a.redb")).unwrap();
    a.put("things/x", b"{\"name\":\"x\"}".to_vec(), None)
        .await
        .unwrap();
    a.put("things/u", b" [1, \"\\u00e9\"] ".to_vec(), None)
        .await
        .unwrap();
    let lease = a
        .grant_lease(std::time::Duration::from_secs(60))
        .await
        .unwrap();
    a.put("sessions/s", b"now".to_vec(), Some(lease))
        .await
        .unwrap();
    let backup = crate::backup::snapshot(&a, b"key").await.unwrap();
    let text = serde_json::to_vec(&backup).unwrap();
    let b = EmbeddedStore::open(&dir.path().join("b.redb")).unwrap();
    let parsed = crate::backup::parse(&text).unwrap();
    crate::backup::verify(&parsed, Some(b"key")).unwrap();
    assert!(crate::backup::verify(&parsed, Some(b"other key")).is_err());
    assert!(crate::backup::verify(&parsed, None).is_err());
    assert_eq!(crate::backup::restore(&b, &parsed).await.unwrap(), 2);
    assert_eq!(
        b.get("things/u").await.unwrap().unwrap().value,
        b" [1, \"\\u00e9\"] ".to_vec()
    );
    assert!(b.get("things/x").await.unwrap().is_some());
    assert!(b.get("sessions/s").await.unwrap().is_none());
    assert!(crate::backup::parse(b"{\"format\":\"other\",\"revision\":1,\"records\":[]}").is_err());
    let mut damaged = parsed.clone();
    damaged.records[0].value = "!!".into();
    assert!(crate::backup::verify(&damaged, Some(b"key")).is_err());
    let c = EmbeddedStore::open(&dir.path().join("c.redb")).unwrap();
    assert!(crate::backup::restore(&c, &damaged).await.is_err());
    assert!(
        c.list("").await.unwrap().entries.is_empty(),
        "a damaged backup writes nothing"
    );
}

#[tokio::test]
async fn a_record_damaged_below_the_codec_is_listed_as_damaged_and_hides_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("s.redb")).unwrap();
    store.put("k/a", b"1".to_vec(), None).await.unwrap();
    store.put("k/c", b"3".to_vec(), None).await.unwrap();
    {
        // Written past the writer, as a bit flip would leave it.
        let db = store.shared.db().unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(KV)
            .unwrap()
            .insert("k/b", &b"\x00not a record"[..])
            .unwrap();
        txn.commit().unwrap();
    }
    let listing = store.list("k").await.unwrap();
    let keys: Vec<&str> = listing.entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["k/a", "k/c"]);
    assert_eq!(listing.damaged.len(), 1);
    assert_eq!(listing.damaged[0].0, "k/b");
}

/// A file as a warden before record checksums wrote it: format-1 records, no `format` row.
fn write_format_1(path: &std::path::Path, records: &[(&str, &[u8])]) {
    let db = redb::Database::create(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut kv = txn.open_table(KV).unwrap();
        let mut log = txn.open_table(LOG).unwrap();
        for (rev, (key, value)) in (1u64..).zip(records) {
            let mut rec = Vec::new();
            for n in [rev, rev, 0] {
                rec.extend_from_slice(&n.to_le_bytes());
            }
            rec.extend_from_slice(&crate::content_hash(value));
            rec.extend_from_slice(value);
            kv.insert(*key, rec.as_slice()).unwrap();
            let mut ev = vec![1u8];
            ev.extend_from_slice(&(key.len() as u32).to_le_bytes());
            ev.extend_from_slice(key.as_bytes());
            ev.extend_from_slice(value);
            log.insert(rev, ev.as_slice()).unwrap();
        }
        let mut meta = txn.open_table(META).unwrap();
        meta.insert("revision", records.len() as u64).unwrap();
    }
    txn.commit().unwrap();
}

#[tokio::test]
async fn a_store_written_before_checksums_opens_and_is_sealed_except_its_damaged_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    write_format_1(
        &path,
        &[("apps/a/spec", b"{\"a\":1}"), ("users/u", b"{\"u\":2}")],
    );
    // One record whose value no longer matches its hash: it must not be sealed as sound.
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut kv = txn.open_table(KV).unwrap();
            let mut rec = kv.get("users/u").unwrap().unwrap().value().to_vec();
            let last = rec.len() - 2;
            rec[last] ^= 0x01;
            kv.insert("users/u", rec.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let report = verify::prove(&path).unwrap();
    assert_eq!(report.records, 2);
    assert_eq!(report.damaged.len(), 1, "{report:?}");
    assert_eq!(report.damaged[0].0, "users/u");

    let store = EmbeddedStore::open(&path).unwrap();
    let a = store.get("apps/a/spec").await.unwrap().unwrap();
    assert_eq!((a.value.as_slice(), a.mod_revision), (&b"{\"a\":1}"[..], 1));
    assert!(
        store.get("users/u").await.is_err(),
        "the damaged record is not served"
    );
    assert!(
        store
            .put("apps/b/spec", b"{}".to_vec(), None)
            .await
            .unwrap()
            > 2
    );
    drop(store);
    // Only the one damaged record: the log entries were sealed too.
    let report = verify::prove(&path).unwrap();
    assert_eq!(report.records, 3);
    assert_eq!(report.damaged.len(), 1, "{report:?}");
}

/// The next event of `w`, failing the test if none comes (a hang, not a slow machine: 30 s).
async fn next(w: &mut crate::Watch) -> crate::Event {
    tokio::time::timeout(Duration::from_secs(30), w.next())
        .await
        .expect("a watch event within 30 s")
        .expect("the watch is open")
        .expect("an event, not an error")
}

#[tokio::test]
async fn a_watcher_that_reads_nothing_for_a_while_gets_every_change_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("s.redb")).unwrap();
    let mut slow = store.watch("w", 0).await.unwrap();
    let mut other = store.watch("x", 0).await.unwrap();
    // Far more changes than the channel holds, in one commit and in many, while the watcher
    // reads none: it must fall back to the log and come back to live delivery.
    let keys: Vec<String> = (0..300u32).map(|i| format!("w/{i}")).collect();
    let puts = keys.iter().map(|k| store.put(k, vec![1], None));
    let mut revs: Vec<Revision> = futures_util::future::try_join_all(puts).await.unwrap();
    for i in 300..700u32 {
        revs.push(store.put(&format!("w/{i}"), vec![2], None).await.unwrap());
    }
    store.put("x/1", vec![], None).await.unwrap();
    for (i, rev) in revs.iter().enumerate() {
        let ev = next(&mut slow).await;
        assert_eq!((ev.revision, ev.key.as_str()), (*rev, &*format!("w/{i}")));
    }
    // Live again: the next change comes, and nothing twice before it.
    let last = store.put("w/last", vec![], None).await.unwrap();
    let ev = next(&mut slow).await;
    assert_eq!((ev.revision, ev.key.as_str()), (last, "w/last"));
    // A watcher of another prefix got only its own change.
    assert_eq!(next(&mut other).await.key, "x/1");
    assert!(futures_util::FutureExt::now_or_never(other.next()).is_none());
}

#[tokio::test]
async fn a_write_whose_caller_went_away_before_committing_is_committed_and_blocks_no_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(&dir.path().join("s.redb")).unwrap();
    // Polled once, the put is queued and its caller leads the next commit; dropped before it
    // commits, the lead must pass to the writer thread, or every later write waits forever.
    let first = store.put("k/gone", vec![1], None);
    assert!(futures_util::FutureExt::now_or_never(first).is_none());
    let later = tokio::time::timeout(Duration::from_secs(30), store.put("k/later", vec![2], None))
        .await
        .expect("a later write is answered, not stuck behind a caller that went away");
    later.unwrap();
    assert!(store.get("k/gone").await.unwrap().is_some());
}

#[test]
fn a_lagging_watcher_whose_runtime_shut_down_leaves_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(EmbeddedStore::open(&dir.path().join("s.redb")).unwrap());
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    main.block_on(store.put("w/0", vec![0], None)).unwrap();
    // The watcher lives on a runtime of its own; it starts behind, so its catch-up task is
    // spawned there, and that runtime goes before the task can run.
    let doomed = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let watch = doomed.block_on(store.watch("w", 1)).unwrap();
    assert_eq!(store.shared.watchers.len(), 1);
    drop(doomed);
    drop(watch);
    // The next commit finds its reader gone.
    main.block_on(store.put("w/1", vec![1], None)).unwrap();
    assert_eq!(
        store.shared.watchers.len(),
        0,
        "the dead watcher is still registered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_leads_the_commit_and_is_never_polled_again_blocks_no_write() {
    use std::future::Future;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(EmbeddedStore::open(&dir.path().join("s.redb")).unwrap());
    // Polled once: it queues its write, takes the lead and yields; then it is kept, never
    // polled again and never dropped.
    let mut stuck = Box::pin(store.put("k/stuck", vec![1], None));
    let waker = futures_util::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    assert!(stuck.as_mut().poll(&mut cx).is_pending());
    // Another write still commits (the bound only turns a hang into a failure).
    let other = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        store.put("k/other", vec![2], None),
    )
    .await;
    assert!(other.is_ok(), "a write waited behind a lead that never ran");
    other.unwrap().unwrap();
    // The stuck caller's own write was committed by whoever took over.
    assert!(store.get("k/stuck").await.unwrap().is_some());
    // Its void lead, dropped at last, disturbs no later write.
    drop(stuck);
    let later = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        store.put("k/later", vec![3], None),
    )
    .await;
    assert!(matches!(later, Ok(Ok(_))), "{later:?}");
}
