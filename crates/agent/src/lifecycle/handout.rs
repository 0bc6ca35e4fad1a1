//! Handing an instance to the request waiting for it: a spare of the warm pool taken; a start
//! that became ready settled and told to the requests waiting for it; the connection init's
//! probe made kept for that request; and the record of a handed-out instance (a spare taken, a
//! start that became ready) written behind the request rather than before it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use warden_core::{keys, AppSpec, InstanceError, InstanceRecord, InstanceState, Owner};
use warden_store::{put_json, StoreError};

use super::{Lifecycle, ServeKey, Serving, StartResult, Table};
use crate::metrics;
use crate::sync::lock;

/// How long the record of an instance handed to a waiting request (a spare taken, a start that
/// became ready) waits before it is written (`Lifecycle::publish_behind`): its first request is
/// most likely answered by then. A start a request waits for is also recorded this long after
/// its launch (as starting, if it still is). On a small machine the commit (its CPU and its fsync) would
/// otherwise compete with that very request; meanwhile this node serves the instance from
/// memory, and other nodes see it a few milliseconds later.
const PUBLISH_BEHIND: Duration = Duration::from_millis(10);

/// The first and the longest pause before a refused record of a handed-out instance is written
/// again.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(5);

// === impl Lifecycle (hand-out) ===

impl Lifecycle {
    /// Hands out a spare of `spec`'s app for `label` to `owner`, if one is waiting.
    pub(super) fn take_spare(
        self: &Arc<Self>,
        spec: &AppSpec,
        label: &str,
        owner: &Owner,
    ) -> Option<InstanceRecord> {
        let t = Instant::now();
        let record = take_spare_from(&mut lock(&self.table), spec, label, owner)?;
        self.handed_out(spec, &record, t);
        Some(record)
    }

    /// What follows a spare's hand-out (begun at `t`), outside the table's lock: its record
    /// published behind the request, its pool refilled.
    pub(super) fn handed_out(
        self: &Arc<Self>,
        spec: &AppSpec,
        record: &InstanceRecord,
        t: Instant,
    ) {
        // The record is published behind the request: the gateway asking has the record
        // already, and a store commit is the slowest part of a hand-out.
        let (me, id) = (self.clone(), record.id.clone());
        tokio::spawn(async move { me.publish_behind(id).await });
        self.deps.metrics.started(metrics::Path::Warm, t.elapsed());
        tracing::info!(app = %spec.name, label = %record.label, instance = %record.id, "spare instance handed out");
        self.deps.pools.refill_soon(&spec.name);
    }

    /// Writes the record of an instance just handed to a waiting request (a start that became
    /// ready, a spare taken), [`PUBLISH_BEHIND`] after it: the caller has the record already,
    /// and a store commit (an fsync) is the slowest part of a start's end. Until it lands,
    /// other nodes' gateways see the instance as starting (or spare), and this node's API shows
    /// the agent's own record (see `InstanceAdmin::record`).
    ///
    /// What is written is the agent's record at the time, never the one handed out: a drain, a
    /// taint or an exit may come within the delay. Another write of the record (the drain's,
    /// the taint's) may still land before this one, so once written, the record is compared
    /// with the agent's and written again until they agree; an instance gone meanwhile (its
    /// monitor removed the record) has the record removed again. A refused write (a store
    /// unwell, a full disk) stops nothing, since the instance serves already: it is tried again,
    /// backing off up to [`RETRY_MAX`], for as long as the instance runs. Until it lands, other
    /// nodes route around the instance and a release's rollout counts it as serving.
    pub(super) async fn publish_behind(self: Arc<Self>, id: String) {
        tokio::time::sleep(PUBLISH_BEHIND).await;
        self.publish_now(id).await;
    }

    /// [`Lifecycle::publish_behind`] once its delay is over.
    async fn publish_now(self: Arc<Self>, id: String) {
        let Some(key) = self.record(&id).map(|r| keys::instance(&r.app, &id)) else {
            return;
        };
        let mut pause = RETRY_FIRST;
        while let Err(e) = self.write_current(&id).await {
            // Shutting down: the records go with the node's lease.
            if self.stopping() || matches!(e, StoreError::Closed) {
                return;
            }
            if pause == RETRY_FIRST {
                tracing::warn!(instance = %id, error = %e, "recording an instance that serves failed; trying again while it runs");
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RETRY_MAX);
            // A write that failed may have landed all the same (a timeout), after the
            // instance's monitor removed its record: gone by now, nothing else removes it.
            if self.record(&id).is_none() {
                let _ = self.deps.store.delete(&key).await;
                return;
            }
        }
    }

    /// Whether the store holds `record` at `key` already, under `lease`.
    async fn holds(
        &self,
        key: &str,
        record: &InstanceRecord,
        lease: warden_store::LeaseId,
    ) -> bool {
        match self.deps.store.get(key).await {
            Ok(Some(e)) => {
                e.lease == Some(lease)
                    && warden_store::decode::<InstanceRecord>(key, &e.value)
                        .is_ok_and(|r| r == *record)
            }
            _ => false,
        }
    }

