//! The app half of the request path: authenticate, authorise, pick or start an instance,
//! forward with retries, apply taint.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::{Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use warden_agent::{Agent, AgentError, Owner};
use warden_core::model::Balance;
use warden_core::{AppSpec, InstanceRecord};

use crate::proxy::{self, Failure};
use crate::respond::{Body, GatewayError};
use crate::views::User;
use crate::State;

/// Attempts per request that may have reached an app and failed, or found no connection for a
/// reason other than refusal: enough to get past a broken instance or two, bounded so a broken
/// app or an exhausted gateway cannot keep a request going around.
const MAX_FAILURES: usize = 4;
/// Refused connections never reached an app and cost a loopback round trip each, so every
/// instance is tried while one may live (seed 003 §6.2); this bound only ends a pathological
/// loop of instances appearing as fast as they refuse.
const MAX_REFUSALS: usize = 64;

pub(crate) async fn to_app(
    state: &State,
    req: Request<Incoming>,
    peer: SocketAddr,
    https: bool,
    app: &str,
    path_and_query: &str,
) -> Response<Body> {
    match serve(state, req, peer, https, app, path_and_query).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

async fn serve(
    state: &State,
    req: Request<Incoming>,
    peer: SocketAddr,
    https: bool,
    app: &str,
    path_and_query: &str,
) -> Result<Response<Body>, GatewayError> {
    let m = &state.metrics;
    // Authenticate before saying whether the app exists, so strangers learn nothing.
    let t = Instant::now();
    let user = state
        .auth
        .authenticate(&state.views, req.headers(), peer.ip(), m)
        .await?;
    m.phase("auth", t.elapsed());
    let spec = state.views.read().apps.get(app).cloned();
    let spec = spec.ok_or_else(|| GatewayError::NotFound(format!("no app named {app:?}")))?;
    admit(&spec, &user)?;
    if let (Some(root), Some(rel)) = (&spec.static_dir, static_path(&spec, path_and_query)) {
        return Ok(crate::statics::serve(root, rel, req.method(), req.headers()).await);
    }

    let limit = state.config.max_body_bytes;
    let declared = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(GatewayError::PayloadTooLarge { limit });
    }
    let (parts, body) = req.into_parts();
    // Buffered so a request refused by a dying instance can be sent to the next one.
    let body = Limited::new(body, limit).collect().await.map_err(|e| {
        if e.downcast_ref::<http_body_util::LengthLimitError>()
            .is_some()
        {
            GatewayError::PayloadTooLarge { limit }
        } else {
            GatewayError::BadRequest(format!("reading the request body failed: {e}"))
        }
    })?;
    let label = user.record.clearance.as_str();
    let who = proxy::Forwarded {
        user: &user.record.name,
        label,
        client: peer.ip(),
        https,
    };
    let prepared = proxy::prepare(parts, body.to_bytes(), who);
    let owner = Owner::for_lifetime(spec.lifetime, &user.record.name);
    if owner == Owner::Request {
        return one_off(state, &spec, label, &prepared, path_and_query).await;
    }
    let mut sender = HyperSender {
        prepared: &prepared,
        path_and_query,
    };
    dispatch(state, &spec, label, &owner, &mut sender).await
}

/// Whether `user` is in a group `spec` admits (every user, when it names none).
pub(crate) fn admit(spec: &AppSpec, user: &User) -> Result<(), GatewayError> {
    let groups = &user.record.groups;
    if spec.groups.is_empty() || spec.groups.iter().any(|g| groups.contains(g)) {
        return Ok(());
    }
    Err(GatewayError::Forbidden {
        user: user.record.name.clone(),
        app: spec.name.clone(),
    })
}

/// The path within the app's static directory that `path_and_query` asks for, if the app has
/// one and the path is under its static prefix.
pub(crate) fn static_path<'a>(spec: &AppSpec, path_and_query: &'a str) -> Option<&'a str> {
    spec.static_dir.as_ref()?;
    let path = path_and_query.split('?').next().unwrap_or("/");
    path.strip_prefix(spec.static_prefix.as_str())
}

/// One way of sending a request to an instance: hyper's client for requests hyper parsed, or
/// the gateway's own HTTP/1.1 exchange on the fast lane (`crate::h1`).
pub(crate) trait Sender {
    /// What an instance answered.
    type Response;
    /// Whether the request may be sent again after it may have reached an app.
    fn idempotent(&self) -> bool;
    /// Sends the request to the instance at `addr`.
    async fn send(&mut self, state: &State, addr: &str) -> Result<Self::Response, Failure>;
    /// Removes the taint header from a response, returning its value.
    fn take_taint(resp: &mut Self::Response) -> Option<String>;
}

