//! Checks of [`Follower`] over a real backend, with faults injected between the follower and
//! the store by [`Faulty`]: cut watches, watches held back (the gap), watches and lists that
//! fail, and watches told their revision is compacted.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch, Notify};
use warden_store::{
    CasOutcome, Entry, Event, EventKind, Follower, Hash, LeaseId, Listing, Revision, Store,
    StoreError, Update, Watch,
};

use super::scope;

/// A store that passes everything to a real one, except for the faults a check asks for.
struct Faulty {
    inner: Arc<dyn Store>,
    /// Whether `watch` may go on (`false`: calls wait, which makes a gap).
    open: watch::Sender<bool>,
    /// How many `watch` calls were made.
    calls: watch::Sender<usize>,
    fail_watches: AtomicUsize,
    fail_lists: AtomicUsize,
    compact_watches: AtomicUsize,
    /// Ends a watch right after the next delete it passes on.
    cut_after_delete: Arc<AtomicBool>,
    cuts: Mutex<Vec<Arc<Notify>>>,
}

impl Faulty {
    fn new(inner: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            open: watch::channel(true).0,
            calls: watch::channel(0).0,
            fail_watches: AtomicUsize::new(0),
            fail_lists: AtomicUsize::new(0),
            compact_watches: AtomicUsize::new(0),
            cut_after_delete: Arc::new(AtomicBool::new(false)),
            cuts: Mutex::new(Vec::new()),
        })
    }

    /// Ends every watch open now with an error.
    fn cut_watches(&self) {
        for n in self.cuts.lock().unwrap().drain(..) {
            n.notify_one();
        }
    }

    /// Waits until `watch` has been called `n` times in all.
    async fn watch_called(&self, n: usize) {
        let mut rx = self.calls.subscribe();
        tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|c| *c >= n))
            .await
            .expect("the follower watches again within 30 s")
            .unwrap();
    }
}

fn take(n: &AtomicUsize) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

fn injected(op: &'static str) -> StoreError {
    StoreError::Engine {
        op,
        reason: "fault injected by the test".into(),
    }
}

#[async_trait]
impl Store for Faulty {
    async fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        self.inner.get(key).await
    }
    async fn get_hash(&self, key: &str) -> Result<Option<(Hash, Revision)>, StoreError> {
        self.inner.get_hash(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        if take(&self.fail_lists) {
            return Err(injected("list"));
        }
        self.inner.list(prefix).await
    }
    async fn list_text_prefix(&self, start: &str) -> Result<Listing, StoreError> {
        if take(&self.fail_lists) {
            return Err(injected("list"));
        }
        self.inner.list_text_prefix(start).await
    }
    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError> {
        self.inner.put(key, value, lease).await
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
        self.calls.send_modify(|c| *c += 1);
        let _ = self.open.subscribe().wait_for(|o| *o).await;
        if take(&self.fail_watches) {
            return Err(injected("watch"));
        }
        if take(&self.compact_watches) {
            return Err(StoreError::Compacted {
                requested: from,
                oldest: from + 1,
            });
        }
        let mut inner = self.inner.watch(prefix, from).await?;
        let cut = Arc::new(Notify::new());
        self.cuts.lock().unwrap().push(cut.clone());
        let (tx, rx) = mpsc::channel(16);
        let cut_after_delete = self.cut_after_delete.clone();
        tokio::spawn(async move {
            loop {
                let ev = tokio::select! {
                    ev = inner.next() => ev,
                    () = cut.notified() => Some(Err(injected("watch"))),
                };
                let end = !matches!(ev, Some(Ok(_)));
                let deleted = matches!(&ev, Some(Ok(e)) if e.kind == EventKind::Delete);
                if let Some(ev) = ev {
                    if tx.send(ev).await.is_err() {
                        return;
                    }
                }
                if deleted && cut_after_delete.swap(false, Ordering::SeqCst) {
                    let _ = tx.send(Err(injected("watch"))).await;
                    return;
                }
                if end {
                    return;
                }
            }
        });
        Ok(Watch::from_channel(rx))
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

/// Runs a follower in a task; its updates come out of the channel.
fn run(store: Arc<Faulty>, prefix: &str) -> mpsc::UnboundedReceiver<Update> {
    let mut follower = Follower::new(store, prefix);
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(u) = follower.next().await {
            if tx.send(u).is_err() {
                return;
            }
        }
    });
    rx
}

