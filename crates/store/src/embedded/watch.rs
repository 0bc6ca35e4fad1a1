//! Watchers of the embedded store.
//!
//! A watcher subscribes to the writer's broadcast first and reads the change log second, so no
//! change can fall between the two; it drops what it has already delivered by revision. A
//! watcher that falls behind the broadcast goes back to the log instead of losing changes.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use redb::ReadableDatabase;
use tokio::sync::{broadcast, mpsc};

use super::{codec, read_err, Shared, LOG, META};
use crate::{Event, Revision, StoreError, Watch};

pub(super) fn start(
    shared: Arc<Shared>,
    prefix: &str,
    from: Revision,
) -> Result<Watch, StoreError> {
    let prefix = prefix.trim_end_matches('/').to_owned();
    let mut sub = shared.events.subscribe();
    let next = if from == 0 {
        shared.revision.load(Ordering::SeqCst) + 1
    } else {
        from
    };
    let compacted = shared.compacted.load(Ordering::SeqCst);
    if next <= compacted {
        return Err(StoreError::Compacted {
            requested: next,
            oldest: compacted + 1,
        });
    }
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        let mut next = next;
        if catch_up(&shared, &prefix, &mut next, &tx).await.is_err() {
            return;
        }
        loop {
            match sub.recv().await {
                Ok(batch) => {
                    for ev in batch.iter() {
                        if ev.revision < next {
                            continue;
                        }
                        next = ev.revision + 1;
                        if warden_core::keys::under_prefix(&prefix, &ev.key)
                            && tx.send(Ok(ev.clone())).await.is_err()
                        {
                            return;
                        }
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    if catch_up(&shared, &prefix, &mut next, &tx).await.is_err() {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    Ok(Watch::from_channel(rx))
}

/// Delivers logged changes from `next` on; afterwards `next` is one past the log's end.
/// `Err` means the watch is over (receiver gone, or an error was delivered).
async fn catch_up(
    shared: &Arc<Shared>,
    prefix: &str,
    next: &mut Revision,
    tx: &mpsc::Sender<Result<Event, StoreError>>,
) -> Result<(), ()> {
    let from = *next;
    let s = shared.clone();
    let p = prefix.to_owned();
    let read =
        tokio::task::spawn_blocking(move || -> Result<(Vec<Event>, Revision), StoreError> {
            let db = s.db()?;
            let txn = db.begin_read().map_err(read_err)?;
            let meta = txn.open_table(META).map_err(read_err)?;
            let get = |k: &str| -> Result<u64, StoreError> {
                Ok(meta
                    .get(k)
                    .map_err(read_err)?
                    .map(|v| v.value())
                    .unwrap_or(0))
            };
            let (revision, compacted) = (get("revision")?, get("compacted")?);
            if from <= compacted {
                return Err(StoreError::Compacted {
                    requested: from,
                    oldest: compacted + 1,
                });
            }
            let log = txn.open_table(LOG).map_err(read_err)?;
            let mut out = Vec::new();
            for row in log.range(from..).map_err(read_err)? {
                let (rev, bytes) = row.map_err(read_err)?;
                let ev = codec::decode_event(rev.value(), bytes.value())?;
                if warden_core::keys::under_prefix(&p, &ev.key) {
                    out.push(ev);
                }
            }
            Ok((out, revision))
        })
        .await;
    let result = read.unwrap_or_else(|e| {
        Err(StoreError::Engine {
            op: "watch",
            reason: e.to_string(),
        })
    });
    match result {
        Ok((events, revision)) => {
            for ev in events {
                if tx.send(Ok(ev)).await.is_err() {
                    return Err(());
                }
            }
            *next = (*next).max(revision + 1);
            Ok(())
        }
        Err(e) => {
            let _ = tx.send(Err(e)).await;
            Err(())
        }
    }
}
