//! Single sign-on into the dashboard: `GET /ui/login/oidc/{id}` begins the authorization code
//! flow with PKCE, state and nonce (`warden-oidc`), `GET /ui/login/oidc/{id}/callback` ends it
//! in the same `warden_ui` session a password sign-in gives, the person's roles from their
//! claims (`operator_rules`, written by `routes::provider_operators` as the device login does).
//!
//! The sign-in in flight is kept as the gateway keeps its own: a leased record
//! `oidc/ui-flows/<SHA-256 of state>` with the verifier and nonce sealed for that key
//! ([`FlowSecrets`]), bound to the browser that began it by the `warden_ui_oidc` cookie (only
//! its SHA-256 stored; exactly one such cookie accepted), taken by deleting it, so a replayed
//! callback finds nothing.

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use warden_core::{keys, model::now_ms, OidcFlowRecord};
use warden_oidc::FlowSecrets;

use super::session::{self, https, session_cookie};
use super::{pages, Peer, Ui};
use crate::authz::{self, throttle::network};
use crate::routes::provider_operators::{self, OperatorIdp, OperatorProvider};

/// How long a sign-in may take at the provider (its record's lease and its cookie).
const FLOW_TTL: Duration = Duration::from_secs(600);
/// The cookie binding a sign-in in flight to its browser.
const FLOW_COOKIE: &str = "warden_ui_oidc";
/// The throttle's name for sign-ins begun (each counts, per address).
const STARTS: &str = "(dashboard sign-in)";
/// The callback's route, as the audit trail names it.
const ROUTE: &str = "/ui/login/oidc/{id}/callback";
/// Where a finished sign-in lands.
const HOME: &str = "/ui/";

/// A page saying `msg`, with `status`.
fn refused(status: StatusCode, msg: &str) -> Response {
    pages::respond(status, pages::error(None, msg))
}

fn flow_cookie(value: Option<&str>, https: bool) -> HeaderValue {
    let secure = if https { "; Secure" } else { "" };
    // Lax: the provider's redirect back is a cross-site top-level GET, which Strict would strip.
    let c = match value {
        Some(v) => format!(
            "{FLOW_COOKIE}={v}; Path=/ui/login/oidc/; HttpOnly; SameSite=Lax; Max-Age={}{secure}",
            FLOW_TTL.as_secs()
        ),
        None => format!(
            "{FLOW_COOKIE}=; Path=/ui/login/oidc/; HttpOnly; SameSite=Lax; Max-Age=0{secure}"
        ),
    };
    HeaderValue::from_str(&c).unwrap_or(HeaderValue::from_static(""))
}

/// Every value of cookie `name` the browser sent.
fn cookie_values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(n, _)| n.trim() == name)
        .map(|(_, v)| v.trim().to_owned())
        .collect()
}

/// The provider `id` (and the sealer), if the dashboard offers a sign-in through it.
fn provider<'a>(ui: &'a Ui, id: &str) -> Option<(&'a OperatorIdp, &'a OperatorProvider)> {
    let idp = ui.api.idp.as_deref()?;
    Some((idp, idp.find(id).filter(|p| p.dashboard)?))
}

fn no_provider() -> Response {
    refused(
        StatusCode::NOT_FOUND,
        "The dashboard offers no sign-in through this identity provider; sign in with a name and password.",
    )
}

fn store_down(e: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "cannot keep a dashboard sign-in in the store");
    refused(
        StatusCode::SERVICE_UNAVAILABLE,
        "The dashboard cannot record sign-ins right now; try again in a moment.",
    )
}

/// `GET /ui/login/oidc/{id}`: the sealed record, the binding cookie, a 302 to the provider.
pub(super) async fn start(State(ui): State<Ui>, peer: Peer, Path(id): Path<String>) -> Response {
    let Some((idp, p)) = provider(&ui, &id) else {
        return no_provider();
    };
    let addr = network(
        peer.as_ref()
            .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |Extension(c)| {
                c.0.ip()
            }),
    );
    // Each start writes a record under a lease: without a bound, anyone could fill the store.
    if ui.api.device_throttle.check(STARTS, addr).is_err() {
        return refused(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many sign-ins were begun from this address; wait a minute and try again.",
        );
    }
    ui.api.device_throttle.fail(STARTS, addr);
    let begun = match p.provider.begin().await {
        Ok(b) => b,
        Err(e) => {
            return refused(
                StatusCode::BAD_GATEWAY,
                &format!("The identity provider {} cannot be reached ({e}); sign in with a name and password.", p.label),
            )
        }
    };
    let state_hash = authz::token_hash(begun.state.expose());
    let binding = warden_core::id::secret_token();
    let record = OidcFlowRecord {
        issuer: p.provider.config().issuer.clone(),
        provider: id,
        sealed: FlowSecrets::of(&begun).seal(&idp.sealer, &state_hash),
        binding: authz::token_hash(&binding),
        next: HOME.into(),
        created_ms: now_ms(),
    };
    let key = keys::oidc_ui_flow(&state_hash);
    let put = async {
        let lease = ui.api.store.grant_lease(FLOW_TTL).await?;
        warden_store::put_json(&*ui.api.store, &key, &record, Some(lease)).await
    };
    if let Err(e) = put.await {
        return store_down(e);
    }
    let mut resp = StatusCode::FOUND.into_response();
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&begun.url) {
        h.insert(header::LOCATION, v);
    }
    h.insert(header::SET_COOKIE, flow_cookie(Some(&binding), https(&ui)));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// The callback's query.
