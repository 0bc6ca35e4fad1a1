//! The behaviour every [`Store`] backend must show, written once and run per backend. A test
//! crate, never shipped: a backend's integration tests use it as a dev-dependency.
//!
//! Each check takes a fresh store handle and works under its own random key prefix, so backends
//! that share one server (etcd) can run the checks side by side. Use [`store_conformance!`] in a
//! backend's tests to turn every check into a test.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use warden_store::{content_hash, CasOutcome, EventKind, Store, StoreError, Watch};

mod follow;
pub use follow::{
    follower_delivers_every_key_a_lease_held, follower_from_a_listing_goes_on_after_it,
    follower_lists_again_after_a_compaction_and_delivers_the_difference,
    follower_lists_again_after_a_real_compaction,
    follower_resumes_a_cut_watch_without_losing_the_gap, follower_resumes_inside_a_revision,
    follower_survives_a_failing_first_list_and_watch,
};

/// A random key prefix for one check.
fn scope(name: &str) -> String {
    format!("conf-{}/{name}", warden_core::id::short_id())
}

async fn next_event(w: &mut Watch) -> warden_store::Event {
    tokio::time::timeout(Duration::from_secs(30), w.next())
        .await
        .expect("a watch event within 30 s")
        .expect("watch open")
        .expect("watch event, not error")
}

pub async fn put_get_and_hash(s: Arc<dyn Store>) {
    let k = format!("{}/key", scope("put"));
    let r1 = s.put(&k, b"one".to_vec(), None).await.unwrap();
    let e = s.get(&k).await.unwrap().expect("entry after put");
    assert_eq!(e.value, b"one");
    assert_eq!(e.hash, content_hash(b"one"));
    assert_eq!((e.create_revision, e.mod_revision, e.lease), (r1, r1, None));
    let r2 = s.put(&k, b"two".to_vec(), None).await.unwrap();
    assert!(r2 > r1, "revisions grow: {r2} after {r1}");
    let e = s.get(&k).await.unwrap().unwrap();
    assert_eq!(
        (e.value.as_slice(), e.create_revision, e.mod_revision),
        (&b"two"[..], r1, r2)
    );
    assert_eq!(
        s.get_hash(&k).await.unwrap(),
        Some((content_hash(b"two"), r2))
    );
}

pub async fn missing_keys(s: Arc<dyn Store>) {
    let k = format!("{}/nothing", scope("missing"));
    assert_eq!(s.get(&k).await.unwrap(), None);
    assert_eq!(s.get_hash(&k).await.unwrap(), None);
    assert_eq!(s.delete(&k).await.unwrap(), None);
}

/// Puts each of `keys` under scope `p` (its own name as its value); what it returns reads a
/// listing's keys back without the scope.
async fn put_keys(
    s: &Arc<dyn Store>,
    p: &str,
    keys: &[&str],
) -> impl Fn(warden_store::Listing) -> Vec<String> {
    for k in keys {
        s.put(&format!("{p}/{k}"), k.as_bytes().to_vec(), None)
            .await
            .unwrap();
    }
    let skip = p.len() + 1;
    move |l: warden_store::Listing| {
        l.entries
            .into_iter()
            .map(|e| e.key[skip..].to_owned())
            .collect::<Vec<_>>()
    }
}

pub async fn prefix_lists_match_whole_tokens(s: Arc<dyn Store>) {
    let p = scope("prefix");
    let keys = put_keys(
        &s,
        &p,
        &[
            "apps/web",
            "apps/web/spec",
            "apps/web/releases/1",
            "apps/webshop/spec",
            "apps2/x",
        ],
    )
    .await;
    let web = s.list(&format!("{p}/apps/web")).await.unwrap();
    let last = web.revision;
    assert_eq!(
        keys(web),
        ["apps/web", "apps/web/releases/1", "apps/web/spec"]
    );
    assert_eq!(keys(s.list(&format!("{p}/apps/")).await.unwrap()).len(), 4);
    assert_eq!(keys(s.list(&format!("{p}/apps")).await.unwrap()).len(), 4);
    assert_eq!(keys(s.list(&format!("{p}/app")).await.unwrap()).len(), 0);
    let all = s.list(&p).await.unwrap();
    assert_eq!(all.entries.len(), 5);
    assert!(all.revision >= last);
}

