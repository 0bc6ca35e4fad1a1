//! Stopping an instance without failing a request: its record says `draining`, so gateways
//! send it nothing new (and drop their idle connections to it) and this node's port refuses new
//! joins; the requests in flight finish, within a bound; then it stops like any other.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use warden_core::{keys, model::now_ms, InstanceState};
use warden_store::put_json;

use super::{record_key, Lifecycle};
use crate::sync::lock;
use crate::AgentError;

/// Time for every gateway's view to see the record change before in-flight counts are trusted:
/// a request picked just before may still be on its way.
const SETTLE: Duration = Duration::from_millis(300);
/// Longest wait for requests in flight; then the instance stops regardless.
const MAX_WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(25);

/// A kept instance as `Lifecycle::kept` reports it.
pub(crate) struct Kept {
    pub id: String,
    /// Started from the spec's current generation.
    pub current: bool,
    pub ready: bool,
}

// === impl Lifecycle (drain) ===

impl Lifecycle {
    /// Drains `id` and stops it; returns once it is gone.
    pub(crate) async fn drain(&self, id: &str) -> Result<(), AgentError> {
        let marked = {
            let mut table = lock(&self.table);
            let r = table
                .running
                .get(id)
                .ok_or_else(|| AgentError::UnknownInstance(id.to_owned()))?;
            if r.record.state == InstanceState::Draining || r.stopping.load(Ordering::Relaxed) {
                return Ok(());
            }
            if r.record.state == InstanceState::Starting {
                // Not ready, so nothing routes to it: there is nothing to wait for.
                None
            } else {
                // Found just above, under the same lock.
                table.mark_draining(id)
            }
        };
        let Some((record, activity)) = marked else {
            return self.kill(id).await;
        };

        tracing::info!(app = %record.app, label = %record.label, instance = %id, "draining instance");
        let key = keys::instance(&record.app, id);
        if let Err(e) = put_json(
            &*self.deps.store,
            &key,
            &record,
            Some(self.deps.node.lease()),
        )
        .await
        {
            // The gateways will find it gone when it stops, and move on: a refused connection
            // is retried elsewhere.
            tracing::warn!(instance = %id, error = %e, "could not mark an instance as draining");
        }
        tokio::time::sleep(SETTLE).await;
        let deadline = tokio::time::Instant::now() + MAX_WAIT;
        while activity.idle_for(now_ms()).is_none() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(POLL).await;
        }
        self.kill(id).await
    }

    /// Drains `id` in the background.
    pub(crate) fn drain_soon(self: &Arc<Self>, id: String) {
        let me = self.clone();
        tokio::spawn(async move {
            let _ = me.drain(&id).await;
        });
    }

    /// Kept instances of (app, label) that are not draining or stopping, oldest first, each
    /// saying whether it runs `generation` of the spec and whether it is ready.
    pub(crate) fn kept(&self, app: &str, label: &str, generation: &str) -> Vec<Kept> {
        let mut v: Vec<(u64, Kept)> = lock(&self.table)
            .running
            .values()
            .filter(|r| {
                r.record.kept
                    && r.record.app == app
                    && r.record.label == label
                    && r.record.user.is_none()
                    && r.record.state != InstanceState::Draining
                    && r.record.state != InstanceState::Spare
                    && !r.stopping.load(Ordering::Relaxed)
            })
            .map(|r| {
                (
                    r.record.started_at_ms,
                    Kept {
                        id: r.record.id.clone(),
                        current: r.record.generation == generation,
                        ready: r.record.state == InstanceState::Ready,
                    },
                )
            })
            .collect();
        v.sort_by(|a, b| (a.0, &a.1.id).cmp(&(b.0, &b.1.id)));
        v.into_iter().map(|(_, k)| k).collect()
    }

    /// Takes `old`'s place for its label and owner with `new` (a replacement of a newer spec):
    /// requests that find no instance in the gateway's view get `new` from now on.
    pub(crate) fn take_over(&self, old: &str, new: &warden_core::InstanceRecord) {
        let mut table = lock(&self.table);
        if let Some(key) = record_key(new) {
            table.unserve(&key, old);
        }
        table.serve_if_free(&new.id);
    }

    /// Records of the instances that are neither draining nor being stopped.
    pub(crate) fn rollable(&self) -> Vec<warden_core::InstanceRecord> {
        lock(&self.table)
            .running
            .values()
            .filter(|r| {
                r.record.state != InstanceState::Draining && !r.stopping.load(Ordering::Relaxed)
            })
            .map(|r| r.record.clone())
            .collect()
    }

    /// Every (app, label) with a kept instance that is not draining or stopping.
    pub(crate) fn kept_labels(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = lock(&self.table)
            .running
            .values()
            .filter(|r| {
                r.record.kept
                    && r.record.user.is_none()
                    && r.record.state != InstanceState::Draining
                    && !r.stopping.load(Ordering::Relaxed)
            })
            .map(|r| (r.record.app.clone(), r.record.label.clone()))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Ids of instances not draining or stopping: what a drained node still has to move.
    pub(crate) fn undrained(&self) -> Vec<String> {
        lock(&self.table)
            .running
            .values()
            .filter(|r| {
                r.record.state != InstanceState::Draining && !r.stopping.load(Ordering::Relaxed)
            })
            .map(|r| r.record.id.clone())
            .collect()
    }
}
