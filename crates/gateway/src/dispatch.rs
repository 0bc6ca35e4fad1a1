//! The app half of the request path, the same for every downstream protocol: pick a ready
//! instance for the user's label and owner (starting one if none runs), send the request
//! through the upstream side, move on to the next instance when one refuses the connection
//! or fails a request that may be repeated, and apply the taint an instance reports.
//!
//! It never reads the store: instances come from the views, and starts from the
//! [`warden_core::Instances`] the gateway was given.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warden_core::identity::Signer;
use warden_core::model::Balance;
use warden_core::{AppSpec, InstanceError, InstanceRecord, Instances, Owner};

use crate::error::{Fault, GatewayError, Retry, Stage};
use crate::metrics::Phase;
use crate::state::State;
use crate::upstream::{Answer, Exchange};

/// Attempts per request that may have reached an app and failed, or found no connection for a
/// reason other than refusal: enough to get past a broken instance or two, bounded so a broken
/// app or an exhausted gateway cannot keep a request going around.
const MAX_FAILURES: usize = 4;
/// Refused connections never reached an app and cost a loopback round trip each, so every
/// instance is tried while one may live (seed 003 §6.2); this bound only ends a pathological
/// loop of instances appearing as fast as they refuse.
const MAX_REFUSALS: usize = 64;
/// Instances one request may ask the agent for: one for a request that finds none, one more
/// for a request whose instance died under it.
const MAX_STARTS: usize = 2;

/// An instance's answer, and what must live as long as its body.
pub(crate) struct Forwarded {
    pub answer: Answer,
    /// Stops a per-request instance when dropped: hold it until the body is through.
    pub retire: Option<Retire>,
}

/// Sends the request to an instance of `spec` for `label` and `owner`.
pub(crate) async fn forward(
    state: &State,
    spec: &AppSpec,
    label: &str,
    owner: &Owner,
    x: &Exchange<'_>,
) -> Result<Forwarded, GatewayError> {
    if spec.awaits_release() {
        return Err(GatewayError::NoRelease {
            app: spec.name.clone(),
        });
    }
    if *owner == Owner::Request {
        return one_off(state, spec, label, x).await;
    }
    let answer = dispatch(state, spec, label, owner, x).await?;
    Ok(Forwarded {
        answer,
        retire: None,
    })
}

