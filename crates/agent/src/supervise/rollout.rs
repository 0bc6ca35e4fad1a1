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

/// Replacements under way at most: a rollout must not starve the node or its users.
const MAX_REPLACING: usize = 8;

// === impl Supervisor (rollout) ===

impl Supervisor {
    pub(super) fn roll_out(self: &Arc<Self>, apps: &[AppSpec]) {
        for r in self.life.rollable() {
            // A per-request instance ends with its request anyway; its app's spares of an older
            // spec still stop (below), or they would fill the pool for good, never handed out.
            if r.kept || (r.lifetime == Lifetime::PerRequest && r.state != InstanceState::Spare) {
                continue;
            }
            let Some(spec) = apps.iter().find(|a| a.name == r.app) else {
                continue;
            };
            if r.generation == spec.generation(&r.label) {
                continue;
            }
            match r.state {
                InstanceState::Spare => {
                    tracing::info!(app = %r.app, instance = %r.id, "rolling out: stopping a spare of the old spec");
                    self.life.kill_soon(r.id.clone());
                }
                // A user's own instance (or one whose lifetime changed) is not started ahead
                // for nobody: it finishes what it serves, and the next request starts one of
                // the new spec. An app that became a static site runs nothing at all.
                InstanceState::Ready
                    if r.user.is_some()
                        || r.lifetime != spec.lifetime
                        || spec.command.is_empty() =>
                {
                    tracing::info!(app = %r.app, instance = %r.id, "rolling out: draining an instance of the old spec");
                    self.life.drain_soon(r.id.clone());
                }
                InstanceState::Ready => {
                    if self.restarts.waiting(&r.app, &r.label, "").is_some() {
                        continue;
                    }
                    {
                        let mut replacing = lock(&self.replacing);
                        if replacing.len() >= MAX_REPLACING || !replacing.insert(r.id.clone()) {
                            continue;
                        }
                    }
                    let (me, spec, old) = (self.clone(), spec.clone(), r.clone());
                    tokio::spawn(async move {
                        me.replace(&spec, &old).await;
                        lock(&me.replacing).remove(&old.id);
                    });
                }
                _ => {}
            }
        }
    }

    async fn replace(&self, spec: &AppSpec, old: &warden_core::InstanceRecord) {
        let (app, label) = (&old.app, &old.label);
        match self
            .life
            .start(spec, label, &Owner::Shared, Purpose::Replace)
            .await
        {
            Ok(new) => {
                self.restarts.started(app, label, "");
                tracing::info!(%app, %label, old = %old.id, new = %new.id, "rolling out: replacement ready; draining the old instance");
                self.life.take_over(&old.id, &new);
                let _ = self.life.drain(&old.id).await;
            }
            // The monitor counted an instance that ran and exited.
            Err(AgentError::Exited { .. }) => {}
            // No room for one more: the old one makes room first, and the next request starts
            // one of the new spec.
            Err(AgentError::Full { .. }) => {
                tracing::info!(%app, %label, old = %old.id, "rolling out at capacity: draining the old instance first");
                let _ = self.life.drain(&old.id).await;
            }
            // The old one keeps serving; when the app is at fault, the next try waits out the
            // backoff.
            Err(e) => {
                tracing::warn!(%app, %label, old = %old.id, error = %e, "rolling out: the replacement did not start; the old instance keeps serving");
                self.life.count_start_failure(app, label, "", &e);
            }
        }
    }
}