#[derive(serde::Deserialize)]
pub(super) struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

/// Takes the flow record of `state_hash` by deleting it: only the request whose delete found
/// it finishes the sign-in.
async fn take(ui: &Ui, state_hash: &str) -> Result<Option<OidcFlowRecord>, Response> {
    let key = keys::oidc_ui_flow(state_hash);
    let entry = match ui.api.store.get(&key).await {
        Ok(Some(e)) => e,
        Ok(None) => return Ok(None),
        Err(e) => return Err(store_down(e)),
    };
    match ui.api.store.delete(&key).await {
        Ok(Some(_)) => {}
        Ok(None) => return Ok(None),
        Err(e) => return Err(store_down(e)),
    }
    if let Some(l) = entry.lease {
        let _ = ui.api.store.revoke_lease(l).await;
    }
    Ok(warden_store::decode::<OidcFlowRecord>(&key, &entry.value).ok())
}

/// `GET /ui/login/oidc/{id}/callback`: the record taken and its binding checked, the code
/// exchanged, the ID token checked, the roles mapped, the operator written, the session set.
pub(super) async fn callback(
    State(ui): State<Ui>,
    peer: Peer,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(q): Query<Callback>,
) -> Response {
    let from = peer.as_ref().map(|Extension(c)| c.0.ip());
    let refuse = |status: StatusCode, msg: &str| {
        if ui.api.audit.kept() {
            ui.api.refusals.add(status.as_u16(), from, ROUTE);
        }
        let mut r = refused(status, msg);
        r.headers_mut()
            .append(header::SET_COOKIE, flow_cookie(None, https(&ui)));
        r
    };
    let Some((idp, p)) = provider(&ui, &id) else {
        return no_provider();
    };
    if let Some(err) = &q.error {
        return refuse(
            StatusCode::FORBIDDEN,
            &format!("The identity provider {} answered {err:?}; sign in again, or with a name and password.", p.label),
        );
    }
    let (Some(code), Some(state)) = (&q.code, &q.state) else {
        return refuse(StatusCode::BAD_REQUEST, "This address needs the code and state the identity provider sends; begin the sign-in again.");
    };
    let state_hash = authz::token_hash(state);
    let record = match take(&ui, &state_hash).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "This sign-in was already finished or has expired; begin it again.",
            )
        }
        Err(resp) => return resp,
    };
    let expired = now_ms() > record.created_ms + FLOW_TTL.as_millis() as u64;
    let bindings = cookie_values(&headers, FLOW_COOKIE);
    let bound = matches!(bindings.as_slice(), [c] if authz::token_hash(c) == record.binding);
    let secrets = FlowSecrets::open(&idp.sealer, &state_hash, &record.sealed);
    // The same id at another issuer (the config changed meanwhile) is another provider: its
    // token endpoint must not get this code and verifier.
    let same = record.provider == id && record.issuer == p.provider.config().issuer;
    let (true, false, true, Some(secrets)) = (bound, expired, same, secrets) else {
        return refuse(StatusCode::BAD_REQUEST, "This sign-in was begun in another browser, for another provider, or too long ago; begin it again here.");
    };
    let tokens = match p
        .provider
        .exchange(code, &secrets.verifier, &secrets.nonce)
        .await
    {
        Ok(t) => t,
        Err(e) => {
            return refuse(
                StatusCode::UNAUTHORIZED,
                &format!(
                    "The answer of the identity provider {} was refused ({e}); sign in again.",
                    p.label
                ),
            )
        }
    };
    match provider_operators::sign_in(&ui.api, p, tokens, "dashboard sign-in", ROUTE).await {
        Ok((token, record)) => {
            let id = match session::start_for_token(&ui, &record, &token).await {
                Ok(id) => id,
                Err(e) => return refuse(e.status(), e.message()),
            };
            // A page that moves on by itself rather than a redirect: the session cookie is
            // SameSite=Strict, and a redirect chain that began at the provider's site would
            // not carry it to the overview.
            let mut resp = pages::respond(StatusCode::OK, pages::signed_in(HOME));
            let h = resp.headers_mut();
            h.insert(header::REFRESH, HeaderValue::from_static("0; url=/ui/"));
            h.append(header::SET_COOKIE, session_cookie(Some(&id), https(&ui)));
            h.append(header::SET_COOKIE, flow_cookie(None, https(&ui)));
            resp
        }
        Err(e) => refuse(e.status(), e.message()),
    }
}