async fn next_update(rx: &mut mpsc::UnboundedReceiver<Update>) -> Update {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("an update from the follower within 30 s")
        .expect("the follower keeps going")
}

/// The changes of the next update, as (key, value or `None` for a delete).
async fn next_changes(rx: &mut mpsc::UnboundedReceiver<Update>) -> Vec<(String, Option<Vec<u8>>)> {
    match next_update(rx).await {
        Update::Changes { events, .. } => events.into_iter().map(change).collect(),
        Update::Listed(l) => panic!("a second listing instead of changes: {l:?}"),
    }
}

fn change(e: Event) -> (String, Option<Vec<u8>>) {
    match e.kind {
        EventKind::Put(v) => (e.key, Some(v)),
        EventKind::Delete => (e.key, None),
    }
}

async fn listed(rx: &mut mpsc::UnboundedReceiver<Update>) -> Vec<String> {
    match next_update(rx).await {
        Update::Listed(l) => l.entries.into_iter().map(|e| e.key).collect(),
        other => panic!("the first update is not a listing: {other:?}"),
    }
}

/// A watch cut while changes are made: the follower resumes from the last revision it saw
/// and delivers the put and the delete made in the gap.
pub async fn follower_resumes_a_cut_watch_without_losing_the_gap(s: Arc<dyn Store>) {
    let p = scope("follow-gap");
    let store = Faulty::new(s);
    store
        .put(&format!("{p}/a"), b"1".to_vec(), None)
        .await
        .unwrap();
    let mut rx = run(store.clone(), &p);
    assert_eq!(listed(&mut rx).await, [format!("{p}/a")]);
    store
        .put(&format!("{p}/b"), b"2".to_vec(), None)
        .await
        .unwrap();
    assert_eq!(
        next_changes(&mut rx).await,
        [(format!("{p}/b"), Some(b"2".to_vec()))]
    );
    // The gap: the watch is cut and the follower's next watch waits until the changes are made.
    store.open.send_replace(false);
    store.cut_watches();
    store.watch_called(2).await;
    store
        .put(&format!("{p}/c"), b"3".to_vec(), None)
        .await
        .unwrap();
    store.delete(&format!("{p}/a")).await.unwrap();
    store.open.send_replace(true);
    assert_eq!(
        next_changes(&mut rx).await,
        [(format!("{p}/c"), Some(b"3".to_vec()))]
    );
    assert_eq!(next_changes(&mut rx).await, [(format!("{p}/a"), None)]);
}

/// The watch's revision compacted away: the follower lists again and delivers the difference
/// (a new key, a changed key, a deleted key), then follows on from the new listing.
pub async fn follower_lists_again_after_a_compaction_and_delivers_the_difference(
    s: Arc<dyn Store>,
) {
    compaction_check(s, None::<std::future::Ready<()>>).await;
}

/// As [`follower_lists_again_after_a_compaction_and_delivers_the_difference`], with the
/// backend's own compaction (`compact` compacts away every revision the follower has not seen)
/// instead of an injected one.
pub async fn follower_lists_again_after_a_real_compaction(
    s: Arc<dyn Store>,
    compact: impl std::future::Future<Output = ()>,
) {
    compaction_check(s, Some(compact)).await;
}

async fn compaction_check(
    s: Arc<dyn Store>,
    compact: Option<impl std::future::Future<Output = ()>>,
) {
    let p = scope("follow-compact");
    let store = Faulty::new(s);
    for k in ["a", "same"] {
        store
            .put(&format!("{p}/{k}"), b"1".to_vec(), None)
            .await
            .unwrap();
    }
    let mut rx = run(store.clone(), &p);
    assert_eq!(listed(&mut rx).await.len(), 2);
    // A change seen by the watch: the watch is open and can be cut.
    store
        .put(&format!("{p}/b"), b"1".to_vec(), None)
        .await
        .unwrap();
    assert_eq!(
        next_changes(&mut rx).await,
        [(format!("{p}/b"), Some(b"1".to_vec()))]
    );
    store.open.send_replace(false);
    store.cut_watches();
    store.watch_called(2).await;
    store
        .put(&format!("{p}/c"), b"3".to_vec(), None)
        .await
        .unwrap();
    store
        .put(&format!("{p}/b"), b"2".to_vec(), None)
        .await
        .unwrap();
    store.delete(&format!("{p}/a")).await.unwrap();
    match compact {
        Some(compact) => compact.await,
        None => store.compact_watches.store(1, Ordering::SeqCst),
    }
    store.open.send_replace(true);
    let mut changes = next_changes(&mut rx).await;
    changes.sort();
    assert_eq!(
        changes,
        [
            (format!("{p}/a"), None),
            (format!("{p}/b"), Some(b"2".to_vec())),
            (format!("{p}/c"), Some(b"3".to_vec())),
        ]
    );
    store
        .put(&format!("{p}/d"), b"4".to_vec(), None)
        .await
        .unwrap();
    assert_eq!(
        next_changes(&mut rx).await,
        [(format!("{p}/d"), Some(b"4".to_vec()))]
    );
}