/// Picks a ready instance (starting one if none runs) and sends the request, moving on to the
/// next instance when one refuses the connection, or fails an idempotent request. Applies the
/// taint an instance reports.
async fn dispatch(
    state: &State,
    spec: &AppSpec,
    label: &str,
    owner: &Owner,
    x: &Exchange<'_>,
) -> Result<Answer, GatewayError> {
    let m = &state.metrics;
    let lor = spec.balance == Balance::LeastOutstanding;
    let mut tried: Vec<String> = Vec::new();
    let mut starts = 0;
    let (mut refusals, mut unsent, mut failures) = (0, 0, 0);
    let mut last = String::new();
    loop {
        let inflight = match state.views.pick(
            &spec.name,
            label,
            owner.user(),
            lor,
            &tried,
            state.config.peers.as_deref(),
        ) {
            Some(i) => i,
            // An instance that just died is replaced as a first request's is: the request
            // waits for the new one. Twice at most, so a request that met a dead instance and
            // then one that died under it still gets its answer.
            None if starts < MAX_STARTS => {
                starts += 1;
                let t = Instant::now();
                let r = start_other_than(state, spec, label, owner, &tried).await?;
                m.phase(Phase::Start, t.elapsed());
                let Some(r) = r else {
                    return Err(none_left(spec, failures, last));
                };
                state.views.add_instance(r);
                continue;
            }
            None => return Err(none_left(spec, failures, last)),
        };
        let instance = &inflight.0.record;
        let _active = inflight.0.begin(&*state.instances);
        let t = Instant::now();
        let signer = inflight.0.signer(&state.config.identity);
        match send(state, spec, instance, signer, x).await {
            Ok(mut answer) => {
                m.phase(Phase::Upstream, t.elapsed());
                let bytes = x.bytes.len() as u64 + answer.body_len();
                state.audit.access(x.user, instance, label, bytes);
                served(state, spec, x, &answer, &instance.id, label, t);
                if let Some(taint) = answer.taint.take() {
                    apply_taint(state, instance, &taint);
                }
                return Ok(answer);
            }
            Err(e) => {
                // Whether the request may go on is the error's to say; what it tells about the
                // instance decides the rest.
                let go_on = match e.retry() {
                    Retry::Safe => true,
                    Retry::IfIdempotent => x.idempotent,
                    Retry::Never => false,
                };
                if !go_on {
                    return Err(give_up(spec, instance, e));
                }
                tried.push(instance.id.clone());
                match e {
                    // Never reached the app: route around it until its record's delete arrives.
                    GatewayError::Refused(f) => {
                        warden_core::log_limited!(info, app = %spec.name, instance = %instance.id, error = %f, "instance refused the connection; trying another");
                        state.views.drop_instance(&instance.id);
                        state.upstream.forget(&instance.id);
                        state.instances.refused(instance);
                        refusals += 1;
                    }
                    // Never sent, and the instance may be fine: another one may take it, a few
                    // times.
                    GatewayError::Unsent(f) => {
                        warden_core::log_limited!(warn, app = %spec.name, instance = %instance.id, error = %f, "no connection to the instance; trying another");
                        unsent += 1;
                    }
                    GatewayError::Broken(f) => {
                        warden_core::log_limited!(info, app = %spec.name, instance = %instance.id, error = %f, "instance failed an idempotent request; trying another");
                        failures += 1;
                        last = f.to_string();
                    }
                    // No other error lets a request go on (`GatewayError::retry`).
                    other => return Err(give_up(spec, instance, other)),
                }
                if refusals >= MAX_REFUSALS || unsent >= MAX_FAILURES || failures >= MAX_FAILURES {
                    return Err(none_left(spec, failures, last));
                }
            }
        }
    }
}

/// How long a request that may not be repeated, already on its way, still waits for an answer
/// from a node gone silent before it fails: a pause this short ends with the answer, a frozen
/// node does not hold the client for the whole upstream timeout.
const SILENT_GRACE: Duration = Duration::from_secs(2);

/// One exchange with `instance`, bounded by the upstream timeout. Dropping the exchange on
/// timeout drops its connection too, so it never goes back to the pool with an answer still
/// owed. On a cluster, it also ends when the instance's node goes silent (it answers no ping,
/// `warden_core::Peers`): a request not yet sent goes elsewhere, an idempotent one is sent
/// again elsewhere at once, any other fails after [`SILENT_GRACE`] unless the answer comes.
async fn send(
    state: &State,
    spec: &AppSpec,
    instance: &InstanceRecord,
    signer: &Signer,
    x: &Exchange<'_>,
) -> Result<Answer, GatewayError> {
    let timeout = state.config.upstream_timeout;
    let sent = AtomicBool::new(false);
    let timed_out = |_| GatewayError::UpstreamTimeout {
        app: spec.name.clone(),
        ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
    };
    let exchange = tokio::time::timeout(timeout, state.upstream.send(instance, signer, x, &sent));
    let Some(peers) = &state.config.peers else {
        return exchange.await.map_err(timed_out)?;
    };
    tokio::pin!(exchange);
    let node = &instance.node;
    tokio::select! {
        r = &mut exchange => return r.map_err(timed_out)?,
        () = peers.silenced(node, Duration::ZERO) => {}
    }
    if !sent.load(Ordering::Relaxed) {
        return Err(GatewayError::Unsent(Fault::new(
            Stage::NodeSilent,
            format!("node {node} stopped answering before the request was sent"),
        )));
    }
    if !x.idempotent {
        tokio::select! {
            r = &mut exchange => return r.map_err(timed_out)?,
            () = peers.silenced(node, SILENT_GRACE) => {}
        }
        return Err(GatewayError::Broken(Fault::new(
            Stage::NodeSilent,
            format!(
                "node {node} stopped answering while it had the request; it was not sent \
                 again, since it may have been applied"
            ),
        )));
    }
    Err(GatewayError::Broken(Fault::new(
        Stage::NodeSilent,
        format!("node {node} stopped answering while it had the request"),
    )))
}

