//! The supervision tick: idle reaping, orphans, log caps, then desired counts and pools from
//! one listing of the apps, then restart state.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use warden_core::{keys, model::now_ms, AppSpec};
use warden_store::{decode, put_json};

use super::Supervisor;
use crate::logs;

/// How often the agent supervises.
const TICK: Duration = Duration::from_millis(500);

// === impl Supervisor (tick) ===

impl Supervisor {
    /// The supervision loop; ends when the agent stops.
    pub(super) async fn tick(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = self.stopped() => return,
            }
            self.reap_idle();
            self.cap_logs().await;
            let listed_at = now_ms();
            let seen = self.pools.deletions_seen();
            match self.store.list(keys::APPS).await {
                Ok(listing) => {
                    // An app whose spec cannot be read still exists: only missing specs count.
                    let names: HashSet<&str> = listing
                        .entries
                        .iter()
                        .filter_map(|e| keys::app_of_spec(&e.key))
                        .collect();
                    self.stop_orphans(&names, listed_at);
                    let apps: Vec<AppSpec> = listing
                        .entries
                        .iter()
                        .filter_map(|e| decode::<AppSpec>(&e.key, &e.value).ok())
                        .collect();
                    self.refresh_placement().await;
                    self.follow_drain_order().await;
                    self.keep_assigned(&apps);
                    self.roll_out(&apps);
                    self.trim_pools(&apps);
                    for spec in &apps {
                        self.refill(spec, seen);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "listing apps failed this round"),
            }
            self.restarts.settle();
            self.publish_health().await;
        }
    }

    /// Stops ready instances that have served nothing for their app's idle timeout.
    fn reap_idle(&self) {
        for (id, app, ms) in self.life.idle(now_ms()) {
            tracing::info!(%app, instance = %id, idle_ms = ms, "stopping idle instance");
            self.life.kill_soon(id);
        }
    }

    /// Stops instances whose app was gone from the store when it was listed at `listed_at`.
    /// Deletions normally stop them at once (see `follow_app_deletes`); this catches a start
    /// that raced the deletion, from a spec a caller such as the gateway still held. Only
    /// instances started before the listing count: an app always exists before its instances
    /// start, so a newer instance may belong to an app created after the listing.
    fn stop_orphans(&self, known: &HashSet<&str>, listed_at: u64) {
        for (id, app) in self.life.orphans(known, listed_at) {
            tracing::info!(%app, instance = %id, "stopping an instance of a deleted app");
            self.life.kill_soon(id);
        }
    }

    /// Cuts back the logs of running instances that outgrew `max_log_bytes`. Awaited by the
    /// supervision loop, so two cuts of one file never overlap.
    async fn cap_logs(&self) {
        let max = self.max_log_bytes;
        let files = self.life.log_files();
        let _ = tokio::task::spawn_blocking(move || {
            for (id, log) in files {
                match logs::cap(&log, max) {
                    Ok(true) => tracing::info!(instance = %id, max_bytes = max, "instance log cut back to its newer half"),
                    Ok(false) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => tracing::warn!(instance = %id, log = %log.display(), error = %e, "could not cut back an instance's log"),
                }
            }
        })
        .await;
    }

    async fn publish_health(&self) {
        for (app, health) in self.restarts.take_dirty() {
            let key = keys::health(&app, self.node.id());
            let res = match health {
                Some(h) => put_json(&*self.store, &key, &h, Some(self.node.lease()))
                    .await
                    .map(|_| ()),
                None => self.store.delete(&key).await.map(|_| ()),
            };
            if let Err(e) = res {
                tracing::warn!(%app, error = %e, "publishing restart state failed");
            }
        }
    }
}