struct HyperSender<'a> {
    prepared: &'a proxy::Prepared,
    path_and_query: &'a str,
}

impl Sender for HyperSender<'_> {
    type Response = Response<Body>;

    fn idempotent(&self) -> bool {
        self.prepared.idempotent()
    }

    async fn send(&mut self, state: &State, addr: &str) -> Result<Response<Body>, Failure> {
        self.prepared
            .send(
                &state.upstream,
                addr,
                self.path_and_query,
                state.config.upstream_timeout,
            )
            .await
    }

    fn take_taint(resp: &mut Response<Body>) -> Option<String> {
        let v = resp.headers_mut().remove(proxy::TAINT)?;
        Some(v.to_str().unwrap_or("").to_owned())
    }
}

/// Picks a ready instance of `spec` for `label` and `owner` (starting one if none runs) and
/// sends the request, moving on to the next instance when one refuses the connection, or fails
/// an idempotent request. Applies the taint an instance reports.
pub(crate) async fn dispatch<S: Sender>(
    state: &State,
    spec: &AppSpec,
    label: &str,
    owner: &Owner,
    sender: &mut S,
) -> Result<S::Response, GatewayError> {
    let m = &state.metrics;
    let owner_name = match owner {
        Owner::User(u) => u.as_str(),
        _ => "",
    };

    let lor = spec.balance == Balance::LeastOutstanding;
    let mut tried: Vec<String> = Vec::new();
    let mut started = false;
    let (mut refusals, mut unsent, mut failures) = (0, 0, 0);
    let mut last = String::new();
    loop {
        let inflight = match state.views.pick(&spec.name, label, owner_name, lor, &tried) {
            Some(i) => i,
            None if !started => {
                started = true;
                let t = Instant::now();
                let r = start(state, spec, label, owner).await?;
                m.phase("start", t.elapsed());
                if tried.contains(&r.id) {
                    // The agent has not noticed yet that this instance is gone.
                    return Err(none_left(spec, failures, last));
                }
                state.views.add_instance(r);
                continue;
            }
            None => return Err(none_left(spec, failures, last)),
        };
        let instance = &inflight.0.record;
        let _active = inflight.0.begin(&state.agent);
        let t = Instant::now();
        match sender.send(state, &instance.addr).await {
            Ok(mut resp) => {
                m.phase("upstream", t.elapsed());
                if let Some(taint) = S::take_taint(&mut resp) {
                    apply_taint(state, instance, &taint);
                }
                return Ok(resp);
            }
            Err(Failure::Refused(e)) => {
                // Never reached the app: route around it until its record's delete arrives.
                tracing::info!(app = %spec.name, instance = %instance.id, error = %e, "instance refused the connection; trying another");
                state.views.drop_instance(&instance.id);
                state.upstream.forget(&instance.addr);
                state.raw_upstream.forget(&instance.addr);
                tried.push(instance.id.clone());
                refusals += 1;
                if refusals >= MAX_REFUSALS {
                    return Err(none_left(spec, failures, last));
                }
            }
            // Never sent, and the instance may be fine: another one may take it, a few times.
            Err(Failure::Unsent(e)) => {
                tracing::warn!(app = %spec.name, instance = %instance.id, error = %e, "no connection to the instance; trying another");
                tried.push(instance.id.clone());
                unsent += 1;
                if unsent >= MAX_FAILURES {
                    return Err(none_left(spec, failures, last));
                }
            }
            Err(Failure::Other(e)) if sender.idempotent() => {
                tracing::info!(app = %spec.name, instance = %instance.id, error = %e, "instance failed an idempotent request; trying another");
                tried.push(instance.id.clone());
                failures += 1;
                last = e;
                if failures >= MAX_FAILURES {
                    return Err(none_left(spec, failures, last));
                }
            }
            // Not retried, even when idempotent: a wedged app would make the client wait once per
            // instance, and the request may still be running where it went.
            Err(Failure::TimedOut) => {
                tracing::warn!(app = %spec.name, instance = %instance.id, "instance did not answer in time");
                return Err(upstream_timeout(state, &spec.name));
            }
            Err(Failure::Other(e)) => {
                tracing::warn!(app = %spec.name, instance = %instance.id, error = %e, "forwarding failed");
                return Err(GatewayError::Upstream {
                    app: spec.name.clone(),
                    reason: e,
                });
            }
        }
    }
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

/// Serves a request of a per-request app: a fresh instance, its one response, then the
/// instance is stopped (once the response body is done or dropped) and never reused.
async fn one_off(
    state: &State,
    spec: &AppSpec,
    label: &str,
    prepared: &proxy::Prepared,
    path_and_query: &str,
) -> Result<Response<Body>, GatewayError> {
    let m = &state.metrics;
    let t = Instant::now();
    let r = start(state, spec, label, &Owner::Request).await?;
    m.phase("start", t.elapsed());
    let retire = Retire {
        agent: state.agent.clone(),
        id: r.id.clone(),
    };
    let t = Instant::now();
    let result = prepared
        .send(
            &state.upstream,
            &r.addr,
            path_and_query,
            state.config.upstream_timeout,
        )
        .await;
    state.upstream.forget(&r.addr);
    match result {
        Ok(resp) => {
            m.phase("upstream", t.elapsed());
            let (mut parts, body) = resp.into_parts();
            // Nothing can be tainted beyond this one response: the instance dies with it.
            parts.headers.remove(proxy::TAINT);
            let body = body
                .map_frame(move |f| {
                    let _ = &retire;
                    f
                })
                .boxed();
            Ok(Response::from_parts(parts, body))
        }
        Err(Failure::Refused(e) | Failure::Unsent(e) | Failure::Other(e)) => {
            Err(GatewayError::Upstream {
                app: spec.name.clone(),
                reason: e,
            })
        }
        Err(Failure::TimedOut) => Err(upstream_timeout(state, &spec.name)),
    }
}

fn upstream_timeout(state: &State, app: &str) -> GatewayError {
    GatewayError::UpstreamTimeout {
        app: app.to_owned(),
        ms: u64::try_from(state.config.upstream_timeout.as_millis()).unwrap_or(u64::MAX),
    }
}

/// Stops a per-request instance when dropped.
struct Retire {
    agent: Agent,
    id: String,
}

impl Drop for Retire {
    fn drop(&mut self) {
        self.agent.retire(&self.id);
    }
}

/// Asks the local agent for an instance and holds the request until it is ready.
pub(crate) async fn start(
    state: &State,
    spec: &AppSpec,
    label: &str,
    owner: &Owner,
) -> Result<InstanceRecord, GatewayError> {
    let wait = Duration::from_millis(spec.start_timeout_ms);
    let app = spec.name.clone();
    // The agent enforces the start timeout itself; this bound only covers its own stalls.
    match tokio::time::timeout(
        wait + Duration::from_secs(1),
        state.agent.ensure_spec(spec, label, owner),
    )
    .await
    {
        Err(_) | Ok(Err(AgentError::Timeout { .. })) => Err(GatewayError::StartTimeout {
            app,
            ms: spec.start_timeout_ms,
        }),
        Ok(Ok(r)) => Ok(r),
        Ok(Err(AgentError::UnknownApp(_))) => {
            Err(GatewayError::NotFound(format!("no app named {app:?}")))
        }
        Ok(Err(e @ (AgentError::Exited { .. } | AgentError::Spawn { .. }))) => {
            tracing::warn!(app = %spec.name, label, error = %e, "instance failed to start");
            Err(GatewayError::StartFailed { app })
        }
        Ok(Err(e)) => Err(GatewayError::Unavailable {
            app,
            reason: e.to_string(),
        }),
    }
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
    let agent = state.agent.clone();
    let id = instance.id.clone();
    match joined {
        Some(label) if label == instance.label => {}
        Some(label) => {
            tracing::info!(app = %instance.app, instance = %id, from = %instance.label, to = %label, "instance tainted; relabelled");
            state.views.drop_instance(&id);
            tokio::spawn(async move {
                if let Err(e) = agent.relabel(&id, &label).await {
                    tracing::warn!(instance = %id, error = %e, "relabelling a tainted instance failed");
                }
            });
        }
        None => {
            tracing::warn!(app = %instance.app, instance = %id, "instance sent a taint the lattice does not know; stopping it");
            state.views.drop_instance(&id);
            tokio::spawn(async move {
                let _ = agent.kill(&id).await;
            });
        }
    }
}