/// The first list and the first watches fail: the follower retries and still delivers.
pub async fn follower_survives_a_failing_first_list_and_watch(s: Arc<dyn Store>) {
    let p = scope("follow-fail");
    let store = Faulty::new(s);
    store.fail_lists.store(1, Ordering::SeqCst);
    store.fail_watches.store(2, Ordering::SeqCst);
    store
        .put(&format!("{p}/a"), b"1".to_vec(), None)
        .await
        .unwrap();
    let mut rx = run(store.clone(), &p);
    assert_eq!(listed(&mut rx).await, [format!("{p}/a")]);
    store
        .put(&format!("{p}/b"), b"2".to_vec(), None)
        .await
        .unwrap();
    assert_eq!(
        next_changes(&mut rx).await,
        [(format!("{p}/b"), Some(b"2".to_vec()))]
    );
    assert!(
        *store.calls.borrow() >= 3,
        "the failed watches were retried"
    );
}

/// A lease ending deletes every key it held, in one revision on some backends: the follower
/// delivers each delete, not only the first of the revision.
pub async fn follower_delivers_every_key_a_lease_held(s: Arc<dyn Store>) {
    lease_check(Faulty::new(s)).await;
}

/// As [`follower_delivers_every_key_a_lease_held`], with the watch cut right after the first
/// delete: the follower resumes inside that revision and still delivers the others, once.
pub async fn follower_resumes_inside_a_revision(s: Arc<dyn Store>) {
    let store = Faulty::new(s);
    store.cut_after_delete.store(true, Ordering::SeqCst);
    lease_check(store).await;
}

async fn lease_check(store: Arc<Faulty>) {
    let p = scope("follow-lease");
    let mut rx = run(store.clone(), &p);
    assert!(listed(&mut rx).await.is_empty());
    let lease = store.grant_lease(Duration::from_secs(60)).await.unwrap();
    let keys: Vec<String> = (0..3).map(|i| format!("{p}/k{i}")).collect();
    for k in &keys {
        store.put(k, b"1".to_vec(), Some(lease)).await.unwrap();
        assert_eq!(
            next_changes(&mut rx).await,
            [(k.clone(), Some(b"1".to_vec()))]
        );
    }
    store.revoke_lease(lease).await.unwrap();
    let mut deleted = Vec::new();
    while deleted.len() < keys.len() {
        deleted.extend(next_changes(&mut rx).await);
    }
    deleted.sort();
    let want: Vec<(String, Option<Vec<u8>>)> = keys.iter().map(|k| (k.clone(), None)).collect();
    assert_eq!(deleted, want);
}

/// A follower started from the caller's own listing delivers the changes after it, first.
pub async fn follower_from_a_listing_goes_on_after_it(s: Arc<dyn Store>) {
    let p = scope("follow-from");
    s.put(&format!("{p}/a"), b"1".to_vec(), None).await.unwrap();
    let listing = s.list(&p).await.unwrap();
    let mut follower = Follower::from_listing(s.clone(), p.clone(), &listing);
    s.delete(&format!("{p}/a")).await.unwrap();
    let update = tokio::time::timeout(Duration::from_secs(30), follower.next())
        .await
        .expect("an update within 30 s")
        .expect("the follower keeps going");
    let Update::Changes { events, .. } = update else {
        panic!("a listing again instead of the change after it: {update:?}");
    };
    assert_eq!(
        events.into_iter().map(change).collect::<Vec<_>>(),
        [(format!("{p}/a"), None)]
    );
}
