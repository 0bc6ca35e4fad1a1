//! Keeping the pools at their sizes: refills after a take and on every tick, spare starts
//! bounded per node and per app, and trimming what no app asks for any more.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc;
use warden_core::{AppSpec, Owner, StartPath};

use super::Supervisor;
use crate::lifecycle::Purpose;
use crate::pools::PoolKey;
use crate::restarts::Ticket;
use crate::AgentError;

/// How long a refill waits after a take: a start forks and builds a sandbox, which on a small
/// machine would compete for the CPU with the very request that took from the pool.
const REFILL_DELAY: std::time::Duration = std::time::Duration::from_millis(20);
/// Spares starting at once on a node, over all apps and labels.
const MAX_SPARE_STARTS: u32 = 16;
/// Spares of one app starting at once, so that an app whose spares hang until their start
/// timeout cannot hold every start of the node.
const MAX_SPARE_STARTS_PER_APP: u32 = 8;

// === impl Supervisor (pools) ===

impl Supervisor {
    /// Refills the pools of each app a take names, once the request that took is likely
    /// served. The app's spec is read again then: it may have changed or been deleted
    /// meanwhile, and a delete may still be stopping its spares.
    pub(super) async fn refill_on_request(
        self: Arc<Self>,
        mut refills: mpsc::UnboundedReceiver<String>,
    ) {
        loop {
            let app = tokio::select! {
                app = refills.recv() => match app {
                    Some(app) => app,
                    None => return,
                },
                _ = self.stopped() => return,
            };
            let me = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(REFILL_DELAY).await;
                let seen = me.pools.deletions_seen();
                if let Ok(current) = me.load_spec(&app).await {
                    me.refill(&current, seen);
                }
            });
        }
    }

    /// Starts what `spec`'s pools lack on this node, unless an app was deleted since `seen`
    /// (from `Pools::deletions_seen` before `spec` was read): `spec` may be the deleted
    /// app's, and the next tick refills from a fresh listing anyway.
    pub(super) fn refill(self: &Arc<Self>, spec: &AppSpec, seen: u64) {
        // A drained node keeps no pool: whatever it starts it would drain again.
        if self.stopping() || self.node.draining() || self.pools.deletions_seen() != seen {
            return;
        }
        // An app awaiting its first push has nothing to start a pool of.
        if spec.awaits_release() {
            return;
        }
        match spec.start {
            StartPath::Jit => {}
            StartPath::Slot => self.pools.refill_slots(spec),
            StartPath::Warm => self.refill_spares(spec),
        }
    }

    fn refill_spares(self: &Arc<Self>, spec: &AppSpec) {
        for (label, &want) in &spec.warm {
            // A few spares start at a time: a thousand at once would starve the node's lease
            // renewal and the requests being served.
            let (starting, of_app) = self.pools.spare_starts(&spec.name);
            if starting >= MAX_SPARE_STARTS || of_app >= MAX_SPARE_STARTS_PER_APP {
                break;
            }
            let key = (spec.name.clone(), label.clone());
            let pending = self.pools.spare_starts_of(&key);
            let have = self.life.spares(&spec.name, label) + pending as usize;
            let room =
                (MAX_SPARE_STARTS - starting).min(MAX_SPARE_STARTS_PER_APP - of_app) as usize;
            for _ in (have..want as usize).take(room) {
                if !self.pools.may_try(&key) {
                    break;
                }
                let Some(ticket) = self.restarts.try_admit(&key) else {
                    break;
                };
                self.start_spare(spec, key.clone(), ticket);
            }
        }
    }

    fn start_spare(self: &Arc<Self>, spec: &AppSpec, key: PoolKey, ticket: Ticket) {
        self.pools.count_spare_start(&key, 1);
        let (me, spec) = (self.clone(), spec.clone());
        tokio::spawn(async move {
            let result = me
                .life
                .start(&spec, &key.1, &Owner::Shared, Purpose::Spare)
                .await;
            me.pools.count_spare_start(&key, -1);
            match result {
                Ok(_) => {
                    me.pools.succeeded(&key);
                    me.restarts.started(&key.0, &key.1, "");
                    // Keeps a large fill going at its pace rather than the tick's, by the
                    // app's current spec: a pool made smaller or an app changed meanwhile
                    // must not be refilled from the spec this start began with.
                    let seen = me.pools.deletions_seen();
                    if let Ok(current) = me.load_spec(&spec.name).await {
                        me.refill(&current, seen);
                    }
                }
                // A full node is no crash: the pool waits and tries again.
                Err(AgentError::Full { .. }) => me.pools.failed(&key),
                // The monitor already counted an instance that exited.
                Err(AgentError::Exited { .. } | AgentError::ShuttingDown) => {}
                Err(e) => {
                    tracing::warn!(app = %key.0, label = %key.1, error = %e, "starting a spare instance failed");
                    me.restarts
                        .crashed(&key.0, &key.1, "", "", &e.to_string(), "");
                }
            }
            // Over, and counted: the next start of the key may ask.
            drop(ticket);
        });
    }

    /// Stops slots and spares that no app asks for any more (deleted app, other start path,
    /// smaller pool, changed spec).
    pub(super) fn trim_pools(&self, specs: &[AppSpec]) {
        let by_name: HashMap<&str, &AppSpec> = specs.iter().map(|s| (s.name.as_str(), s)).collect();
        self.pools.trim_slots(&by_name);
        for ((app, label), mut ids) in self.life.spares_by_label() {
            let want = by_name
                .get(app.as_str())
                .filter(|s| s.start == StartPath::Warm)
                .and_then(|s| s.warm.get(&label).copied())
                .unwrap_or(0) as usize;
            // The newest go first; the oldest are the warmest.
            ids.sort();
            for (_, id) in ids.into_iter().skip(want) {
                tracing::info!(%app, %label, instance = %id, "stopping a spare the pool no longer wants");
                self.life.kill_soon(id);
            }
        }
    }
}
