//! The last phase of a release's delivery: waiting (bounded) for its rollout.

use std::collections::BTreeMap;

use warden_core::{keys, AppSpec};
use warden_store::{EventKind, Follower, Update};

use super::sink::Sink;
use crate::Api;

/// Longest a release waits for its rollout before it answers anyway.
const ROLLOUT_WAIT: std::time::Duration = std::time::Duration::from_secs(150);

/// Waits (bounded) until no instance of `spec`'s app but a draining one runs an earlier spec
/// and this node's gateway has seen as much: the agents start new instances, hand them the old
/// ones' traffic and drain the old ones. False if the wait ended first.
pub(super) async fn rolled_out(api: &Api, spec: &AppSpec, sink: &Sink) -> bool {
    let deadline = tokio::time::Instant::now() + ROLLOUT_WAIT;
    let mut told = None;
    let prefix = keys::app_instances(&spec.name);
    // The app's instance records, followed: each change is counted as it happens. A store
    // that does not answer says nothing; the follower asks again until the wait ends.
    let mut instances = Follower::new(api.store.clone(), prefix.clone());
    let mut records: BTreeMap<String, warden_core::InstanceRecord> = BTreeMap::new();
    loop {
        let update = tokio::select! {
            u = instances.next() => u,
            () = tokio::time::sleep_until(deadline) => None,
        };
        let revision = match update {
            Some(Update::Listed(listing)) => {
                records = listing
                    .entries
                    .iter()
                    .filter_map(|e| Some((e.key.clone(), serde_json::from_slice(&e.value).ok()?)))
                    .collect();
                // What the gateway must have applied is the last change to these records, not
                // the store's revision now: other keys moved it on (the release's own record),
                // which the gateway's view of instances never sees, so waiting for it would
                // wait out the sync's bound on every release that replaces no instance.
                listing
                    .entries
                    .iter()
                    .map(|e| e.mod_revision)
                    .max()
                    .unwrap_or(0)
            }
            Some(Update::Changes { events, revision }) => {
                for ev in events {
                    match ev.kind {
                        EventKind::Put(v) => match serde_json::from_slice(&v) {
                            Ok(r) => records.insert(ev.key, r),
                            Err(_) => records.remove(&ev.key),
                        },
                        EventKind::Delete => records.remove(&ev.key),
                    };
                }
                revision
            }
            None => {
                sink.line(&format!(
                    "-----> not rolled out within {} s: new requests go to this release, earlier instances still hand over; `warden status` follows it",
                    ROLLOUT_WAIT.as_secs()
                ));
                return false;
            }
        };
        // Every record but a draining one counts: an instance handed to its first request (a
        // start, a spare taken) is recorded ready only behind that request (the agent's
        // `publish_behind`), and until then the store says starting or spare of an instance
        // that serves the earlier release. An earlier release's spares stop at the agents'
        // next tick.
        let old = records
            .values()
            .filter(|r| {
                r.state != warden_core::InstanceState::Draining
                    && r.generation != spec.generation(&r.label)
            })
            .count();
        if old == 0 {
            api.applied(&prefix, revision).await;
            sink.line("-----> rolled out: every ready instance runs this release");
            return true;
        }
        if told != Some(old) {
            sink.line(&format!(
                "-----> rolling out: {old} instance(s) of the earlier release still running; they hand over without dropping a request"
            ));
            told = Some(old);
        }
    }
}
