//! The agent's background duties: the node's lease and record, stopping the instances of
//! deleted apps, and a tick every half second that reaps idle instances, caps logs, keeps
//! desired counts ([`desired`]), trims and refills the pools ([`refill`]) and publishes restart
//! state ([`tick`]).
//!
//! This module decides and starts; the state it works on belongs to `crate::lifecycle`,
//! `crate::pools`, `crate::restarts` and `crate::node`.

mod desired;
mod drain;
mod refill;
mod rollout;
mod tick;

pub(crate) use drain::drain_before_stop;

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use warden_core::{keys, AppSpec};
use warden_store::{get_json, EventKind, Follower, Store, StoreError, Update};

use crate::lifecycle::Lifecycle;
use crate::pools::Pools;
use crate::restarts::Restarts;
use crate::AgentError;
use warden_cluster::node::Node;

/// What the supervisor works with.
pub(crate) struct Supervisor {
    pub store: Arc<dyn Store>,
    pub node: Arc<Node>,
    pub life: Arc<Lifecycle>,
    pub pools: Arc<Pools>,
    pub restarts: Arc<Restarts>,
    /// Size at which an instance's log is cut back.
    pub max_log_bytes: u64,
    pub stopping: watch::Receiver<bool>,
    /// The placement as last read (`None` before the first scheduler wrote one).
    pub placement: std::sync::Mutex<Option<warden_core::Placement>>,
    /// Held while this node's kept instances are matched to the placement.
    pub assigning: std::sync::Mutex<()>,
    /// Instances being replaced by the rollout of a changed spec.
    pub replacing: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Stands for scheduler and schedules while elected.
    pub scheduler: Arc<warden_cluster::schedule::Scheduler>,
}

// === impl Supervisor ===

impl Supervisor {
    /// Starts every background duty; each ends when the agent stops. `refills` carries the apps
    /// whose pools were just taken from.
    pub(crate) fn spawn(self: Arc<Self>, refills: mpsc::UnboundedReceiver<String>) {
        tokio::spawn(self.clone().renew_lease());
        tokio::spawn(self.clone().follow_app_deletes());
        tokio::spawn(self.clone().refill_on_request(refills));
        tokio::spawn(self.clone().follow_placement());
        tokio::spawn(self.scheduler.clone().run());
        tokio::spawn(self.tick());
    }

    fn stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Resolves when the agent starts stopping.
    async fn stopped(&self) {
        let mut rx = self.stopping.clone();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// The app's spec as the store holds it.
    async fn load_spec(&self, app: &str) -> Result<AppSpec, AgentError> {
        let (spec, _) = get_json::<AppSpec>(&*self.store, &keys::app_spec(app))
            .await?
            .ok_or_else(|| AgentError::UnknownApp(app.to_owned()))?;
        Ok(spec)
    }

    /// Keeps the lease alive and the node's load current; if the lease was lost (the store
    /// expired it while we stalled), takes a new one and writes the node's records again so
    /// nothing stays missing.
    async fn renew_lease(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.node.renew_every()) => {}
                _ = self.stopped() => return,
            }
            match self.node.keep_alive().await {
                Ok(()) => {
                    if let Err(e) = self.node.publish(self.life.count()).await {
                        tracing::warn!(error = %e, "publishing the node's load failed");
                    }
                }
                Err(StoreError::LeaseNotFound(_)) => {
                    tracing::warn!(node = %self.node.id(), "node lease was lost; registering again");
                    if let Err(e) = self.reregister().await {
                        tracing::error!(error = %e, "re-registering the node failed");
                    }
                }
                Err(StoreError::Closed) => return,
                Err(e) => tracing::warn!(error = %e, "lease keep-alive failed"),
            }
        }
    }

    async fn reregister(&self) -> Result<(), AgentError> {
        self.node.renew().await?;
        self.node.publish(self.life.count()).await?;
        self.life.republish().await?;
        self.restarts.republish_all();
        Ok(())
    }

    /// Stops the instances of apps that are deleted. Follows `apps/` with the store's
    /// [`Follower`]: a delete made while its watch was down, or hidden by a compaction, still
    /// arrives.
    async fn follow_app_deletes(self: Arc<Self>) {
        let mut apps = Follower::new(self.store.clone(), keys::APPS);
        loop {
            let update = tokio::select! {
                u = apps.next() => u,
                _ = self.stopped() => return,
            };
            let events = match update {
                Some(Update::Changes { events, .. }) => events,
                // What is listed exists; apps deleted before are the orphan path's.
                Some(Update::Listed(_)) => continue,
                None => return,
            };
            for ev in events {
                if ev.kind != EventKind::Delete {
                    continue;
                }
                if let Some(app) = keys::app_of_spec(&ev.key) {
                    self.app_deleted(app).await;
                }
            }
        }
    }

    async fn app_deleted(&self, app: &str) {
        self.pools.app_deleted(app);
        for id in self.life.ids_of(app) {
            let _ = self.life.kill(&id).await;
        }
        self.restarts.forget_app(app);
        let _ = self.store.delete(&keys::health(app, self.node.id())).await;
    }
}
