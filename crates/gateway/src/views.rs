//! In-memory views of the store that the request path reads: apps, users and ready instances.
//!
//! Each view is filled by a list and kept current by a watch from the listing's revision, so the
//! request path never waits on the store. If a watch breaks, the view is listed again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use warden_core::{keys, AppSpec, InstanceRecord, InstanceState, UserRecord};
use warden_store::{decode, Store};

/// What the gateway knows of the platform.
#[derive(Default)]
pub(crate) struct Views {
    pub apps: HashMap<String, Arc<AppSpec>>,
    pub hosts: HashMap<String, String>,
    pub users: HashMap<String, Arc<UserRecord>>,
    /// Ready instances by (app, label).
    pub instances: HashMap<(String, String), Vec<InstanceRecord>>,
}

/// Shared views with a round-robin cursor.
pub(crate) struct Shared {
    views: RwLock<Views>,
    cursor: AtomicUsize,
    /// Per view, the store revision up to which it has applied every change.
    applied: [watch::Sender<u64>; 3],
}

#[derive(Clone, Copy)]
enum Kind {
    Apps = 0,
    Users = 1,
    Instances = 2,
}

impl Kind {
    fn of(prefix: &str) -> Option<Self> {
        match prefix.split('/').next() {
            Some(keys::APPS) => Some(Self::Apps),
            Some(keys::USERS) => Some(Self::Users),
            Some(keys::INSTANCES) => Some(Self::Instances),
            _ => None,
        }
    }
}

// === impl Shared ===

impl Shared {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            views: RwLock::new(Views::default()),
            cursor: AtomicUsize::new(0),
            applied: std::array::from_fn(|_| watch::channel(0).0),
        })
    }

    fn mark(&self, kind: Kind, revision: u64) {
        self.applied[kind as usize].send_if_modified(|r| {
            let newer = revision > *r;
            if newer {
                *r = revision;
            }
            newer
        });
    }

    /// Waits until the view holding keys under `key` has applied every change up to `revision`.
    /// Keys no view follows are trivially applied.
    pub async fn caught_up(&self, key: &str, revision: u64) {
        if let Some(kind) = Kind::of(key) {
            let mut rx = self.applied[kind as usize].subscribe();
            let _ = rx.wait_for(|r| *r >= revision).await;
        }
    }

    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, Views> {
        self.views.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Views> {
        self.views.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The next ready instance for (app, label), round robin.
    pub fn pick(&self, app: &str, label: &str) -> Option<InstanceRecord> {
        let v = self.read();
        let list = v.instances.get(&(app.to_owned(), label.to_owned()))?;
        if list.is_empty() {
            return None;
        }
        let i = self.cursor.fetch_add(1, Ordering::Relaxed) % list.len();
        Some(list[i].clone())
    }

    /// Records an instance the agent just reported ready, ahead of its watch event.
    pub fn add_instance(&self, r: InstanceRecord) {
        let mut v = self.write();
        upsert_instance(&mut v, r);
    }

    /// Forgets an instance that refused a connection.
    pub fn drop_instance(&self, id: &str) {
        let mut v = self.write();
        remove_instance(&mut v, id);
    }

    fn apply(&self, kind: Kind, key: &str, value: Option<&[u8]>) {
        let mut v = self.write();
        let parse_err = |e: warden_store::StoreError| tracing::warn!(key, error = %e, "ignoring unreadable record");
        match (kind, value) {
            (Kind::Apps, Some(bytes)) if key.ends_with("/spec") => {
                match decode::<AppSpec>(key, bytes) {
                    Ok(spec) => {
                        v.apps.insert(spec.name.clone(), Arc::new(spec));
                        rebuild_hosts(&mut v);
                    }
                    Err(e) => parse_err(e),
                }
            }
            (Kind::Apps, None) => {
                if let Some(name) = key
                    .strip_prefix("apps/")
                    .and_then(|k| k.strip_suffix("/spec"))
                {
                    v.apps.remove(name);
                    rebuild_hosts(&mut v);
                }
            }
            (Kind::Users, Some(bytes)) => match decode::<UserRecord>(key, bytes) {
                Ok(u) => {
                    v.users.insert(u.name.clone(), Arc::new(u));
                }
                Err(e) => parse_err(e),
            },
            (Kind::Users, None) => {
                if let Some(name) = key.strip_prefix("users/") {
                    v.users.remove(name);
                }
            }
            (Kind::Instances, Some(bytes)) => match decode::<InstanceRecord>(key, bytes) {
                Ok(r) => upsert_instance(&mut v, r),
                Err(e) => parse_err(e),
            },
            (Kind::Instances, None) => {
                if let Some(id) = key.rsplit('/').next() {
                    remove_instance(&mut v, id);
                }
            }
            _ => {}
        }
    }

    fn reset(&self, kind: Kind) {
        let mut v = self.write();
        match kind {
            Kind::Apps => {
                v.apps.clear();
                v.hosts.clear();
            }
            Kind::Users => v.users.clear(),
            Kind::Instances => v.instances.clear(),
        }
    }
}

fn rebuild_hosts(v: &mut Views) {
    v.hosts = v
        .apps
        .values()
        .flat_map(|a| {
            a.hosts
                .iter()
                .map(move |h| (h.to_ascii_lowercase(), a.name.clone()))
        })
        .collect();
}

fn upsert_instance(v: &mut Views, r: InstanceRecord) {
    remove_instance(v, &r.id);
    if r.state == InstanceState::Ready {
        v.instances
            .entry((r.app.clone(), r.label.clone()))
            .or_default()
            .push(r);
    }
}

fn remove_instance(v: &mut Views, id: &str) {
    v.instances.retain(|_, list| {
        list.retain(|r| r.id != id);
        !list.is_empty()
    });
}

/// Starts following apps, users and instances; resolves once all three are loaded.
pub(crate) async fn follow_all(store: Arc<dyn Store>, shared: Arc<Shared>) {
    let mut loaded = Vec::new();
    for (kind, prefix) in [
        (Kind::Apps, keys::APPS),
        (Kind::Users, keys::USERS),
        (Kind::Instances, keys::INSTANCES),
    ] {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(follow(store.clone(), shared.clone(), kind, prefix, tx));
        loaded.push(rx);
    }
    for mut rx in loaded {
        let _ = rx.wait_for(|l| *l).await;
    }
}

async fn follow(
    store: Arc<dyn Store>,
    shared: Arc<Shared>,
    kind: Kind,
    prefix: &'static str,
    loaded: watch::Sender<bool>,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let listing = match store.list(prefix).await {
            Ok(l) => l,
            Err(warden_store::StoreError::Closed) => return,
            Err(e) => {
                tracing::warn!(prefix, error = %e, "listing for the gateway's view failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        shared.reset(kind);
        for e in &listing.entries {
            shared.apply(kind, &e.key, Some(&e.value));
        }
        shared.mark(kind, listing.revision);
        let _ = loaded.send(true);
        let Ok(mut w) = store.watch(prefix, listing.revision + 1).await else {
            continue;
        };
        backoff = Duration::from_millis(50);
        loop {
            match w.next().await {
                Some(Ok(ev)) => {
                    let value = match &ev.kind {
                        warden_store::EventKind::Put(v) => Some(v.as_slice()),
                        warden_store::EventKind::Delete => None,
                    };
                    shared.apply(kind, &ev.key, value);
                    shared.mark(kind, ev.revision);
                }
                Some(Err(e)) => {
                    tracing::warn!(prefix, error = %e, "gateway view watch broke; listing again");
                    break;
                }
                None => return,
            }
        }
    }
}