pub async fn text_prefix_lists_match_text(s: Arc<dyn Store>) {
    let p = scope("text");
    let keys = put_keys(
        &s,
        &p,
        &[
            "apps/web/spec",
            "apps/web~clock/spec",
            "apps/web~worker/spec",
            "apps/web~worker/x/y",
            "apps/webshop~worker/spec",
            "apps/we~b/spec",
            "apps/web\u{7f}/spec",
        ],
    )
    .await;
    let web = s.list_text_prefix(&format!("{p}/apps/web~")).await.unwrap();
    assert!(web.revision > 0);
    assert_eq!(
        keys(web),
        [
            "apps/web~clock/spec",
            "apps/web~worker/spec",
            "apps/web~worker/x/y"
        ]
    );
    // Not trimmed or read by tokens: "apps/" is every key under it, and a text no key begins
    // with finds nothing.
    assert_eq!(
        keys(s.list_text_prefix(&format!("{p}/apps/")).await.unwrap()).len(),
        7
    );
    assert_eq!(
        keys(s.list_text_prefix(&format!("{p}/apps/web")).await.unwrap()).len(),
        6
    );
    assert!(keys(
        s.list_text_prefix(&format!("{p}/apps/web~x"))
            .await
            .unwrap()
    )
    .is_empty());
}

pub async fn delete_removes(s: Arc<dyn Store>) {
    let k = format!("{}/k", scope("delete"));
    let r1 = s.put(&k, b"v".to_vec(), None).await.unwrap();
    let r2 = s.delete(&k).await.unwrap().expect("deleted");
    assert!(r2 > r1);
    assert_eq!(s.get(&k).await.unwrap(), None);
}

pub async fn compare_and_swap(s: Arc<dyn Store>) {
    let k = format!("{}/k", scope("cas"));
    let CasOutcome::Done(r1) = s
        .compare_and_swap(&k, None, Some(b"a".to_vec()), None)
        .await
        .unwrap()
    else {
        panic!("create on absent key must succeed")
    };
    assert_eq!(
        s.compare_and_swap(&k, None, Some(b"b".to_vec()), None)
            .await
            .unwrap(),
        CasOutcome::Conflict { current: Some(r1) }
    );
    assert_eq!(
        s.compare_and_swap(&k, Some(r1 + 1000), Some(b"b".to_vec()), None)
            .await
            .unwrap(),
        CasOutcome::Conflict { current: Some(r1) }
    );
    assert_eq!(
        s.get(&k).await.unwrap().unwrap().value,
        b"a",
        "a failed CAS changes nothing"
    );
    let CasOutcome::Done(r2) = s
        .compare_and_swap(&k, Some(r1), Some(b"b".to_vec()), None)
        .await
        .unwrap()
    else {
        panic!("CAS with the current revision must succeed")
    };
    assert_eq!(s.get(&k).await.unwrap().unwrap().value, b"b");
    assert_eq!(
        s.compare_and_swap(&k, Some(r1), None, None).await.unwrap(),
        CasOutcome::Conflict { current: Some(r2) }
    );
    assert!(matches!(
        s.compare_and_swap(&k, Some(r2), None, None).await.unwrap(),
        CasOutcome::Done(_)
    ));
    assert_eq!(s.get(&k).await.unwrap(), None);
}

pub async fn watch_replays_from_a_revision(s: Arc<dyn Store>) {
    let p = scope("watch");
    let first = s
        .put(&format!("{p}/in/a"), b"1".to_vec(), None)
        .await
        .unwrap();
    s.put(&format!("{p}/other"), b"x".to_vec(), None)
        .await
        .unwrap();
    s.put(&format!("{p}/in/b"), b"2".to_vec(), None)
        .await
        .unwrap();
    s.delete(&format!("{p}/in/a")).await.unwrap();
    let mut w = s.watch(&format!("{p}/in"), first).await.unwrap();
    let evs = [
        next_event(&mut w).await,
        next_event(&mut w).await,
        next_event(&mut w).await,
    ];
    assert_eq!(evs[0].revision, first);
    assert_eq!(
        (evs[0].key.ends_with("/in/a"), &evs[0].kind),
        (true, &EventKind::Put(b"1".to_vec()))
    );
    assert_eq!(
        (evs[1].key.ends_with("/in/b"), &evs[1].kind),
        (true, &EventKind::Put(b"2".to_vec()))
    );
    assert_eq!(
        (evs[2].key.ends_with("/in/a"), &evs[2].kind),
        (true, &EventKind::Delete)
    );
    assert!(evs[0].revision < evs[1].revision && evs[1].revision < evs[2].revision);
    // Live changes follow the replay, and other prefixes stay out.
    s.put(&format!("{p}/inside"), b"no".to_vec(), None)
        .await
        .unwrap();
    s.put(&format!("{p}/in/c"), b"3".to_vec(), None)
        .await
        .unwrap();
    let ev = next_event(&mut w).await;
    assert!(ev.key.ends_with("/in/c"), "got {}", ev.key);
}

