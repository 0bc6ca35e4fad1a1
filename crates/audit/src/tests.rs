//! The chain against every way a log can be tampered with: verify passes on an untouched log and
//! names the spot after a deleted record, an edited one, two swapped, a truncated tail and a
//! whole file replaced by a fresh valid chain (caught by the anchor); a torn last line at start
//! is cut and recorded as a gap.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use warden_core::audit::{Audit, Event, Query, Verified};
use warden_store::Store;

use super::*;

const KEY: [u8; 32] = [7; 32];

fn change(target: &str) -> Event {
    Event::Change {
        actor: "admin token".into(),
        method: "POST".into(),
        route: "/v1/apps".into(),
        target: Some(target.into()),
        outcome: "pending".into(),
        before: None,
        after: None,
    }
}

async fn store(dir: &Path) -> Arc<dyn Store> {
    warden_store::open(&warden_store::Backend::Embedded, dir)
        .await
        .unwrap()
}

/// A closed log of `n` changes (plus started and stopped) in `dir/audit`, anchored in `store`.
async fn written(dir: &Path, store: &Arc<dyn Store>, n: usize) -> PathBuf {
    let audit = dir.join("audit");
    let log = Log::open(&audit, "n1", KEY, store.clone(), Settings::default()).unwrap();
    for i in 0..n {
        log.record_durable(change(&format!("app{i}")))
            .await
            .unwrap();
    }
    log.close().await;
    audit
}

fn segment(audit: &Path) -> PathBuf {
    segments::list(audit).unwrap().pop().unwrap()
}

fn edit_lines(path: &Path, f: impl FnOnce(&mut Vec<String>)) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    f(&mut lines);
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// Opens and closes the log in `audit` again; the one `gap` record it holds, in words.
async fn reopened_gap(audit: &Path, s: &Arc<dyn Store>) -> String {
    let log = Log::open(audit, "n1", KEY, s.clone(), Settings::default()).unwrap();
    log.close().await;
    let gaps = read(
        audit,
        &Query {
            kind: Some("gap".into()),
            ..Query::default()
        },
    )
    .unwrap();
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    let Event::Gap { why, .. } = &gaps[0].event else {
        unreachable!()
    };
    why.clone()
}

async fn check(audit: &Path, store: &Arc<dyn Store>) -> Verified {
    verify_dir(audit, "n1", &KEY, &**store).await.unwrap()
}

fn what(v: &Verified) -> (&str, u64) {
    let p = v.problem.as_ref().expect("verify must find a problem");
    assert!(!v.ok);
    (p.what.as_str(), p.line)
}

#[tokio::test]
async fn an_untouched_log_verifies_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    let audit = written(dir.path(), &s, 5).await;
    let v = check(&audit, &s).await;
    assert!(v.ok, "{v:?}");
    assert_eq!((v.records, v.head_seq, v.anchor_seq), (7, 7, Some(7)));
    let q = Query {
        kind: Some("change".into()),
        ..Query::default()
    };
    let read = read(&audit, &q).unwrap();
    assert_eq!(read.len(), 5);
    assert_eq!(read[2].event, change("app2"));
}

#[tokio::test]
async fn a_deleted_record_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    let audit = written(dir.path(), &s, 5).await;
    edit_lines(&segment(&audit), |l| {
        l.remove(3);
    });
    assert_eq!(what(&check(&audit, &s).await), ("missing", 4));
}

#[tokio::test]
async fn an_edited_record_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    let audit = written(dir.path(), &s, 5).await;
    edit_lines(&segment(&audit), |l| l[2] = l[2].replace("app1", "appX"));
    assert_eq!(what(&check(&audit, &s).await), ("edited", 3));
}

#[tokio::test]
async fn two_swapped_records_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    let audit = written(dir.path(), &s, 5).await;
    edit_lines(&segment(&audit), |l| l.swap(2, 3));
    assert_eq!(what(&check(&audit, &s).await), ("reordered", 3));
}

#[tokio::test]
async fn a_truncated_tail_is_named_by_the_anchor() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    let audit = written(dir.path(), &s, 5).await;
    // Whole lines cut: the chain left is valid, only the anchor knows more was written.
    edit_lines(&segment(&audit), |l| l.truncate(4));
    let v = check(&audit, &s).await;
    assert_eq!(what(&v).0, "truncated tail");
    assert_eq!(v.problem.unwrap().seq, Some(5));
}