    /// Writes the agent's own record of instance `id` until the store holds what the agent
    /// holds: another write of it (a drain's, a taint's, an earlier snapshot's) may land
    /// between, so once written it is compared with the agent's and written again; an instance
    /// gone meanwhile (its monitor removed the record) has the record removed again, since even
    /// a write that failed (a timeout) may have landed. `Ok` once done or the instance gone.
    pub(super) async fn write_current(&self, id: &str) -> Result<(), StoreError> {
        let current = |id: &str| lock(&self.table).running.get(id).map(|r| r.record.clone());
        let Some(mut written) = current(id) else {
            return Ok(());
        };
        let key = keys::instance(&written.app, id);
        // Each round follows a change the agent made meanwhile; a few cover any real sequence.
        for _ in 0..4 {
            let lease = self.deps.node.lease();
            // A start a request waited for is published twice, after its launch and after its
            // end; for a start shorter than the delay both find the same record, and a read
            // costs less than a commit.
            let put = match self.holds(&key, &written, lease).await {
                true => Ok(0),
                false => put_json(&*self.deps.store, &key, &written, Some(lease)).await,
            };
            let Some(now) = current(id) else {
                let _ = self.deps.store.delete(&key).await;
                return Ok(());
            };
            put?;
            if now == written {
                return Ok(());
            }
            written = now;
        }
        Ok(())
    }
}

/// Takes the oldest spare of `spec`'s app for `label` in `table` and makes it `owner`'s ready
/// instance; [`Lifecycle::handed_out`] does the rest once the table is let go.
pub(super) fn take_spare_from(
    table: &mut Table,
    spec: &AppSpec,
    label: &str,
    owner: &Owner,
) -> Option<InstanceRecord> {
    let generation = spec.generation(label);
    let user = owner.reserved_for();
    let r = table
        .running
        .values_mut()
        .filter(|r| {
            r.record.app == spec.name
                && r.record.label == label
                && r.record.state == InstanceState::Spare
                // A spare of an older spec is the rollout's to stop, never handed out.
                && r.record.generation == generation
                && !r.stopping.load(Ordering::Relaxed)
                // A spare's database login was made for no user (it reads every user's rows
                // of its label): never one user's own instance. `AppSpec::validate` refuses
                // such an app; this holds for a spec stored before it did.
                && !(r.data && user.is_some())
        })
        .min_by_key(|r| r.record.started_at_ms)?;
    r.record.state = InstanceState::Ready;
    r.record.user = owner.reserved_for();
    r.activity.touch();
    Some(r.record.clone())
}

/// How long the connection that came with a new instance's readiness waits for the request
/// that waits for that start (`Lifecycle::keep_first`). That request connects within a
/// millisecond or so; on a loaded machine it may take longer, and a request that went away
/// holds an app with one worker per connection no longer than this.
pub(super) const FIRST_KEPT: Duration = Duration::from_secs(1);

// === impl Lifecycle (the waiting request) ===

impl Lifecycle {
    /// What follows a start a request waited for, behind that request: the instance's record
    /// written ([`Lifecycle::publish_behind`]) and, if a connection was `kept` for the request
    /// ([`Lifecycle::keep_first`]), that connection dropped after [`FIRST_KEPT`] if no request
    /// took it; and `then` (what else the request need not wait for) after [`PUBLISH_BEHIND`].
    pub(super) async fn behind(
        self: Arc<Self>,
        id: String,
        kept: bool,
        then: impl FnOnce() + Send + 'static,
    ) {
        // One timer, and nothing else, before this first waits: the request told runs then.
        tokio::time::sleep(PUBLISH_BEHIND).await;
        then();
        let expire = async {
            if kept {
                tokio::time::sleep(FIRST_KEPT.saturating_sub(PUBLISH_BEHIND)).await;
                self.drop_first(&id);
            }
        };
        tokio::join!(self.clone().publish_now(id.clone()), expire);
    }

    /// Keeps `first`, the connection to a new instance that came with its init's word, for the
    /// request that waits for the start ([`Lifecycle::dial`] hands it out once): that request
    /// then needs no hand-over through init. `run` drops it after [`FIRST_KEPT`] if no request
    /// took it (the request went elsewhere or away), since an app with one worker per
    /// connection serves nothing else while it is held. Says whether it was kept (the instance
    /// may have exited meanwhile).
    pub(super) fn keep_first(&self, id: &str, first: std::net::TcpStream) -> bool {
        match lock(&self.table).running.get_mut(id) {
            Some(r) => {
                r.first = Some(first);
                true
            }
            None => false,
        }
    }

    /// Drops the connection [`Lifecycle::keep_first`] kept, if no request took it.
    fn drop_first(&self, id: &str) {
        if let Some(r) = lock(&self.table).running.get_mut(id) {
            r.first = None;
        }
    }

    /// After a start for `key`: a success counts for its restarts, the start is settled
    /// ([`Lifecycle::settle`]), and the requests waiting on `tx` have the result.
    pub(super) fn settle_and_tell(
        &self,
        key: &ServeKey,
        tx: &watch::Sender<StartResult>,
        result: Result<InstanceRecord, InstanceError>,
    ) {
        if result.is_ok() {
            self.deps.restarts.started(&key.0, &key.1, &key.2);
        }
        self.settle(key.clone(), &result);
        let _ = tx.send(Some(result));
    }

    /// After a start, `key` is free of the start, and the instance serves what its record says
    /// now (a taint may have raised its label meanwhile) if it still runs and that is free.
    pub(super) fn settle(&self, key: ServeKey, result: &Result<InstanceRecord, InstanceError>) {
        let mut table = lock(&self.table);
        if matches!(table.serving.get(&key), Some(Serving::Starting(_))) {
            table.serving.remove(&key);
        }
        if let Ok(r) = result {
            table.serve_if_free(&r.id);
        }
    }
}