pub async fn watch_from_listing_sees_every_later_change(s: Arc<dyn Store>) {
    let p = scope("listwatch");
    s.put(&format!("{p}/a"), b"1".to_vec(), None).await.unwrap();
    let listing = s.list(&p).await.unwrap();
    let mut w = s.watch(&p, listing.revision + 1).await.unwrap();
    for i in 0..20 {
        s.put(&format!("{p}/k{i}"), vec![i], None).await.unwrap();
    }
    for i in 0..20u8 {
        let ev = next_event(&mut w).await;
        assert_eq!(ev.kind, EventKind::Put(vec![i]));
    }
}

pub async fn leases_expire_and_watchers_see_it(s: Arc<dyn Store>) {
    let p = scope("lease");
    let mut w = s.watch(&p, 0).await.unwrap();
    // The unleased key first, so that nothing but the leased put and its read stand between
    // the grant and the lease's end: on a loaded machine (a CI run, three etcd members syncing
    // to one disk) each write can take a good part of a second.
    s.put(&format!("{p}/kept"), b"v".to_vec(), None)
        .await
        .unwrap();
    let lease = s.grant_lease(Duration::from_secs(3)).await.unwrap();
    s.put(&format!("{p}/owned"), b"v".to_vec(), Some(lease))
        .await
        .unwrap();
    assert_eq!(
        s.get(&format!("{p}/owned")).await.unwrap().unwrap().lease,
        Some(lease)
    );
    let kept = next_event(&mut w).await;
    assert!(kept.key.ends_with("/kept") && matches!(kept.kind, EventKind::Put(_)));
    let owned = next_event(&mut w).await;
    assert!(owned.key.ends_with("/owned") && matches!(owned.kind, EventKind::Put(_)));
    let gone = next_event(&mut w).await;
    assert_eq!(
        (gone.key.ends_with("/owned"), gone.kind),
        (true, EventKind::Delete)
    );
    assert_eq!(s.get(&format!("{p}/owned")).await.unwrap(), None);
    assert!(s.get(&format!("{p}/kept")).await.unwrap().is_some());
    assert!(matches!(
        s.keep_alive(lease).await,
        Err(StoreError::LeaseNotFound(_))
    ));
    assert!(matches!(
        s.put(&format!("{p}/late"), b"v".to_vec(), Some(lease))
            .await,
        Err(StoreError::LeaseNotFound(_))
    ));
}

pub async fn compare_and_swap_expecting_a_revision_of_an_absent_key_conflicts(s: Arc<dyn Store>) {
    let k = format!("{}/never", scope("cas-absent"));
    for value in [Some(b"v".to_vec()), None] {
        assert_eq!(
            s.compare_and_swap(&k, Some(1), value, None).await.unwrap(),
            CasOutcome::Conflict { current: None }
        );
    }
    assert_eq!(
        s.get(&k).await.unwrap(),
        None,
        "a failed CAS creates nothing"
    );
}

pub async fn keep_alive_extends_a_lease_past_its_ttl(s: Arc<dyn Store>) {
    let p = scope("keepalive");
    // Two seconds (etcd's floor here is one): a keep-alive every half second leaves room for
    // a slow one on a loaded machine, where a one-second lease with a renewal held up by three
    // members syncing to one disk was seen to end while kept alive.
    let ttl = Duration::from_secs(2);
    let lease = s.grant_lease(ttl).await.unwrap();
    let key = format!("{p}/held");
    s.put(&key, b"v".to_vec(), Some(lease)).await.unwrap();
    // Kept alive for three times its TTL: the key is still there.
    let until = std::time::Instant::now() + 3 * ttl;
    while std::time::Instant::now() < until {
        s.keep_alive(lease).await.unwrap();
        tokio::time::sleep(ttl / 4).await;
    }
    let listing = s.list(&p).await.unwrap();
    assert!(
        listing.entries.iter().any(|e| e.key == key),
        "a lease kept alive does not expire"
    );
    // Left alone, it ends.
    let mut w = s.watch(&p, listing.revision + 1).await.unwrap();
    loop {
        let ev = next_event(&mut w).await;
        if ev.key == key && ev.kind == EventKind::Delete {
            break;
        }
    }
    assert_eq!(s.get(&key).await.unwrap(), None);
}