#[tokio::test]
async fn a_file_replaced_by_a_fresh_valid_chain_is_caught_by_the_anchor() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    let audit = written(dir.path(), &s, 5).await;
    // Another log, just as long and itself valid, written elsewhere and copied over.
    let other = tempfile::tempdir().unwrap();
    let s2 = store(other.path()).await;
    let forged = written(other.path(), &s2, 5).await;
    assert!(check(&forged, &s2).await.ok);
    std::fs::copy(segment(&forged), segment(&audit)).unwrap();
    let v = check(&audit, &s).await;
    assert_eq!(what(&v), ("anchor", 7));
}

#[tokio::test]
async fn a_torn_last_line_is_cut_at_start_and_recorded_as_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    let audit = written(dir.path(), &s, 2).await;
    let seg = segment(&audit);
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes.extend_from_slice(b"{\"seq\":5,\"at_ms\":1,\"no");
    std::fs::write(&seg, bytes).unwrap();
    let why = reopened_gap(&audit, &s).await;
    assert!(why.contains("torn"), "{why}");
    assert!(check(&audit, &s).await.ok);
}

#[tokio::test]
async fn a_run_that_did_not_stop_is_recorded_as_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    let audit = written(dir.path(), &s, 1).await;
    // The stop record cut, as if the process had been killed before it.
    edit_lines(&segment(&audit), |l| {
        l.pop();
    });
    let why = reopened_gap(&audit, &s).await;
    assert!(why.contains("without stopping at seq 2"), "{why}");
}

#[tokio::test]
async fn a_log_without_its_anchor_in_the_store_fails() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    let audit = written(dir.path(), &s, 1).await;
    s.delete(&warden_core::keys::audit_anchor("n1"))
        .await
        .unwrap();
    assert_eq!(what(&check(&audit, &s).await).0, "anchor");
}

#[tokio::test]
async fn rotation_and_retention_drop_old_segments_and_verify_starts_where_they_end() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    let audit = dir.path().join("audit");
    let small = Settings {
        segment_bytes: 2_000,
        retain_bytes: 4_000,
        anchor_every: std::time::Duration::from_millis(1),
        ..Settings::default()
    };
    let log = Log::open(&audit, "n1", KEY, s.clone(), small).unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let anchors = tokio::spawn(log.anchor_task(stopped));
    for i in 0..100 {
        log.record_durable(change(&format!("app{i}")))
            .await
            .unwrap();
        // Anchors move while records are written, and retention follows them.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let _ = stop.send(true);
    anchors.await.unwrap();
    log.close().await;
    let segs = segments::list(&audit).unwrap();
    assert!(segs.len() >= 2, "rotated: {segs:?}");
    let first = segs[0].file_name().unwrap().to_string_lossy().into_owned();
    assert_ne!(first, segments::name(1), "the oldest segments were dropped");
    let pruned = read(
        &audit,
        &Query {
            kind: Some("pruned".into()),
            ..Query::default()
        },
    )
    .unwrap();
    assert!(!pruned.is_empty(), "each drop is recorded");
    let v = check(&audit, &s).await;
    assert!(v.ok, "{v:?}");
    // A whole segment deleted by hand is no drop by retention: no `pruned` record explains it.
    std::fs::remove_file(&segs[0]).unwrap();
    assert_eq!(what(&check(&audit, &s).await).0, "missing");
}

#[tokio::test]
async fn an_overflowing_queue_never_blocks_and_what_it_dropped_is_a_gap_with_its_count() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    let audit = dir.path().join("audit");
    let tiny = Settings {
        queue: 4,
        required: true,
        ..Settings::default()
    };
    let log = Log::open(&audit, "n1", KEY, s.clone(), tiny).unwrap();
    // The writer held with a probe taken: the queue is empty, and stays so but for the burst.
    let hold = log.shared.hold.lock().unwrap();
    log.record(change("probe"));
    for _ in 0..1000 {
        if log.shared.held.load(Ordering::Acquire) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        log.shared.held.load(Ordering::Acquire),
        "the writer took the probe"
    );
    assert!(log.health().is_ok() && log.refusing().is_none());
    // 4 fit in the queue, 10 do not; a `record` that waited for room would never return here
    // (the writer is held), so the burst runs on a thread the test waits for, bounded.
    let burst = {
        let log = log.clone();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for i in 0..14 {
                log.record(change(&format!("burst{i}")));
            }
            let _ = done_tx.send(());
        });
        done_rx.recv_timeout(std::time::Duration::from_secs(30))
    };
    assert!(burst.is_ok(), "record() blocked on a full queue");
    assert_eq!(log.stats().lost, 10);
    let alarm = log.health().expect_err("an overflow is an alarm");
    assert!(alarm.contains("overflowed"), "{alarm}");
    let refusal = log
        .refusing()
        .expect("a required log refuses while records are lost");
    assert!(refusal.contains("the audit queue was full"), "{refusal}");
    drop(hold);
    log.close().await;
    assert!(
        log.refusing().is_none(),
        "the gap is written: access resumes"
    );
    let gaps = read(
        &audit,
        &Query {
            kind: Some("gap".into()),
            ..Query::default()
        },
    )
    .unwrap();
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    let Event::Gap { why, lost } = &gaps[0].event else {
        unreachable!()
    };
    assert_eq!(*lost, Some(10), "{why}");
    assert!(why.contains("queue was full"), "{why}");
    let written = read(
        &audit,
        &Query {
            kind: Some("change".into()),
            ..Query::default()
        },
    )
    .unwrap();
    assert_eq!(written.len(), 5, "the probe and the 4 queued: {written:?}");
    assert!(check(&audit, &s).await.ok);
}

