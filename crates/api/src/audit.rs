//! The API's audit records: every mutating request (not GET or HEAD) is recorded as a `change`,
//! made durable BEFORE the handler acts, then again with the status it ended with. Only requests
//! that passed the token check get here (this layer runs inside `authz::authorize`), and
//! each is recorded with its principal as the actor. The body is
//! recorded as its keyed digest, never as itself: it may hold passwords or config values; and
//! its secret fields are left out of what is digested ([`SECRET_FIELDS`]).
//!
//! With `--audit required`, a change the log cannot record first is refused (503), and so is
//! every change while the log cannot write; with `on` (the default) it goes ahead, the alarm is
//! in `/readyz`, and the `gap` record counts it. Reads are never refused: they show why.
//!
//! The API's refusals of tokens (401), of roles (403) and of logins (401, 429) are [`Refusals`], summed per period by status,
//! address and route like the gateway's: a flood of wrong tokens writes one record a period
//! per address, and never the token.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;
use warden_core::audit::{Audit, Event};

use crate::error::ApiError;
use crate::Api;

pub(crate) use crate::authz::{target, ACTOR};

/// Largest body digested before the handler runs; bigger ones are refused by the handlers'
/// own limit anyway (pushes, which stream, are digested by nothing: their release records the
/// upload's digest).
const MAX_DIGESTED: usize = 1024 * 1024;

/// Longest query of `POST /v1/apps/{name}/run` the audit record takes (its label and user).
const MAX_RUN_QUERY: usize = 512;

/// Distinct (status, address, route) keys summed per period; past it, new addresses are summed
/// under [`MORE`], so a flood from many addresses cannot grow memory or the log.
const MAX_KEYS: usize = 10_000;
/// The address of what [`MAX_KEYS`] left out.
const MORE: &str = "(more)";

/// One key's sums in a period: count, first and last time (ms since the epoch).
type Sum = (u64, u64, u64);

/// The API's refusals waiting for the next flush. Not on a hot path (a refused request), so a
/// plain lock.
#[derive(Default)]
pub(crate) struct Refusals {
    sums: Mutex<HashMap<(u16, String, String), Sum>>,
}

// === impl Refusals ===

impl Refusals {
    /// A request refused with `status` from `addr` on `route` (a template).
    pub(crate) fn add(&self, status: u16, addr: Option<IpAddr>, route: &str) {
        let now = warden_core::model::now_ms();
        let addr = addr.map_or_else(|| "unknown".to_owned(), |a| a.to_string());
        let mut sums = self.sums.lock().unwrap_or_else(|p| p.into_inner());
        let mut key = (status, addr, route.to_owned());
        if sums.len() >= MAX_KEYS && !sums.contains_key(&key) {
            key.1 = MORE.to_owned();
        }
        let s = sums.entry(key).or_insert((0, now, now));
        s.0 += 1;
        s.2 = now;
    }

    /// Writes what was summed since the last flush, one record per key.
    pub(crate) fn flush(&self, audit: &dyn Audit) {
        let sums = std::mem::take(&mut *self.sums.lock().unwrap_or_else(|p| p.into_inner()));
        for ((status, addr, route), (count, first_ms, last_ms)) in sums {
            audit.record(Event::Refusal {
                status,
                user: None,
                addr: Some(addr),
                app: None,
                route: Some(route),
                count,
                first_ms,
                last_ms,
            });
        }
    }

    /// Flushes into `audit` every `period` until `shutdown` turns true, then once more.
    pub(crate) async fn run(
        self: Arc<Self>,
        audit: Arc<dyn Audit>,
        period: Duration,
        shutdown: watch::Receiver<bool>,
    ) {
        warden_core::audit::flush_every(period, shutdown, || self.flush(&*audit)).await;
    }
}

/// The `name` (or, for an identity provider, the `id`) of a JSON object body.
fn named(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        name: Option<String>,
        id: Option<String>,
    }
    serde_json::from_slice::<Named>(body)
        .ok()
        .and_then(|n| n.name.or(n.id))
}

/// Fields whose values are secrets in some route's body: operators' and users' passwords,
/// identity providers' client secrets, tokens. Their values are left out of a body's digest.
const SECRET_FIELDS: &[&str] = &[
    "password",
    "client_secret",
    "secret",
    "token",
    "refresh_token",
];

/// What of `body` is digested: the body itself, or, when a JSON body holds a secret field
/// (at any depth), the body with each such value replaced by one marker. The digest is keyed,
/// but whoever holds the log's key must not be able to test guesses of a client secret or a
/// password against it either; two bodies that differ only in a secret digest the same.
fn digested(body: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    fn withhold(v: &mut serde_json::Value) -> bool {
        match v {
            serde_json::Value::Object(m) => {
                let mut any = false;
                for (k, v) in m.iter_mut() {
                    if SECRET_FIELDS.contains(&k.as_str()) {
                        *v = serde_json::Value::String("(withheld)".into());
                        any = true;
                    } else {
                        any |= withhold(v);
                    }
                }
                any
            }
            serde_json::Value::Array(a) => a.iter_mut().fold(false, |any, v| withhold(v) | any),
            _ => false,
        }
    }
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return body.into();
    };
    match withhold(&mut v) {
        true => serde_json::to_vec(&v).map_or(body.into(), Into::into),
        false => body.into(),
    }
}