/// Why a request found no instance to answer it: instances that failed it (502, with the last
/// failure), or none took the connection and none could be started (503, try again).
fn none_left(spec: &AppSpec, failures: usize, last: String) -> GatewayError {
    let app = spec.name.clone();
    if failures > 0 {
        return GatewayError::Upstream { app, reason: last };
    }
    GatewayError::Unavailable {
        app,
        reason: "no instance accepted the connection".into(),
    }
}

/// The error a request ends with when it may not go on after `e` at `instance`. Not retried
/// even when idempotent: a timeout (a wedged app would make the client wait once per instance,
/// and the request may still be running where it went).
fn give_up(spec: &AppSpec, instance: &InstanceRecord, e: GatewayError) -> GatewayError {
    match e {
        GatewayError::UpstreamTimeout { .. } => {
            warden_core::log_limited!(warn, app = %spec.name, instance = %instance.id, "instance did not answer in time");
            e
        }
        GatewayError::Refused(f) | GatewayError::Unsent(f) | GatewayError::Broken(f) => {
            warden_core::log_limited!(warn, app = %spec.name, instance = %instance.id, error = %f, "forwarding failed");
            GatewayError::Upstream {
                app: spec.name.clone(),
                reason: f.to_string(),
            }
        }
        e => e,
    }
}

/// Serves a request of a per-request app: a fresh instance, its one response, then the
/// instance is stopped (once the response body is done or dropped) and never reused.
async fn one_off(
    state: &State,
    spec: &AppSpec,
    label: &str,
    x: &Exchange<'_>,
) -> Result<Forwarded, GatewayError> {
    let m = &state.metrics;
    let t = Instant::now();
    let r = start(state, spec, label, &Owner::Request).await?;
    m.phase(Phase::Start, t.elapsed());
    let retire = Retire {
        instances: state.instances.clone(),
        id: r.id.clone(),
    };
    let t = Instant::now();
    let single = Exchange {
        pooled: false,
        ..*x
    };
    let signer = state.config.identity.signer(&r.id);
    match send(state, spec, &r, &signer, &single).await {
        Ok(mut answer) => {
            m.phase(Phase::Upstream, t.elapsed());
            let bytes = x.bytes.len() as u64 + answer.body_len();
            state.audit.access_once(x.user, &r, label, bytes);
            served(state, spec, x, &answer, &r.id, label, t);
            // Nothing can be tainted beyond this one response: the instance dies with it.
            answer.taint = None;
            Ok(Forwarded {
                answer,
                retire: Some(retire),
            })
        }
        Err(GatewayError::Refused(f) | GatewayError::Unsent(f) | GatewayError::Broken(f)) => {
            Err(GatewayError::Upstream {
                app: spec.name.clone(),
                reason: f.to_string(),
            })
        }
        Err(e) => Err(e),
    }
}

/// Stops a per-request instance when dropped.
pub(crate) struct Retire {
    instances: Arc<dyn Instances>,
    id: String,
}

impl Drop for Retire {
    fn drop(&mut self) {
        self.instances.retire(&self.id);
    }
}

