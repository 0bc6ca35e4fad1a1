//! Rolling out a changed app spec to the instances nobody keeps: each shared or per-user
//! instance started from an older generation of its app's spec (`AppSpec::generation`) is
//! replaced by one of the current spec, started first; only once that one is ready does the old
//! one drain (its requests in flight finish). A replacement that fails leaves the old instance
//! serving, and the next try waits out the crash backoff. Spares of an older spec stop (the
//! pool refills with the current one); per-request instances end with their request anyway.
//! Kept instances roll in `desired.rs`, by the same rule.

use std::sync::Arc;

use warden_core::{AppSpec, InstanceState, Lifetime, Owner};

use super::Supervisor;
use crate::lifecycle::Purpose;
use crate::sync::lock;
use crate::AgentError;

/// Replacements one tick begins at most: a rollout must not starve the node.
const MAX_REPLACEMENTS: usize = 8;

// === impl Supervisor (rollout) ===

impl Supervisor {
    pub(super) fn roll_out(self: &Arc<Self>, apps: &[AppSpec]) {
        let mut begun = 0;
        for r in self.life.instances() {
            if r.kept || r.lifetime == Lifetime::PerRequest {
                continue;
            }
            let Some(spec) = apps.iter().find(|a| a.name == r.app) else {
                continue;
            };
            if r.generation == spec.generation() {
                continue;
            }
            match r.state {
                InstanceState::Spare => {
                    tracing::info!(app = %r.app, instance = %r.id, "rolling out: stopping a spare of the old spec");
                    self.life.kill_soon(r.id.clone());
                }
                InstanceState::Ready if begun < MAX_REPLACEMENTS => {
                    let owner = r.owner.clone().map_or(Owner::Shared, Owner::User);
                    let crash_owner = r.owner.clone().unwrap_or_default();
                    if self
                        .restarts
                        .waiting(&r.app, &r.label, &crash_owner)
                        .is_some()
                        || !lock(&self.replacing).insert(r.id.clone())
                    {
                        continue;
                    }
                    begun += 1;
                    let (me, spec, old) = (self.clone(), spec.clone(), r.clone());
                    tokio::spawn(async move {
                        me.replace(&spec, &old, &owner, &crash_owner).await;
                        lock(&me.replacing).remove(&old.id);
                    });
                }
                _ => {}
            }
        }
    }

    async fn replace(
        &self,
        spec: &AppSpec,
        old: &warden_core::InstanceRecord,
        owner: &Owner,
        crash_owner: &str,
    ) {
        let (app, label) = (&old.app, &old.label);
        match self.life.start(spec, label, owner, Purpose::Serve).await {
            Ok(new) => {
                self.restarts.started(app, label, crash_owner);
                tracing::info!(%app, %label, old = %old.id, new = %new.id, "rolling out: replacement ready; draining the old instance");
                self.life.take_over(&old.id, &new);
                let _ = self.life.drain(&old.id).await;
            }
            // The monitor counted an instance that ran and exited.
            Err(AgentError::Exited { .. }) => {}
            Err(e @ AgentError::Launch { .. }) => {
                tracing::warn!(%app, %label, old = %old.id, error = %e, "rolling out: the replacement did not start; the old instance keeps serving");
                self.restarts
                    .crashed(app, label, crash_owner, &e.to_string(), "");
            }
            // Full, shutting down: the old one serves, and the next tick tries again.
            Err(e) => {
                tracing::debug!(%app, %label, old = %old.id, error = %e, "rolling out: no replacement this time");
            }
        }
    }
}