/// Records a mutating request before and after its handler.
pub(crate) async fn record_change(State(api): State<Api>, req: Request, next: Next) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return next.run(req).await;
    }
    if let Some(why) = api.audit.refusing() {
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, why).into_response();
    }
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| req.uri().path().to_owned());
    let method = req.method().to_string();
    let actor = req
        .extensions()
        .get::<crate::authz::Principal>()
        .map_or_else(|| ACTOR.to_owned(), |p| p.actor());
    let mut target = target(&route, req.uri().path());
    let streamed = route == "/v1/apps/{name}/releases" || route == crate::authz::git::RECEIVE;
    // A one-off command's label and user (`warden run`) are the record's point: its query
    // names them and holds no secret (the command is in the body, digested).
    let route = match (route.as_str(), req.uri().query()) {
        // Bounded before anything is recorded: every record is written twice, durably, and a
        // query can be as long as the head (hundreds of KiB).
        ("/v1/apps/{name}/run", Some(q)) if q.len() > MAX_RUN_QUERY => {
            return ApiError::new(
                StatusCode::URI_TOO_LONG,
                format!("the query of a one-off command (its label and user) has more than {MAX_RUN_QUERY} bytes; name a shorter label"),
            )
            .into_response();
        }
        ("/v1/apps/{name}/run", Some(q)) => format!("{route}?{q}"),
        _ => route,
    };
    let (req, after) = if streamed {
        (req, None)
    } else {
        let (parts, body) = req.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, MAX_DIGESTED).await else {
            return ApiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is over 1 MiB or was cut off; send a smaller body",
            )
            .into_response();
        };
        let digest = (!bytes.is_empty()).then(|| api.audit.digest(&digested(&bytes)));
        // A create names its target in the body (`{"name": …}`): a name is no secret.
        target = target.or_else(|| named(&bytes));
        (Request::from_parts(parts, Body::from(bytes)), digest)
    };
    let change = |outcome: String| Event::Change {
        actor: actor.clone(),
        method: method.clone(),
        route: route.clone(),
        target: target.clone(),
        outcome,
        before: None,
        after: after.clone(),
    };
    // Unrecorded, a change goes ahead only when the log is not required: then with the alarm
    // (`/readyz`, `warden status`), and the gap record counts it.
    if let Err(e) = api.audit.record_durable(change("pending".into())).await {
        if api.audit.required() {
            let why = api.audit.refusing().unwrap_or_else(|| {
                format!("{e}; this node refuses changes until its audit log can record them")
            });
            return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, why).into_response();
        }
        warden_core::log_limited!(error, error = %e, "an API change goes ahead unrecorded");
    }
    let resp = next.run(req).await;
    api.audit.record(change(resp.status().as_u16().to_string()));
    resp
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_target_is_the_paths_first_parameter() {
        assert_eq!(
            super::target("/v1/apps/{name}/scale", "/v1/apps/web/scale").as_deref(),
            Some("web")
        );
        assert_eq!(super::target("/v1/apps", "/v1/apps"), None);
    }

    #[test]
    fn a_create_is_named_by_its_name_or_its_id() {
        assert_eq!(
            super::named(br#"{"name":"ann","password":"x"}"#).as_deref(),
            Some("ann")
        );
        assert_eq!(
            super::named(br#"{"id":"staff","issuer":"x"}"#).as_deref(),
            Some("staff")
        );
        assert_eq!(super::named(br#"{"replicas":2}"#), None);
    }

    #[test]
    fn secrets_are_left_out_of_what_is_digested() {
        let provider = |secret: &str, label: &str| {
            format!(
                r#"{{"id":"staff","label":"{label}","client_secret":"{secret}","rules":[{{"claim":"g","token":"{secret}"}}]}}"#
            )
        };
        let a = provider("hunter2-client-secret", "Staff");
        let d = super::digested(a.as_bytes()).into_owned();
        let text = String::from_utf8(d.clone()).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("staff") && text.contains("Staff"), "{text}");
        // Equal but for the secret: one digest; a changed non-secret field: another.
        let b = provider("another-secret", "Staff");
        assert_eq!(super::digested(b.as_bytes()).into_owned(), d);
        let c = provider("hunter2-client-secret", "Other");
        assert_ne!(super::digested(c.as_bytes()).into_owned(), d);
        for body in [
            &br#"{"name":"ann","password":"pw-guess"}"#[..],
            br#"{"password":"pw-guess"}"#,
        ] {
            let d = super::digested(body).into_owned();
            assert!(!String::from_utf8_lossy(&d).contains("pw-guess"));
        }
        // A body without a secret (or not JSON) is digested as sent.
        let plain = br#"{ "replicas": 2 }"#;
        assert_eq!(&*super::digested(plain), &plain[..]);
        assert_eq!(&*super::digested(b"not json"), b"not json");
    }
}
