//! Following a prefix of the store: the one way every role keeps up with it.
//!
//! A [`Follower`] lists the prefix, then watches from the listing's revision. When the watch
//! breaks it resumes from the revision after the last one it delivered, so a change made while
//! it was down is still seen. When that revision is gone (the store compacted its history) it
//! lists again and delivers the difference from what it had delivered: puts of keys that are
//! new or changed, deletes of keys that vanished. It never gives up: a failed list or watch is
//! retried after a backoff that doubles up to [`MAX_BACKOFF`]. Only a closed store ends it.
//!
//! The model is client-go's reflector (list, watch from the list's resourceVersion, list again
//! on "410 Gone"). Like the rest of this crate it logs keys and revisions, never values.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::{Event, EventKind, Listing, Revision, Store, StoreError, Watch};

/// The first pause after a failed list or watch.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// The longest pause between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What a [`Follower`] delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// The first listing of the prefix: everything under it at `listing.revision`.
    Listed(Listing),
    /// Changes in revision order; once applied, the follower has seen every change up to
    /// `revision`. One watch event at a time, or, after a compaction, the difference between a
    /// new listing and what was delivered before (every event at the listing's revision;
    /// possibly none).
    Changes {
        /// The changes.
        events: Vec<Event>,
        /// Every change up to this revision is now delivered.
        revision: Revision,
    },
}

/// Follows the keys under one prefix; see the module documentation.
pub struct Follower {
    store: Arc<dyn Store>,
    prefix: String,
    /// Each key delivered as present, with the mod revision of its last delivered put.
    known: HashMap<String, Revision>,
    /// The highest revision delivered (`None`: not listed yet).
    seen: Option<Revision>,
    /// The keys delivered by the watch at `seen`, which may not be all of them: one write can
    /// change several keys at one revision (a lease ending). Empty when `seen` is complete (a
    /// listing's revision).
    at_seen: HashSet<String>,
    watch: Option<Watch>,
    backoff: Duration,
}

// === impl Follower ===

impl Follower {
    /// A follower of `prefix`; nothing is read until [`Follower::next`].
    pub fn new(store: Arc<dyn Store>, prefix: impl Into<String>) -> Self {
        Self {
            store,
            prefix: prefix.into(),
            known: HashMap::new(),
            seen: None,
            at_seen: HashSet::new(),
            watch: None,
            backoff: FIRST_BACKOFF,
        }
    }

    /// A follower of `prefix` that has already delivered `listing` (the caller's own
    /// first listing, whose failure it reports): the next update is the first change after it.
    pub fn from_listing(
        store: Arc<dyn Store>,
        prefix: impl Into<String>,
        listing: &Listing,
    ) -> Self {
        let mut follower = Self::new(store, prefix);
        follower.known = present(listing);
        follower.seen = Some(listing.revision);
        follower
    }

