//! Supervision: idle reaping, desired counts kept across nodes, and restart backoff.
//!
//! Every tick the agent stops idle instances, then compares each app's desired count per label
//! with the shared instances the store lists on all nodes. A missing instance is started by the
//! node whose load is lowest (nodes above the mean by a margin do not start any, seed 003
//! §3.3.2); a surplus kept instance is stopped by the node running most of them. A kept
//! instance that crashes is replaced after an exponential backoff; enough crashes in a row mark
//! a crash loop, published with the last lines of output at `health/<app>/<node>` for
//! `warden status`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use warden_core::{
    keys, model::now_ms, AppHealth, AppSpec, InstanceRecord, InstanceState, LabelHealth, Lifetime,
    NodeRecord,
};
use warden_store::{decode, put_json};

use crate::{lock, Agent, AgentError, Owner};

/// How often the agent supervises.
const TICK: Duration = Duration::from_millis(500);
/// First restart delay after a crash; doubled per crash in a row.
const BACKOFF_START: Duration = Duration::from_millis(500);
/// Longest restart delay.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Crashes in a row that make a crash loop.
const CRASH_LOOP: u32 = 3;
/// An instance that stays up this long ends a run of crashes.
const STABLE_AFTER: Duration = Duration::from_secs(10);
/// A node whose load score is above the cluster mean by more than this starts no instances.
const LOAD_MARGIN: f64 = 0.1;

type LabelKey = (String, String);

#[derive(Default)]
struct LabelState {
    crashes: u32,
    next_start: Option<Instant>,
    next_start_ms: u64,
    last_exit: String,
    last_lines: String,
    up_since: Option<Instant>,
}

#[derive(Default)]
struct State {
    labels: HashMap<LabelKey, LabelState>,
    /// Starts of kept instances in progress on this node.
    pending: HashMap<LabelKey, u32>,
    /// Apps whose health record must be written again.
    dirty: HashSet<String>,
}

/// Restart bookkeeping of kept instances and warm-pool spares on this node, per app and label.
#[derive(Default)]
pub(crate) struct Keeper {
    state: Mutex<State>,
}

pub(crate) fn backoff(crashes: u32) -> Duration {
    let exp = crashes.saturating_sub(1).min(16);
    (BACKOFF_START * 2u32.pow(exp)).min(BACKOFF_MAX)
}

impl Keeper {
    /// A kept instance or a spare of (app, label) crashed or failed to start.
    pub(crate) fn crashed(&self, app: &str, label: &str, status: &str, tail: &str) {
        let mut s = lock(&self.state);
        let l = s
            .labels
            .entry((app.to_owned(), label.to_owned()))
            .or_default();
        l.crashes += 1;
        l.up_since = None;
        let delay = backoff(l.crashes);
        l.next_start = Some(Instant::now() + delay);
        l.next_start_ms = now_ms() + delay.as_millis() as u64;
        l.last_exit = status.to_owned();
        l.last_lines = tail.to_owned();
        tracing::warn!(app, label, crashes = l.crashes, retry_ms = delay.as_millis() as u64, %status, "kept instance or spare crashed; restarting after backoff");
        s.dirty.insert(app.to_owned());
    }

    pub(crate) fn started(&self, app: &str, label: &str) {
        let mut s = lock(&self.state);
        let key = (app.to_owned(), label.to_owned());
        if let Some(l) = s.labels.get_mut(&key) {
            l.up_since = Some(Instant::now());
        }
    }

    pub(crate) fn forget_app(&self, app: &str) {
        let mut s = lock(&self.state);
        s.labels.retain(|(a, _), _| a != app);
        s.pending.retain(|(a, _), _| a != app);
        s.dirty.remove(app);
    }

    /// After a new lease every health record must be written again.
    pub(crate) fn republish_all(&self) {
        let mut s = lock(&self.state);
        let apps: Vec<String> = s.labels.keys().map(|(a, _)| a.clone()).collect();
        s.dirty.extend(apps);
    }

    pub(crate) fn may_start(&self, key: &LabelKey) -> bool {
        let s = lock(&self.state);
        s.labels
            .get(key)
            .and_then(|l| l.next_start)
            .is_none_or(|t| Instant::now() >= t)
    }

