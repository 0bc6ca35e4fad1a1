//! Watches on etcd. A watch runs over one member's stream; when that member dies or the stream
//! breaks, it is opened again on another member from the revision after the last one delivered,
//! so the watcher sees every change once and in order, and never the failover. Only a
//! compacted revision ends it with an error, and the watcher lists again.

use etcd_client::{EventType, WatchOptions, WatchStream};
use tokio::sync::mpsc;

use super::{rev, token_range, EtcdStore};
use crate::{Event, EventKind, Revision, StoreError, Watch};

pub(super) async fn start(
    store: &EtcdStore,
    prefix: &str,
    from: Revision,
) -> Result<Watch, StoreError> {
    let prefix = prefix.trim_end_matches('/').to_owned();
    // Opened here, so that an unreachable cluster is the caller's error, not a silent watch.
    let stream = open(store, &prefix, from).await?;
    let (tx, rx) = mpsc::channel(256);
    let client = store.client.clone();
    let endpoints = store.endpoints.clone();
    let unready = store.unready.clone();
    tokio::spawn(async move {
        let store = EtcdStore {
            client,
            endpoints,
            unready,
        };
        relay(&store, &prefix, from, stream, &tx).await;
    });
    Ok(Watch::from_channel(rx))
}

async fn open(store: &EtcdStore, prefix: &str, from: Revision) -> Result<WatchStream, StoreError> {
    let (key, end) = token_range(prefix);
    let mut options = WatchOptions::new().with_range(end);
    if from > 0 {
        options = options.with_start_revision(i64::try_from(from).unwrap_or(i64::MAX));
    }
    store
        .retry("watch", |mut c| {
            let (key, options) = (key.clone(), options.clone());
            async move { c.watch(key, Some(options)).await }
        })
        .await
}

/// Forwards events until the watcher goes away, resuming on another member when needed.
async fn relay(
    store: &EtcdStore,
    prefix: &str,
    from: Revision,
    mut stream: WatchStream,
    tx: &mpsc::Sender<Result<Event, StoreError>>,
) {
    // The next revision the watcher has not seen (0: whatever comes next).
    let mut next = from;
    loop {
        let message = tokio::select! {
            m = stream.message() => m,
            () = tx.closed() => return,
        };
        let resp = match message {
            Ok(Some(resp)) => resp,
            Ok(None) => {
                let e = etcd_client::Error::WatchError("the member ended the watch".into());
                match reopen(store, prefix, &mut next, e, tx).await {
                    Some(s) => {
                        stream = s;
                        continue;
                    }
                    None => return,
                }
            }
            Err(e) => match reopen(store, prefix, &mut next, e, tx).await {
                Some(s) => {
                    stream = s;
                    continue;
                }
                None => return,
            },
        };
        if next == 0 {
            // The watch's first answer carries the revision it starts after.
            next = resp.header().map_or(0, |h| rev(h.revision()) + 1);
        }
        if resp.compact_revision() > 0 {
            let _ = tx
                .send(Err(StoreError::Compacted {
                    requested: next,
                    oldest: rev(resp.compact_revision()),
                }))
                .await;
            return;
        }
        // Every key of one transaction (a lease's expiry deletes all its keys at once) shares
        // one revision: skip by the revision reached before this answer, not after each event.
        let floor = next;
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let revision = rev(kv.mod_revision());
            if revision < floor {
                continue; // already delivered before a resume
            }
            next = next.max(revision + 1);
            let Ok(key) = std::str::from_utf8(kv.key()) else {
                continue;
            };
            if !warden_core::keys::under_prefix(prefix, key) {
                continue;
            }
            let kind = match ev.event_type() {
                EventType::Put => EventKind::Put(kv.value().to_vec()),
                EventType::Delete => EventKind::Delete,
            };
            let event = Event {
                revision,
                key: key.to_owned(),
                kind,
            };
            if tx.send(Ok(event)).await.is_err() {
                return;
            }
        }
        if resp.canceled() {
            let e = etcd_client::Error::WatchError(resp.cancel_reason().to_owned());
            match reopen(store, prefix, &mut next, e, tx).await {
                Some(s) => stream = s,
                None => return,
            }
        }
    }
}

/// A new stream from `next` after `cause` broke the old one; `None` (after telling the watcher
/// why) when the cluster stays unreachable past the failover budget.
async fn reopen(
    store: &EtcdStore,
    prefix: &str,
    next: &mut Revision,
    cause: etcd_client::Error,
    tx: &mpsc::Sender<Result<Event, StoreError>>,
) -> Option<WatchStream> {
    tracing::info!(prefix, next = *next, error = %cause, "etcd watch broke; resuming on another member");
    if *next == 0 {
        // Nothing delivered yet and no start revision: resuming "from now" could skip changes
        // made while the stream was down, so the watcher lists again instead.
        let _ = tx
            .send(Err(StoreError::Engine {
                op: "watch",
                reason: format!("the watch broke before its first event ({cause}); list again"),
            }))
            .await;
        return None;
    }
    match open(store, prefix, *next).await {
        Ok(s) => Some(s),
        Err(e) => {
            let _ = tx.send(Err(e)).await;
            None
        }
    }
}
