//! `GET /login/oidc/{id}` (start) and `GET /login/oidc/{id}/callback` (finish).

use http::{header, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use warden_core::{keys, model::now_ms, OidcFlowRecord};
use warden_oidc::{FlowSecrets, OidcError};

use super::page::{html, provider_down};
use super::{people, query_param, OidcConfig, OidcProvider, FLOW_COOKIE, FLOW_TTL};
use crate::auth::session::token_hash;
use crate::client::Client;
use crate::endpoints::next::safe_next;
use crate::response::{full, Body};
use crate::state::State;

/// Where a sign-in without a usable `next` lands.
const DEFAULT_NEXT: &str = "/whoami";

fn flow_cookie(value: &str, max_age: u64, https: bool) -> HeaderValue {
    let secure = if https { "; Secure" } else { "" };
    // Lax: the provider's redirect back is a cross-site top-level GET, which Strict would strip.
    let c = format!(
        "{FLOW_COOKIE}={value}; Path=/login/oidc/; HttpOnly; SameSite=Lax; Max-Age={max_age}{secure}"
    );
    HeaderValue::from_str(&c).unwrap_or(HeaderValue::from_static(""))
}

fn store_down(e: impl std::fmt::Display) -> Response<Body> {
    tracing::warn!(error = %e, "cannot keep an OpenID Connect sign-in in the store");
    html(
        StatusCode::SERVICE_UNAVAILABLE,
        "Sign-in unavailable",
        "The gateway cannot record sign-ins right now; try again in a moment.",
    )
}

/// Starts a sign-in: state, nonce and PKCE verifier, the sealed record, the flow cookie, and a
/// 302 to the provider.
pub(super) async fn start(
    state: &State,
    oidc: &OidcConfig,
    p: &OidcProvider,
    req: Request<Incoming>,
    client: &Client,
) -> Response<Body> {
    if req.method() != http::Method::GET {
        return html(
            StatusCode::METHOD_NOT_ALLOWED,
            "Use GET",
            "Start a provider sign-in with a link (GET).",
        );
    }
    // Each start writes a record under a lease: without a bound, anyone could fill the store.
    if let Err(wait) = oidc.starts.admit(client.ip) {
        let mut resp = html(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many sign-ins",
            "Too many sign-ins were started from this address; wait a minute and try again.",
        );
        if let Ok(v) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return resp;
    }
    let next = query_param(&req, "next")
        .and_then(|n| safe_next(&n))
        .unwrap_or_else(|| DEFAULT_NEXT.to_owned());
    let begun = match p.provider.begin().await {
        Ok(b) => b,
        Err(e) => return provider_down(&p.label, &e),
    };
    let state_hash = token_hash(begun.state.expose());
    let binding = warden_core::id::secret_token();
    let sealed = FlowSecrets::of(&begun).seal(&oidc.sealer, &state_hash);
    let record = OidcFlowRecord {
        provider: p.provider.config().id.clone(),
        issuer: p.provider.config().issuer.clone(),
        sealed,
        binding: token_hash(&binding),
        next,
        created_ms: now_ms(),
    };
    let lease = match state.store.grant_lease(FLOW_TTL).await {
        Ok(l) => l,
        Err(e) => return store_down(e),
    };
    let key = keys::oidc_flow(&state_hash);
    if let Err(e) = warden_store::put_json(&*state.store, &key, &record, Some(lease)).await {
        return store_down(e);
    }
    let mut resp = Response::new(full(bytes::Bytes::new()));
    *resp.status_mut() = StatusCode::FOUND;
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&begun.url) {
        h.insert(header::LOCATION, v);
    }
    h.insert(
        header::SET_COOKIE,
        flow_cookie(&binding, FLOW_TTL.as_secs(), client.https),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// 400 with a page that says the sign-in cannot be finished and to begin again.
fn refused(message: &str) -> Response<Body> {
    html(StatusCode::BAD_REQUEST, "Sign-in not finished", message)
}

/// Takes the flow record of `state_param` by deleting it: only the one request whose delete
/// found it may finish the sign-in, so a replayed callback finds nothing.
async fn take_flow(
    state: &State,
    state_hash: &str,
) -> Result<Option<OidcFlowRecord>, Response<Body>> {
    let key = keys::oidc_flow(state_hash);
    let entry = match state.store.get(&key).await {
        Ok(Some(e)) => e,
        Ok(None) => return Ok(None),
        Err(e) => return Err(store_down(e)),
    };
    match state.store.delete(&key).await {
        Ok(Some(_)) => {}
        Ok(None) => return Ok(None),
        Err(e) => return Err(store_down(e)),
    }
    if let Some(l) = entry.lease {
        let _ = state.store.revoke_lease(l).await;
    }
    Ok(warden_store::decode::<OidcFlowRecord>(&key, &entry.value).ok())
}

/// Finishes a sign-in: the flow record taken, the browser binding checked, the code exchanged,
/// the ID token checked, the claims mapped, the user and session written, a 303 to `next`.
pub(super) async fn callback(
    state: &State,
    oidc: &OidcConfig,
    p: &OidcProvider,
    req: Request<Incoming>,
    client: &Client,
) -> Response<Body> {
    let method = p.method();
    if let Some(err) = query_param(&req, "error") {
        state
            .audit
            .sign_in(crate::audit::UNKNOWN, client.ip, &method, "failed");
        return html(
            StatusCode::FORBIDDEN,
            "Sign-in refused by the identity provider",
            &format!(
                "The identity provider {} answered {err:?}; sign in again or with a password.",
                p.label
            ),
        );
    }
    let (Some(code), Some(st)) = (query_param(&req, "code"), query_param(&req, "state")) else {
        return refused("This address needs the code and state the identity provider sends; start the sign-in again.");
    };
    let state_hash = token_hash(&st);
    let record = match take_flow(state, &state_hash).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            state
                .audit
                .sign_in(crate::audit::UNKNOWN, client.ip, &method, "failed");
            return refused("This sign-in was already finished or has expired; start it again.");
        }
        Err(resp) => return resp,
    };
    let expired = now_ms() > record.created_ms + FLOW_TTL.as_millis() as u64;
    // Exactly one binding cookie: a second is one a page of the gateway's origin planted (an
    // app's script can set cookies its headers may not), to finish its own flow in this
    // browser and sign the person in as someone else.
    let bindings = super::cookie_values(req.headers(), FLOW_COOKIE);
    let bound = matches!(bindings.as_slice(), [c] if token_hash(c) == record.binding);
    // The same id at another issuer (changed or added again meanwhile) is another provider:
    // the code and the verifier must not go to its token endpoint.
    let same_provider =
        record.provider == p.provider.config().id && record.issuer == p.provider.config().issuer;
    if !same_provider || expired || !bound {
        state
            .audit
            .sign_in(crate::audit::UNKNOWN, client.ip, &method, "failed");
        return refused("This sign-in was begun in another browser, for another provider, or too long ago; start it again here.");
    }
    let Some(sealed) = FlowSecrets::open(&oidc.sealer, &state_hash, &record.sealed) else {
        return refused("This sign-in's record does not open on this gateway; start it again.");
    };
    let tokens = match p
        .provider
        .exchange(&code, &sealed.verifier, &sealed.nonce)
        .await
    {
        Ok(t) => t,
        Err(e) if e.provider_down() => return provider_down(&p.label, &e),
        Err(e) => {
            state
                .audit
                .sign_in(crate::audit::UNKNOWN, client.ip, &method, "failed");
            return token_refused(&p.label, &e);
        }
    };
    let cx = people::Ctx {
        store: &*state.store,
        views: &state.views,
        session_ttl: state.config.session_ttl,
    };
    match people::sign_in(&cx, oidc, p, tokens).await {
        Ok((name, token, matched)) => {
            state
                .audit
                .sign_in_by(&name, client.ip, &method, "ok", &matched);
            tracing::info!(user = %name, provider = %p.provider.config().id, "provider sign-in");
            signed_in(&record.next, &token, state, client)
        }
        Err(people::Refusal::Taken(name)) => {
            // By name: the name exists, and its holder (or an operator) should see the attempt.
            state.audit.sign_in(&name, client.ip, &method, "refused");
            state.audit.refusal(403, Some(&name), client.ip, None);
            tracing::info!(user = %name, provider = %p.provider.config().id, "provider sign-in refused: the name belongs to another account");
            people::Refusal::Taken(name).into_page()
        }
        Err(refusal) => {
            state
                .audit
                .sign_in(crate::audit::UNKNOWN, client.ip, &method, "failed");
            refusal.into_page()
        }
    }
}

fn token_refused(label: &str, e: &OidcError) -> Response<Body> {
    tracing::info!(provider = %label, error = %e, "provider sign-in refused");
    html(
        StatusCode::UNAUTHORIZED,
        "Sign-in refused",
        &format!("The answer of the identity provider {label} was refused ({e}). Sign in again; if this persists, tell an operator."),
    )
}

/// 303 to `next` with the session cookie, the flow cookie cleared.
fn signed_in(next: &str, token: &str, state: &State, client: &Client) -> Response<Body> {
    let mut resp = Response::new(full(bytes::Bytes::new()));
    *resp.status_mut() = StatusCode::SEE_OTHER;
    let h = resp.headers_mut();
    let next = safe_next(next).unwrap_or_else(|| DEFAULT_NEXT.to_owned());
    if let Ok(v) = HeaderValue::from_str(&next) {
        h.insert(header::LOCATION, v);
    }
    h.append(
        header::SET_COOKIE,
        crate::endpoints::login::cookie(token, state.config.session_ttl.as_secs(), client.https),
    );
    h.append(header::SET_COOKIE, flow_cookie("", 0, client.https));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}