    fn pending(&self, key: &LabelKey) -> u32 {
        lock(&self.state).pending.get(key).copied().unwrap_or(0)
    }

    fn add_pending(&self, key: &LabelKey, delta: i32) {
        let mut s = lock(&self.state);
        let n = s.pending.entry(key.clone()).or_default();
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            s.pending.remove(key);
        }
    }

    /// Ends runs of crashes whose instance has stayed up.
    fn settle(&self) {
        let mut s = lock(&self.state);
        let mut settled = Vec::new();
        for ((app, _), l) in s.labels.iter_mut() {
            if l.crashes > 0 && l.up_since.is_some_and(|t| t.elapsed() >= STABLE_AFTER) {
                l.crashes = 0;
                l.next_start = None;
                l.next_start_ms = 0;
                settled.push(app.clone());
            }
        }
        s.dirty.extend(settled);
    }

    /// Health records to write (Some) or delete (None), per app, clearing the dirty marks.
    fn take_dirty(&self) -> Vec<(String, Option<AppHealth>)> {
        let mut s = lock(&self.state);
        let dirty: Vec<String> = s.dirty.drain().collect();
        dirty
            .into_iter()
            .map(|app| {
                let labels: BTreeMap<String, LabelHealth> = s
                    .labels
                    .iter()
                    .filter(|((a, _), l)| *a == app && l.crashes > 0)
                    .map(|((_, label), l)| {
                        (
                            label.clone(),
                            LabelHealth {
                                crashes: l.crashes,
                                crash_loop: l.crashes >= CRASH_LOOP,
                                last_exit: l.last_exit.clone(),
                                last_lines: l.last_lines.clone(),
                                next_start_ms: l.next_start_ms,
                            },
                        )
                    })
                    .collect();
                let health = (!labels.is_empty()).then_some(AppHealth { labels });
                (app, health)
            })
            .collect()
    }
}

// === impl Agent (supervision) ===

