//! Desired counts, this node's part: the scheduler (`crate::schedule`) says in the placement
//! how many kept instances of each app's label this node runs; this starts the missing ones
//! (with backoff after crashes) and drains the surplus (requests in flight finish first).
//! Without a placement yet, nothing is started or stopped.

use std::sync::Arc;

use warden_core::{keys, AppSpec, Lifetime, Owner, Placement};
use warden_store::{get_json, Follower, Update};

use super::Supervisor;
use crate::lifecycle::{Kept, Purpose};
use crate::restarts::{LabelKey, Ticket};
use crate::sync::lock;
use crate::AgentError;

/// Kept instances one call starts at most, per label.
const MAX_KEPT_STARTS: usize = 8;

// === impl Supervisor (desired counts) ===

impl Supervisor {
    /// Reads the placement again (the watch keeps it current; this catches a missed event).
    pub(super) async fn refresh_placement(&self) {
        match get_json::<Placement>(&*self.store, keys::PLACEMENT).await {
            Ok(p) => *lock(&self.placement) = p.map(|(p, _)| p),
            Err(e) => tracing::debug!(error = %e, "reading the placement failed"),
        }
    }

    /// Follows the placement and acts on each change at once, with the store's [`Follower`]:
    /// a change made while its watch was down still arrives.
    pub(super) async fn follow_placement(self: Arc<Self>) {
        let mut placement = Follower::new(self.store.clone(), keys::PLACEMENT);
        loop {
            let update = tokio::select! {
                u = placement.next() => u,
                _ = self.stopped() => return,
            };
            match update {
                Some(Update::Listed(_)) => self.refresh_placement().await,
                Some(Update::Changes { events, .. }) => {
                    // A listing again after a compaction, with nothing changed.
                    if events.is_empty() {
                        continue;
                    }
                    self.refresh_placement().await;
                    match warden_cluster::schedule::readable::<AppSpec>(&*self.store, keys::APPS)
                        .await
                    {
                        Ok(apps) => self.keep_assigned(&apps),
                        Err(e) => tracing::debug!(error = %e, "listing apps failed"),
                    }
                }
                None => return,
            }
        }
    }

    /// Starts and drains this node's kept instances to match the placement. The tick and the
    /// placement's watch both call it; one at a time, or both would count the same missing
    /// instance before either had started it.
    pub(super) fn keep_assigned(&self, apps: &[AppSpec]) {
        let _one_at_a_time = lock(&self.assigning);
        let Some(placement) = lock(&self.placement).clone() else {
            return;
        };
        let me = self.node.id();
        // An app awaiting its first push has nothing to run.
        for spec in apps
            .iter()
            .filter(|a| a.lifetime == Lifetime::Shared && !a.awaits_release())
        {
            for (label, &want) in placement
                .nodes
                .get(me)
                .and_then(|a| a.get(&spec.name))
                .into_iter()
                .flatten()
            {
                let key = (spec.name.clone(), label.clone());
                // Instances of an older spec do not count: they are replaced (below).
                let generation = spec.generation(label);
                let current = self
                    .life
                    .kept(&spec.name, label, &generation)
                    .iter()
                    .filter(|k| k.current)
                    .count();
                let have = current as u32 + self.restarts.pending(&key);
                // A few at a time: a thousand starts at once would starve the lease renewal
                // and the requests being served; the next tick goes on. In a run of crashes,
                // one per backoff window (`Restarts::admit`).
                for _ in (have..want).take(MAX_KEPT_STARTS) {
                    let Some(ticket) = self.restarts.try_admit(&key) else {
                        break;
                    };
                    self.start_kept(spec, key.clone(), ticket);
                }
            }
        }
        for (app, label) in self.life.kept_labels() {
            // Apps that are gone are stopped by the orphan and delete paths.
            let Some(spec) = apps.iter().find(|a| a.name == app) else {
                continue;
            };
            let want = placement.count(me, &app, &label) as usize;
            let (current, old): (Vec<Kept>, Vec<Kept>) = self
                .life
                .kept(&app, &label, &spec.generation(&label))
                .into_iter()
                .partition(|k| k.current);
            // Oldest first: the surplus is the newest, which may not even be ready yet.
            for k in current.iter().skip(want) {
                tracing::info!(%app, %label, instance = %k.id, "the placement keeps fewer here; draining one");
                self.life.drain_soon(k.id.clone());
            }
            // An instance of an older spec serves until one of the current spec is ready in
            // its place (make before break); if those never become ready, it keeps serving.
            let ready: Vec<&Kept> = current.iter().take(want).filter(|k| k.ready).collect();
            for k in old.iter().skip(want.saturating_sub(ready.len())) {
                tracing::info!(%app, %label, instance = %k.id, "rolling out: an instance of the new spec is ready; draining one of the old");
                // Requests that find no instance in a gateway's view get the new one.
                if let Some(new) = ready.first().and_then(|n| self.life.record(&n.id)) {
                    self.life.take_over(&k.id, &new);
                }
                self.life.drain_soon(k.id.clone());
            }
        }
    }

    fn start_kept(&self, spec: &AppSpec, key: LabelKey, ticket: Ticket) {
        self.restarts.add_pending(&key, 1);
        let (life, restarts, spec) = (self.life.clone(), self.restarts.clone(), spec.clone());
        tokio::spawn(async move {
            let (app, label) = (&key.0, &key.1);
            let result = life
                .start(&spec, label, &Owner::Shared, Purpose::Kept)
                .await;
            restarts.add_pending(&key, -1);
            match &result {
                Ok(r) => {
                    restarts.started(app, label, "");
                    life.serve_if_free(r);
                }
                // The monitor already counted an instance that exited.
                Err(AgentError::Exited { .. }) => {}
                // No room: an instance of an older spec, if one runs, makes room first.
                Err(e @ AgentError::Full { .. }) => {
                    let generation = spec.generation(label);
                    let kept = life.kept(app, label, &generation);
                    if let Some(old) = kept.iter().find(|k| !k.current) {
                        tracing::info!(%app, %label, instance = %old.id, "rolling out at capacity: draining an instance of the old spec first");
                        life.drain_soon(old.id.clone());
                    } else {
                        tracing::warn!(%app, %label, error = %e, "no room for a kept instance here");
                    }
                }
                Err(e) => {
                    tracing::warn!(%app, %label, error = %e, "a kept instance did not start");
                    life.count_start_failure(app, label, "", e);
                }
            }
            // Over, and counted: the next start of the key may ask.
            drop(ticket);
        });
    }
}