#[tokio::test]
async fn a_required_log_that_stopped_writing_refuses_until_its_gap_is_written_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    let audit = dir.path().join("audit");
    let required = Settings {
        required: true,
        ..Settings::default()
    };
    let log = Log::open(&audit, "n1", KEY, s.clone(), required).unwrap();
    // As a failed write leaves it: records counted, nothing queued after them.
    log.shared
        .lost(3, "cannot write the segment: No space left on device");
    log.shared.set_error(Some(
        "cannot write the segment: No space left on device".into(),
    ));
    let refusal = log
        .refusing()
        .expect("refuses while records are not in the log");
    assert!(refusal.contains("No space left"), "{refusal}");
    assert!(refusal.contains(&audit.display().to_string()), "{refusal}");
    // Nothing more is recorded: the writer retries by itself.
    for _ in 0..1000 {
        if log.refusing().is_none() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        log.refusing().is_none(),
        "the writer never wrote the gap by itself"
    );
    assert!(log.health().is_ok());
    log.close().await;
    let gaps = read(
        &audit,
        &Query {
            kind: Some("gap".into()),
            ..Query::default()
        },
    )
    .unwrap();
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    assert!(matches!(gaps[0].event, Event::Gap { lost: Some(3), .. }));
}

/// Whoever can write the log's files but not the store puts a fresh chain in its place that
/// starts far past the anchored record, with a forged `pruned` record to explain the start:
/// retention never drops the anchored record, so verify names the replacement.
#[tokio::test]
async fn a_replacing_chain_that_starts_after_the_anchor_fails_whatever_it_says_was_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    let audit = written(dir.path(), &s, 3).await;
    for seg in segments::list(&audit).unwrap() {
        std::fs::remove_file(seg).unwrap();
    }
    let first = 1_000_000_u64;
    let dropped = "ab".repeat(32);
    let pruned = Event::Pruned {
        up_to_seq: first - 1,
        hash: dropped.clone(),
    };
    let (l1, h1) = chain::seal(first, 1, "n1", &pruned, &dropped);
    let (l2, _) = chain::seal(first + 1, 2, "n1", &change("forged"), &h1);
    std::fs::write(audit.join(segments::name(first)), format!("{l1}\n{l2}\n")).unwrap();
    let v = check(&audit, &s).await;
    assert!(!v.ok, "a replaced log passed: {v:?}");
    assert_eq!(what(&v).0, "anchor", "{v:?}");
}

/// Retention keeps every segment from the one holding the anchored record on: with no anchor
/// yet, nothing is dropped, however far past its size the log is (and verify passes).
#[tokio::test]
async fn retention_never_drops_what_is_not_anchored_yet() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path()).await;
    let audit = dir.path().join("audit");
    let small = Settings {
        segment_bytes: 2_000,
        retain_bytes: 4_000,
        ..Settings::default()
    };
    let log = Log::open(&audit, "n1", KEY, s.clone(), small).unwrap();
    for i in 0..100 {
        log.record_durable(change(&format!("app{i}")))
            .await
            .unwrap();
    }
    log.close().await;
    let segs = segments::list(&audit).unwrap();
    assert!(segs.len() > 3, "rotated: {segs:?}");
    assert_eq!(
        segs[0].file_name().unwrap().to_string_lossy(),
        segments::name(1),
        "a segment after the (absent) anchor was dropped"
    );
    assert!(check(&audit, &s).await.ok);
}
