//! In-memory views of the store that the request path reads: apps, users, sessions, the
//! lattice and ready instances.
//!
//! Each view is filled by a list and kept current by a watch from the listing's revision, so the
//! request path never waits on the store; the store's [`Follower`] does both, resuming a broken
//! watch and listing again after a compaction.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use sha2::{Digest, Sha256};
use tokio::sync::watch;
use warden_auth::Lattice;
use warden_core::identity::{IdentityKey, Signer};
use warden_core::{
    keys, Activity, ActivityGuard, AppSpec, InstanceRecord, InstanceState, Instances, Lifetime,
    Peers, SessionRecord, UserRecord,
};
use warden_store::{decode, EventKind, Follower, Store, Update};

use crate::hashing::FastMap;

/// A user as the request path needs it.
pub(crate) struct User {
    pub record: UserRecord,
    /// SHA-256 of the PHC hash: cached verifications are valid only while it is unchanged.
    pub fingerprint: [u8; 32],
}

/// A ready instance and the requests it is serving now.
pub(crate) struct Routed {
    pub record: InstanceRecord,
    pub outstanding: AtomicUsize,
    /// The instance's activity handle, where its source watches its idle time; looked up
    /// once.
    activity: OnceLock<Option<Arc<Activity>>>,
    /// Signs the identities sent to the instance; derived once.
    signer: OnceLock<Signer>,
}

impl Routed {
    /// Marks a request in flight for the idle reaper of the instance's agent, if it has one.
    pub fn begin(&self, instances: &dyn Instances) -> Option<ActivityGuard> {
        self.activity
            .get_or_init(|| instances.activity(&self.record.id))
            .as_ref()
            .map(|a| a.begin())
    }

    /// The signer of identities sent to this instance.
    pub fn signer(&self, key: &IdentityKey) -> &Signer {
        self.signer.get_or_init(|| key.signer(&self.record.id))
    }
}

/// Counts a request as outstanding on an instance until dropped.
pub(crate) struct InFlight(pub Arc<Routed>);