/// Asks for an instance that is not one of `tried` (which failed this request), and holds the
/// request until it is ready. The agent may still hand out an instance that has just died,
/// until it has reaped it (a few milliseconds): it is asked again, with short pauses, within
/// the app's start timeout. `None` when it keeps handing out a tried one.
async fn start_other_than(
    state: &State,
    spec: &AppSpec,
    label: &str,
    owner: &Owner,
    tried: &[String],
) -> Result<Option<InstanceRecord>, GatewayError> {
    let deadline = Instant::now() + Duration::from_millis(spec.start_timeout_ms);
    let mut pause = Duration::from_millis(2);
    loop {
        let r = start(state, spec, label, owner).await?;
        if !tried.contains(&r.id) {
            return Ok(Some(r));
        }
        if Instant::now() + pause > deadline {
            return Ok(None);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Asks for an instance and holds the request until it is ready.
async fn start(
    state: &State,
    spec: &AppSpec,
    label: &str,
    owner: &Owner,
) -> Result<InstanceRecord, GatewayError> {
    let wait = Duration::from_millis(spec.start_timeout_ms);
    let app = spec.name.clone();
    let timed_out = || GatewayError::StartTimeout {
        app: spec.name.clone(),
        ms: spec.start_timeout_ms,
    };
    // The agent enforces the start timeout itself; this bound only covers its own stalls.
    match tokio::time::timeout(
        wait + Duration::from_secs(1),
        state.instances.ensure(spec, label, owner),
    )
    .await
    {
        Err(_) | Ok(Err(InstanceError::StartTimeout { .. })) => Err(timed_out()),
        Ok(Ok(r)) => Ok(r),
        Ok(Err(InstanceError::UnknownApp(_))) => {
            Err(GatewayError::NotFound(format!("no app named {app:?}")))
        }
        Ok(Err(InstanceError::CrashLoop { retry_after, .. })) => Err(GatewayError::CrashLoop {
            app,
            // Rounded up: a client that waits this long finds the backoff over.
            retry_after: retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0),
        }),
        Ok(Err(e @ InstanceError::StartFailed { .. })) => {
            warden_core::log_limited!(warn, app = %spec.name, label, error = %e, "instance failed to start");
            Err(GatewayError::StartFailed { app })
        }
        Ok(Err(e)) => Err(GatewayError::Unavailable {
            app,
            reason: e.to_string(),
        }),
    }
}

/// Keeps the request line of an answer from `instance` (sent at `sent`).
fn served(
    state: &State,
    spec: &AppSpec,
    x: &Exchange<'_>,
    answer: &Answer,
    instance: &str,
    label: &str,
    sent: Instant,
) {
    let line = crate::requests::Served {
        method: x.method,
        target: x.target,
        status: answer.status,
        duration_ms: sent.elapsed().as_millis() as u64,
        instance,
        label,
    };
    state.requests.push(&spec.name, &line);
}

/// An instance said it read data of class `taint`: its label becomes the join, and it stops
/// serving the lower label at once. A taint the lattice cannot parse gets the instance stopped:
/// it may hold anything.
fn apply_taint(state: &State, instance: &InstanceRecord, taint: &str) {
    let lattice = state.views.read().lattice.clone();
    let joined = lattice.as_ref().and_then(|l| {
        let old = l.parse(&instance.label).ok()?;
        let t = l.parse(taint).ok()?;
        Some(l.format(&l.join(&old, &t)))
    });
    let instances = state.instances.clone();
    let id = instance.id.clone();
    match joined {
        Some(label) if label == instance.label => {}
        Some(label) => {
            tracing::info!(app = %instance.app, instance = %id, from = %instance.label, to = %label, "instance tainted; relabelled");
            // Both at once, before the response goes out: the next request of the old label
            // finds the instance neither in the views nor from the agent.
            state.views.withdraw_tainted(&id, Some(label.clone()));
            instances.relabel(&id, &label);
            state.audit.taint(instance, &label);
        }
        None => {
            tracing::warn!(app = %instance.app, instance = %id, "instance sent a taint the lattice does not know; stopping it");
            state.views.withdraw_tainted(&id, None);
            // Stopped, not relabelled: the record says to what it could not be raised.
            state.audit.taint(
                instance,
                &format!("{taint:?} (unknown to the lattice: stopped)"),
            );
            tokio::spawn(async move {
                let _ = instances.kill(&id).await;
            });
        }
    }
}