pub async fn revoke_deletes_attached_keys(s: Arc<dyn Store>) {
    let p = scope("revoke");
    let lease = s.grant_lease(Duration::from_secs(60)).await.unwrap();
    s.put(&format!("{p}/a"), b"1".to_vec(), Some(lease))
        .await
        .unwrap();
    s.put(&format!("{p}/b"), b"2".to_vec(), Some(lease))
        .await
        .unwrap();
    // Re-putting a key without the lease detaches it.
    s.put(&format!("{p}/b"), b"3".to_vec(), None).await.unwrap();
    s.revoke_lease(lease).await.unwrap();
    assert_eq!(s.get(&format!("{p}/a")).await.unwrap(), None);
    assert_eq!(s.get(&format!("{p}/b")).await.unwrap().unwrap().value, b"3");
    assert!(matches!(
        s.revoke_lease(lease).await,
        Err(StoreError::LeaseNotFound(_))
    ));
}

pub async fn a_lease_ending_shows_every_key_it_held_to_a_watcher(s: Arc<dyn Store>) {
    let p = scope("lease-many");
    let lease = s.grant_lease(Duration::from_secs(60)).await.unwrap();
    let keys: Vec<String> = (0..5).map(|i| format!("{p}/k{i}")).collect();
    for k in &keys {
        s.put(k, b"v".to_vec(), Some(lease)).await.unwrap();
    }
    let listing = s.list(&p).await.unwrap();
    let mut w = s.watch(&p, listing.revision + 1).await.unwrap();
    s.revoke_lease(lease).await.unwrap();
    let mut gone = Vec::new();
    while gone.len() < keys.len() {
        let ev = next_event(&mut w).await;
        assert_eq!(ev.kind, EventKind::Delete, "{}", ev.key);
        gone.push(ev.key);
    }
    gone.sort();
    assert_eq!(gone, keys, "a delete event for every key of the lease");
}

pub async fn concurrent_writers_all_land(s: Arc<dyn Store>) {
    let p = scope("concurrent");
    let writes = (0..100u32).map(|i| {
        let s = s.clone();
        let k = format!("{p}/{i}");
        tokio::spawn(async move { s.put(&k, i.to_le_bytes().to_vec(), None).await })
    });
    let mut revs = Vec::new();
    for w in writes.collect::<Vec<_>>() {
        revs.push(w.await.unwrap().unwrap());
    }
    revs.sort_unstable();
    revs.dedup();
    assert_eq!(revs.len(), 100, "every write gets its own revision");
    assert_eq!(s.list(&p).await.unwrap().entries.len(), 100);
}

/// Calls `$then!(ARGS; name, name, ...)` (written `each_check!([$then] ARGS)`) with the name of every check, so that the list is
/// written once.
#[macro_export]
macro_rules! each_check {
    ([$($then:tt)*] $($args:tt)*) => {
        $($then)*! { $($args)*;
            put_get_and_hash, missing_keys, prefix_lists_match_whole_tokens, text_prefix_lists_match_text, delete_removes,
            compare_and_swap, watch_replays_from_a_revision,
            watch_from_listing_sees_every_later_change, leases_expire_and_watchers_see_it,
            revoke_deletes_attached_keys, concurrent_writers_all_land,
            compare_and_swap_expecting_a_revision_of_an_absent_key_conflicts,
            keep_alive_extends_a_lease_past_its_ttl, a_lease_ending_shows_every_key_it_held_to_a_watcher,
            follower_resumes_a_cut_watch_without_losing_the_gap,
            follower_lists_again_after_a_compaction_and_delivers_the_difference,
            follower_survives_a_failing_first_list_and_watch,
            follower_delivers_every_key_a_lease_held, follower_from_a_listing_goes_on_after_it,
            follower_resumes_inside_a_revision
        }
    };
}

macro_rules! spawn_all {
    (; $($name:ident),*) => {
        |s: Arc<dyn Store>| vec![$((stringify!($name), tokio::spawn($name(s.clone())))),*]
    };
}

/// Runs every check at once against one store (a backend that is a server, such as etcd, is
/// started once for all of them), and panics naming each check that failed.
pub async fn run_all(s: Arc<dyn Store>) {
    let spawn = each_check!([spawn_all]);
    let mut failed = Vec::new();
    for (name, task) in spawn(s) {
        if let Err(e) = task.await {
            let why = e
                .try_into_panic()
                .ok()
                .and_then(|p| {
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                })
                .unwrap_or_default();
            failed.push(format!("{name}: {why}"));
        }
    }
    assert!(
        failed.is_empty(),
        "conformance checks failed:\n{}",
        failed.join("\n")
    );
}

/// Expands to one `#[tokio::test]` per conformance check. `$make` is an async expression that
/// yields an `Arc<dyn Store>`; the calling crate needs `tokio` with the `macros` feature.
#[macro_export]
macro_rules! store_conformance {
    ($make:expr) => {
        $crate::each_check!([$crate::store_conformance] @each $make);
    };
    (@each $make:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let store = $make.await;
                $crate::$name(store).await;
            }
        )*
    };
}