impl Agent {
    /// The supervision loop; ends when the agent stops.
    pub(crate) async fn supervise(self) {
        let mut stopping = self.inner.stopping.subscribe();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = stopping.changed() => return,
            }
            self.reap_idle();
            self.cap_logs().await;
            let listed_at = now_ms();
            let seen = self.deletions_seen();
            match self.inner.store.list(keys::APPS).await {
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
                    if let Err(e) = self.keep_desired(&apps).await {
                        tracing::warn!(error = %e, "keeping desired counts failed this round");
                    }
                    self.trim_pools(&apps);
                    for spec in &apps {
                        self.refill(spec, seen);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "listing apps failed this round"),
            }
            self.inner.keeper.settle();
            self.publish_health().await;
        }
    }

    /// Stops ready instances that have served nothing for their app's idle timeout. Kept
    /// instances are exempt: the desired count wants them running.
    fn reap_idle(&self) {
        let now = now_ms();
        let idle: Vec<(String, String, u64)> = lock(&self.inner.running)
            .values()
            .filter(|r| {
                !r.record.kept
                    && r.record.state == InstanceState::Ready
                    && !r.idle_timeout.is_zero()
                    && !r.stopping.load(Ordering::Relaxed)
                    && r.activity
                        .idle_for(now)
                        .is_some_and(|d| d >= r.idle_timeout)
            })
            .map(|r| {
                (
                    r.record.id.clone(),
                    r.record.app.clone(),
                    r.idle_timeout.as_millis() as u64,
                )
            })
            .collect();
        for (id, app, ms) in idle {
            tracing::info!(%app, instance = %id, idle_ms = ms, "stopping idle instance");
            let agent = self.clone();
            tokio::spawn(async move {
                let _ = agent.kill(&id).await;
            });
        }
    }

    /// Stops instances whose app was gone from the store when it was listed at `listed_at`.
    /// Deletions normally stop them at once (see `follow_app_deletes`); this catches a start
    /// that raced the deletion, from a spec a caller such as the gateway still held. Only
    /// instances started before the listing count: an app always exists before its instances
    /// start, so a newer instance may belong to an app created after the listing.
    fn stop_orphans(&self, known: &HashSet<&str>, listed_at: u64) {
        let orphans: Vec<(String, String)> = lock(&self.inner.running)
            .values()
            .filter(|r| {
                !known.contains(r.record.app.as_str())
                    && r.record.started_at_ms < listed_at
                    && !r.stopping.load(Ordering::Relaxed)
            })
            .map(|r| (r.record.id.clone(), r.record.app.clone()))
            .collect();
        for (id, app) in orphans {
            tracing::info!(%app, instance = %id, "stopping an instance of a deleted app");
            let agent = self.clone();
            tokio::spawn(async move {
                let _ = agent.kill(&id).await;
            });
        }
    }

    /// Cuts back the logs of running instances that outgrew `max_log_bytes`. Awaited by the
    /// supervision loop, so two cuts of one file never overlap.
    async fn cap_logs(&self) {
        let max = self.inner.config.max_log_bytes;
        let logs: Vec<(String, std::path::PathBuf)> = lock(&self.inner.running)
            .values()
            .map(|r| (r.record.id.clone(), r.log.clone()))
            .collect();
        let _ = tokio::task::spawn_blocking(move || {
            for (id, log) in logs {
                match crate::process::cap_log(&log, max) {
                    Ok(true) => tracing::info!(instance = %id, max_bytes = max, "instance log cut back to its newer half"),
                    Ok(false) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => tracing::warn!(instance = %id, log = %log.display(), error = %e, "could not cut back an instance's log"),
                }
            }
        })
        .await;
    }

    async fn keep_desired(&self, apps: &[AppSpec]) -> Result<(), AgentError> {
        let store = &*self.inner.store;
        let apps: Vec<&AppSpec> = apps
            .iter()
            .filter(|a| !a.desired.is_empty() && a.lifetime == Lifetime::Shared)
            .collect();
        if apps.is_empty() {
            return Ok(());
        }
        let instances: Vec<InstanceRecord> = list_readable(store, keys::INSTANCES).await?;
        let nodes: Vec<NodeRecord> = list_readable(store, keys::NODES).await?;
        let me = self.node();
        let local: Vec<InstanceRecord> = self.instances();
        for spec in &apps {
            for (label, &want) in &spec.desired {
                let key = (spec.name.clone(), label.clone());
                let serving = |r: &&InstanceRecord| {
                    r.app == spec.name
                        && r.label == *label
                        && r.lifetime == Lifetime::Shared
                        && r.owner.is_none()
                        && r.state != InstanceState::Spare
                };
                let remote: Vec<&InstanceRecord> = instances
                    .iter()
                    .filter(serving)
                    .filter(|r| r.node != me)
                    .collect();
                let mine: Vec<&InstanceRecord> = local.iter().filter(serving).collect();
                let have = remote.len() + mine.len() + self.inner.keeper.pending(&key) as usize;
                let want = want as usize;
                if have < want {
                    if self.inner.keeper.may_start(&key) && placement_target(&nodes, me) {
                        self.start_kept(spec, key);
                    }
                } else if have > want {
                    let kept: Vec<&&InstanceRecord> = mine.iter().filter(|r| r.kept).collect();
                    if let Some(victim) = kept.iter().max_by_key(|r| r.started_at_ms) {
                        if shedding_node(&instances, spec, label, me) {
                            tracing::info!(app = %spec.name, %label, instance = %victim.id, "more instances than desired; stopping one");
                            let (agent, id) = (self.clone(), victim.id.clone());
                            tokio::spawn(async move {
                                let _ = agent.kill(&id).await;
                            });
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn start_kept(&self, spec: &AppSpec, key: LabelKey) {
        self.inner.keeper.add_pending(&key, 1);
        let (agent, spec) = (self.clone(), spec.clone());
        tokio::spawn(async move {
            let (app, label) = (&key.0, &key.1);
            let result = agent
                .start_instance(&spec, label, &Owner::Shared, crate::Purpose::Kept)
                .await;
            agent.inner.keeper.add_pending(&key, -1);
            match &result {
                Ok(r) => {
                    agent.inner.keeper.started(app, label);
                    let key = (app.clone(), label.clone(), String::new());
                    if lock(&agent.inner.running).contains_key(&r.id) {
                        lock(&agent.inner.serving)
                            .entry(key)
                            .or_insert_with(|| crate::Serving::Ready(r.clone()));
                    }
                }
                // The monitor already counted an instance that exited.
                Err(AgentError::Exited { .. }) => {}
                Err(e) => agent.inner.keeper.crashed(app, label, &e.to_string(), ""),
            }
        });
    }

    async fn publish_health(&self) {
        for (app, health) in self.inner.keeper.take_dirty() {
            let key = keys::health(&app, self.node());
            let res = match health {
                Some(h) => put_json(&*self.inner.store, &key, &h, Some(self.lease()))
                    .await
                    .map(|_| ()),
                None => self.inner.store.delete(&key).await.map(|_| ()),
            };
            if let Err(e) = res {
                tracing::warn!(%app, error = %e, "publishing restart state failed");
            }
        }
    }
}

/// The records under `prefix` that decode as `T`. Others are skipped: one unreadable record
/// must not stop the healing of every app. (`apps/<app>/...` also holds non-spec keys, which
/// simply do not decode as a spec.)
async fn list_readable<T: serde::de::DeserializeOwned>(
    store: &dyn warden_store::Store,
    prefix: &str,
) -> Result<Vec<T>, AgentError> {
    Ok(store
        .list(prefix)
        .await?
        .entries
        .iter()
        .filter_map(|e| decode::<T>(&e.key, &e.value).ok())
        .collect())
}

/// True when `me` should start the next missing instance: among nodes not loaded above the
/// mean by more than the margin, the one with fewest instances (then lowest id).
fn placement_target(nodes: &[NodeRecord], me: &str) -> bool {
    if nodes.is_empty() {
        return true;
    }
    let mean = nodes.iter().map(|n| n.load.score()).sum::<f64>() / nodes.len() as f64;
    let best = nodes
        .iter()
        .filter(|n| n.load.score() <= mean + LOAD_MARGIN)
        .min_by(|a, b| {
            (a.load.instances, &a.id)
                .partial_cmp(&(b.load.instances, &b.id))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
    best.is_none_or(|n| n.id == me)
}

/// True when `me` should stop a surplus kept instance of (app, label): the node with most
/// kept instances of it (then highest id).
fn shedding_node(instances: &[InstanceRecord], spec: &AppSpec, label: &str, me: &str) -> bool {
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for r in instances
        .iter()
        .filter(|r| r.app == spec.name && r.label == label && r.kept)
    {
        *per_node.entry(r.node.as_str()).or_default() += 1;
    }
    per_node
        .iter()
        .max_by_key(|(id, n)| (**n, *id))
        .is_none_or(|(id, _)| *id == me)
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_core::HostLoad;

    fn node(id: &str, score: f64, instances: u32) -> NodeRecord {
        NodeRecord {
            id: id.into(),
            hostname: String::new(),
            pid: 1,
            started_at_ms: 0,
            load: HostLoad {
                memory_used: score,
                load_per_core: 0.0,
                instances,
            },
            limits: String::new(),
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(4), Duration::from_secs(4));
        assert_eq!(backoff(40), BACKOFF_MAX);
    }

    #[test]
    fn the_least_busy_node_below_the_mean_starts() {
        let nodes = [node("a", 0.2, 3), node("b", 0.2, 1), node("c", 0.9, 0)];
        // c has no instances but is far above the mean load, so b starts.
        assert!(placement_target(&nodes, "b"));
        assert!(!placement_target(&nodes, "a"));
        assert!(!placement_target(&nodes, "c"));
        assert!(placement_target(&[], "x"));
    }

    #[test]
    fn crashes_in_a_row_make_a_crash_loop_and_are_reported() {
        let k = Keeper::default();
        for _ in 0..CRASH_LOOP {
            k.crashed("web", "PUBLIC", "exit status: 3", "boom");
        }
        assert!(!k.may_start(&("web".into(), "PUBLIC".into())));
        let dirty = k.take_dirty();
        let h = dirty[0].1.as_ref().expect("health record");
        let l = &h.labels["PUBLIC"];
        assert!(l.crash_loop);
        assert_eq!(l.crashes, CRASH_LOOP);
        assert_eq!(l.last_lines, "boom");
        assert!(k.take_dirty().is_empty());
    }
}