impl InFlight {
    fn new(r: Arc<Routed>) -> Self {
        r.outstanding.fetch_add(1, Ordering::Relaxed);
        Self(r)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the gateway knows of the platform.
#[derive(Default)]
pub(crate) struct Views {
    pub apps: FastMap<String, Arc<AppSpec>>,
    pub hosts: FastMap<String, String>,
    pub users: FastMap<String, Arc<User>>,
    /// Sessions by token hash.
    pub sessions: FastMap<String, SessionRecord>,
    /// Ready instances by (app, label, owner); the owner is empty for shared instances.
    /// Per-request instances are never listed: each serves only the request it started for.
    pub instances: FastMap<(String, String, String), Vec<Arc<Routed>>>,
    /// Instances the gateway stopped routing to when they reported taint, by id, with the
    /// only label they may come back under (`None`: never, they are being stopped). A record
    /// of the old label that arrives later (the start's own event, still in flight) must not
    /// bring one back. Entries end with the instance's record.
    pub tainted: FastMap<String, Option<String>>,
    pub lattice: Option<Arc<Lattice>>,
}

/// Shared views with a round-robin cursor.
pub(crate) struct Shared {
    views: RwLock<Views>,
    cursor: AtomicUsize,
    /// Per view, the store revision up to which it has applied every change.
    applied: [watch::Sender<u64>; 5],
    /// Told of each instance record that leaves routing (`false`: stopped, draining, a spare)
    /// or enters it (`true`), so idle connections to it go with it.
    on_routing: Option<RoutingHook>,
}

/// See [`Shared::on_routing`].
pub(crate) type RoutingHook = Box<dyn Fn(&str, bool) + Send + Sync>;

#[derive(Clone, Copy)]
enum Kind {
    Apps = 0,
    Users = 1,
    Instances = 2,
    Sessions = 3,
    Lattice = 4,
}

impl Kind {
    fn of(prefix: &str) -> Option<Self> {
        match prefix.split('/').next() {
            Some(keys::APPS) => Some(Self::Apps),
            Some(keys::USERS) => Some(Self::Users),
            Some(keys::INSTANCES) => Some(Self::Instances),
            Some(keys::SESSIONS) => Some(Self::Sessions),
            Some(keys::LATTICE) => Some(Self::Lattice),
            _ => None,
        }
    }
}

// === impl Shared ===

impl Shared {
    #[cfg(test)]
    pub fn new() -> Arc<Self> {
        Self::with_hook(None)
    }

    /// Views that report instances entering and leaving routing to `hook`.
    pub fn with_hook(hook: Option<RoutingHook>) -> Arc<Self> {
        Arc::new(Self {
            views: RwLock::new(Views::default()),
            cursor: AtomicUsize::new(0),
            applied: std::array::from_fn(|_| watch::channel(0).0),
            on_routing: hook,
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

    /// A ready instance for (app, label, owner) not in `skip` nor on a node gone silent
    /// (`peers`): round robin, or the one with the fewest outstanding requests. `owner` is
    /// empty for shared instances.
    pub fn pick(
        &self,
        app: &str,
        label: &str,
        owner: &str,
        least_outstanding: bool,
        skip: &[String],
        peers: Option<&Peers>,
    ) -> Option<InFlight> {
        let v = self.read();
        let list = v
            .instances
            .get(&(app.to_owned(), label.to_owned(), owner.to_owned()))?;
        let candidates: Vec<&Arc<Routed>> = list
            .iter()
            .filter(|r| !skip.contains(&r.record.id))
            .filter(|r| peers.is_none_or(|p| !p.silent(&r.record.node)))
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let chosen = if least_outstanding {
            let start = self.cursor.fetch_add(1, Ordering::Relaxed);
            // Rotate the start so ties spread instead of piling onto the first instance.
            (0..candidates.len())
                .map(|k| candidates[(start + k) % candidates.len()])
                .min_by_key(|r| r.outstanding.load(Ordering::Relaxed))
        } else {
            Some(candidates[self.cursor.fetch_add(1, Ordering::Relaxed) % candidates.len()])
        };
        chosen.map(|r| InFlight::new(r.clone()))
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

    /// Stops routing to an instance that reported taint, at once and for good: it comes back
    /// only under `relabelled` (`None`: never).
    pub fn withdraw_tainted(&self, id: &str, relabelled: Option<String>) {
        let mut v = self.write();
        remove_instance(&mut v, id);
        v.tainted.insert(id.to_owned(), relabelled);
    }

    fn apply(&self, kind: Kind, key: &str, value: Option<&[u8]>) {
        apply_to(&mut self.write(), kind, key, value);
        if let (Kind::Instances, Some(hook)) = (kind, &self.on_routing) {
            let Some(id) = key.rsplit('/').next() else {
                return;
            };
            // Only a change of routing is reported: ready enters it; draining, a delete or an
            // unreadable record leaves it. A starting or spare record is neither: one that
            // arrives late (the watch behind a start the gateway itself asked for and already
            // uses) must not cut the connections of an instance that serves.
            let state = value.map(|v| decode::<InstanceRecord>(key, v).map(|r| r.state).ok());
            match state {
                Some(Some(InstanceState::Ready)) => hook(id, true),
                Some(Some(InstanceState::Starting | InstanceState::Spare)) => {}
                _ => hook(id, false),
            }
        }
    }

    /// Replaces one view with a listing's entries at once: a request never sees it half filled
    /// (an empty instance view would start instances that are already there).
    fn replace(&self, kind: Kind, entries: &[warden_store::Entry]) {
        let routed_before: Vec<String> = match kind {
            Kind::Instances => self
                .read()
                .instances
                .values()
                .flatten()
                .map(|r| r.record.id.clone())
                .collect(),
            _ => Vec::new(),
        };
        {
            let mut v = self.write();
            reset_in(&mut v, kind);
            for e in entries {
                apply_to(&mut v, kind, &e.key, Some(&e.value));
            }
        }
        // Instances that left routing with the view replaced, and those in it now (the
        // follower lists once; later listings arrive as differences through `apply`).
        if let (Kind::Instances, Some(hook)) = (kind, &self.on_routing) {
            let v = self.read();
            let routed = |id: &str| v.instances.values().flatten().any(|r| r.record.id == id);
            let gone: Vec<&String> = routed_before.iter().filter(|id| !routed(id)).collect();
            let now: Vec<String> = v
                .instances
                .values()
                .flatten()
                .map(|r| r.record.id.clone())
                .collect();
            drop(v);
            for id in gone {
                hook(id, false);
            }
            for id in &now {
                hook(id, true);
            }
        }
    }
}

fn reset_in(v: &mut Views, kind: Kind) {
    match kind {
        Kind::Apps => {
            v.apps.clear();
            v.hosts.clear();
        }
        Kind::Users => v.users.clear(),
        Kind::Instances => v.instances.clear(),
        Kind::Sessions => v.sessions.clear(),
        Kind::Lattice => v.lattice = None,
    }
}

fn apply_to(v: &mut Views, kind: Kind, key: &str, value: Option<&[u8]>) {
    let parse_err =
        |e: warden_store::StoreError| tracing::warn!(key, error = %e, "ignoring unreadable record");
    match (kind, value) {
        (Kind::Apps, Some(bytes)) if key.ends_with("/spec") => {
            match decode::<AppSpec>(key, bytes) {
                // A process type (`worker`) serves nothing: it is never an app the gateway
                // knows, so no Host, path or start reaches it.
                Ok(spec) if spec.process.is_some() => {}
                Ok(spec) => {
                    // Only this app's host names change: rebuilding the index over every
                    // app made each app write cost as much as there are apps.
                    let name = spec.name.clone();
                    let spec = Arc::new(spec);
                    let old_hosts = v
                        .apps
                        .insert(name.clone(), spec.clone())
                        .map(|old| old.hosts.clone())
                        .unwrap_or_default();
                    if old_hosts.is_empty() {
                        for h in &spec.hosts {
                            v.hosts.insert(h.to_ascii_lowercase(), name.clone());
                        }
                    } else {
                        rebuild_hosts(v);
                    }
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
                rebuild_hosts(v);
            }
        }
        (Kind::Users, Some(bytes)) => match decode::<UserRecord>(key, bytes) {
            Ok(u) => {
                let fingerprint = Sha256::digest(u.password_hash.as_bytes()).into();
                v.users.insert(
                    u.name.clone(),
                    Arc::new(User {
                        record: u,
                        fingerprint,
                    }),
                );
            }
            Err(e) => parse_err(e),
        },
        (Kind::Users, None) => {
            if let Some(name) = key.strip_prefix("users/") {
                v.users.remove(name);
            }
        }
        (Kind::Instances, Some(bytes)) => match decode::<InstanceRecord>(key, bytes) {
            Ok(r) => upsert_instance(v, r),
            Err(e) => parse_err(e),
        },
        (Kind::Instances, None) => {
            if let Some(id) = key.rsplit('/').next() {
                remove_instance(v, id);
                v.tainted.remove(id);
            }
        }
        (Kind::Sessions, Some(bytes)) => match decode::<SessionRecord>(key, bytes) {
            Ok(sess) => {
                if let Some(hash) = key.strip_prefix("sessions/") {
                    v.sessions.insert(hash.to_owned(), sess);
                }
            }
            Err(e) => parse_err(e),
        },
        (Kind::Sessions, None) => {
            if let Some(hash) = key.strip_prefix("sessions/") {
                v.sessions.remove(hash);
            }
        }
        (Kind::Lattice, Some(bytes)) => match decode::<Lattice>(key, bytes) {
            Ok(l) => v.lattice = Some(Arc::new(l)),
            Err(e) => parse_err(e),
        },
        (Kind::Lattice, None) => v.lattice = None,
        _ => {}
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
    if r.lifetime == Lifetime::PerRequest {
        return;
    }
    match v.tainted.get(&r.id) {
        Some(Some(label)) if *label == r.label => {
            v.tainted.remove(&r.id);
        }
        // A record from before the taint: the instance no longer serves its label.
        Some(_) => {
            remove_instance(v, &r.id);
            return;
        }
        None => {}
    }
    // An instance moves only forward (starting or spare, then ready, then draining), so a
    // starting or spare record of one this gateway routes is an earlier step arriving late:
    // the agent hands an instance to its first request before the store says ready.
    if matches!(r.state, InstanceState::Starting | InstanceState::Spare)
        && v.instances.values().flatten().any(|x| x.record.id == r.id)
    {
        return;
    }
    // Keep the outstanding count of an instance whose record did not change.
    let key = (r.app.clone(), r.label.clone(), r.user_key().to_owned());
    if v.instances
        .get(&key)
        .is_some_and(|l| l.iter().any(|x| x.record == r))
    {
        return;
    }
    remove_instance(v, &r.id);
    if r.state == InstanceState::Ready {
        let routed = Arc::new(Routed {
            record: r,
            outstanding: AtomicUsize::new(0),
            activity: OnceLock::new(),
            signer: OnceLock::new(),
        });
        v.instances.entry(key).or_default().push(routed);
    }
}

fn remove_instance(v: &mut Views, id: &str) {
    v.instances.retain(|_, list| {
        list.retain(|r| r.record.id != id);
        !list.is_empty()
    });
}

/// Starts following every view; resolves once all are loaded.
pub(crate) async fn follow_all(store: Arc<dyn Store>, shared: Arc<Shared>) {
    let mut loaded = Vec::new();
    for (kind, prefix) in [
        (Kind::Apps, keys::APPS),
        (Kind::Users, keys::USERS),
        (Kind::Instances, keys::INSTANCES),
        (Kind::Sessions, keys::SESSIONS),
        (Kind::Lattice, keys::LATTICE),
    ] {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(follow(store.clone(), shared.clone(), kind, prefix, tx));
        loaded.push(rx);
    }
    for mut rx in loaded {
        let _ = rx.wait_for(|l| *l).await;
    }
}

/// Keeps one view current with the store's [`Follower`]: the first listing fills it, every
/// later change (one watch event, or the difference after a compaction) is applied to it.
async fn follow(
    store: Arc<dyn Store>,
    shared: Arc<Shared>,
    kind: Kind,
    prefix: &'static str,
    loaded: watch::Sender<bool>,
) {
    let mut follower = Follower::new(store, prefix);
    while let Some(update) = follower.next().await {
        match update {
            Update::Listed(listing) => {
                shared.replace(kind, &listing.entries);
                shared.mark(kind, listing.revision);
                let _ = loaded.send(true);
            }
            Update::Changes { events, revision } => {
                for ev in &events {
                    let value = match &ev.kind {
                        EventKind::Put(v) => Some(v.as_slice()),
                        EventKind::Delete => None,
                    };
                    shared.apply(kind, &ev.key, value);
                }
                shared.mark(kind, revision);
            }
        }
    }
}

#[cfg(test)]
mod tests;