    /// The prefix followed.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The next update; `None` only once the store is closed. Failures are retried inside.
    pub async fn next(&mut self) -> Option<Update> {
        loop {
            let Some(seen) = self.seen else {
                match self.list().await? {
                    Some(listing) => {
                        self.known = present(&listing);
                        self.seen = Some(listing.revision);
                        self.at_seen.clear();
                        return Some(Update::Listed(listing));
                    }
                    None => continue,
                }
            };
            // From the revision after the last one delivered whole; a revision delivered in
            // part is watched again and its delivered keys skipped.
            let from = if self.at_seen.is_empty() {
                seen + 1
            } else {
                seen
            };
            let watch = match &mut self.watch {
                Some(w) => w,
                None => match self.store.watch(&self.prefix, from).await {
                    Ok(w) => self.watch.insert(w),
                    Err(StoreError::Closed) => return None,
                    Err(StoreError::Compacted { .. }) => match self.relist().await? {
                        Some(update) => return Some(update),
                        None => continue,
                    },
                    Err(e) => {
                        tracing::warn!(prefix = %self.prefix, from, error = %e, "watching the store failed; retrying");
                        self.pause().await;
                        continue;
                    }
                },
            };
            match watch.next().await {
                Some(Ok(ev)) => {
                    self.backoff = FIRST_BACKOFF;
                    if ev.revision < seen
                        || (ev.revision == seen
                            && (self.at_seen.is_empty() || !self.at_seen.insert(ev.key.clone())))
                    {
                        continue; // already delivered
                    }
                    if ev.revision > seen {
                        self.seen = Some(ev.revision);
                        self.at_seen.clear();
                        self.at_seen.insert(ev.key.clone());
                    }
                    match ev.kind {
                        EventKind::Put(_) => self.known.insert(ev.key.clone(), ev.revision),
                        EventKind::Delete => self.known.remove(&ev.key),
                    };
                    let revision = ev.revision;
                    return Some(Update::Changes {
                        events: vec![ev],
                        revision,
                    });
                }
                Some(Err(StoreError::Compacted { .. })) => {
                    self.watch = None;
                    tracing::info!(prefix = %self.prefix, seen, "the store compacted past this watch; listing again");
                    if let Some(update) = self.relist().await? {
                        return Some(update);
                    }
                }
                Some(Err(e)) => {
                    self.watch = None;
                    tracing::warn!(prefix = %self.prefix, seen, error = %e, "the store's watch broke; resuming from the last revision seen");
                    self.pause().await;
                }
                None => return None,
            }
        }
    }

    /// A listing of the prefix: `Some(None)` after a failure (already paused), `None` when the
    /// store is closed.
    async fn list(&mut self) -> Option<Option<Listing>> {
        match self.store.list(&self.prefix).await {
            Ok(listing) => {
                self.backoff = FIRST_BACKOFF;
                Some(Some(listing))
            }
            Err(StoreError::Closed) => None,
            Err(e) => {
                tracing::warn!(prefix = %self.prefix, error = %e, "listing the store failed; retrying");
                self.pause().await;
                Some(None)
            }
        }
    }

    /// Lists again and returns the difference from what was delivered.
    async fn relist(&mut self) -> Option<Option<Update>> {
        let Some(listing) = self.list().await? else {
            return Some(None);
        };
        let events = difference(&self.known, &listing);
        let mut known = present(&listing);
        // Damaged keys stay known as present: being unreadable is no delete.
        for (key, _) in &listing.damaged {
            if let Some(&r) = self.known.get(key) {
                known.insert(key.clone(), r);
            }
        }
        self.known = known;
        self.seen = Some(listing.revision);
        self.at_seen.clear();
        Some(Some(Update::Changes {
            events,
            revision: listing.revision,
        }))
    }

    async fn pause(&mut self) {
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }
}

/// The keys of a listing with their mod revisions.
fn present(listing: &Listing) -> HashMap<String, Revision> {
    listing
        .entries
        .iter()
        .map(|e| (e.key.clone(), e.mod_revision))
        .collect()
}

/// The changes that turn `known` into `listing`: puts of new and changed keys, deletes of keys
/// gone (a damaged key is not gone), in key order, all at the listing's revision.
fn difference(known: &HashMap<String, Revision>, listing: &Listing) -> Vec<Event> {
    let mut events: Vec<Event> = listing
        .entries
        .iter()
        .filter(|e| known.get(&e.key) != Some(&e.mod_revision))
        .map(|e| Event {
            revision: listing.revision,
            key: e.key.clone(),
            kind: EventKind::Put(e.value.clone()),
        })
        .collect();
    let listed = present(listing);
    let mut gone: Vec<&String> = known
        .keys()
        .filter(|k| !listed.contains_key(*k) && !listing.damaged.iter().any(|(d, _)| d == *k))
        .collect();
    gone.sort();
    events.extend(gone.into_iter().map(|k| Event {
        revision: listing.revision,
        key: k.clone(),
        kind: EventKind::Delete,
    }));
    events
}
