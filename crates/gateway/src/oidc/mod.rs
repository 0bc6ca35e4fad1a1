//! Sign-in through OpenID Connect providers (issue 36): `GET /login/oidc/{id}` starts it,
//! `GET /login/oidc/{id}/callback` finishes it ([`flow`]), provider users and their sessions
//! are written by [`people`], and a session past its provider's word is refreshed before its
//! request goes on ([`refresh`]).
//!
//! The provider protocol itself (discovery, keys, PKCE, token checks, claims → clearance) is
//! the `warden-oidc` crate's. Here: the store records (the in-flight sign-in under
//! `oidc/flows/`, sealed), cookies, pages, the audit trail (`oidc:<id>`). No token reaches a
//! log, a URL or the store in clear.

mod flow;
mod page;
pub(crate) mod people;
pub(crate) mod refresh;
pub mod starts;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use warden_oidc::{ClaimRule, Provider, Sealer};

use crate::client::Client;
use crate::response::Body;
use crate::state::State;

/// How long a sign-in may take at the provider (the flow record's lease and cookie).
pub(crate) const FLOW_TTL: Duration = Duration::from_secs(600);

/// The cookie that binds an in-flight sign-in to the browser that began it.
pub(crate) const FLOW_COOKIE: &str = "warden_oidc";

/// One configured provider, as the gateway uses it.
#[derive(Debug)]
pub struct OidcProvider {
    /// The provider's protocol side (its id, issuer, client).
    pub provider: Provider,
    /// The sign-in page's button text.
    pub label: String,
    /// Claims → clearance rules.
    pub rules: Vec<ClaimRule>,
    /// The claim whose value names the person (`preferred_username`), `sub` when absent.
    pub username_claim: String,
    /// From the config file rather than the API: only then is a provider user written before
    /// issuers were kept pinned to this provider's issuer at its next sign-in (the config
    /// file's id is the one it signed in with); an API provider's id may have named another
    /// provider then, so such a user is not its to take.
    pub from_file: bool,
}

/// Every provider, and the key that seals what rests in the store.
#[derive(Debug)]
pub struct OidcConfig {
    /// The providers: the config file's, then those added through the API, which change while
    /// the gateway runs (the binary follows the store and calls [`OidcConfig::set_providers`]).
    providers: RwLock<Vec<Arc<OidcProvider>>>,
    /// Seals PKCE verifiers, nonces, refresh tokens and API providers' client secrets.
    pub sealer: Sealer,
    /// Sign-ins started per client address, bounded.
    pub starts: starts::Starts,
}

// === impl OidcConfig ===

impl OidcConfig {
    /// `providers`, sealing under `sealer`.
    pub fn new(providers: Vec<Arc<OidcProvider>>, sealer: Sealer) -> Self {
        Self {
            providers: RwLock::new(providers),
            sealer,
            starts: Default::default(),
        }
    }

    /// Replaces the providers: a removed one's button goes, its sign-ins in flight find no
    /// provider at their callback, and its sessions end at their next refresh.
    pub fn set_providers(&self, providers: Vec<Arc<OidcProvider>>) {
        *self.providers.write().unwrap_or_else(|p| p.into_inner()) = providers;
    }

    /// The providers now.
    pub fn providers(&self) -> Vec<Arc<OidcProvider>> {
        self.providers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The sign-in page's buttons: `(id, label)` per provider, in order.
    pub fn buttons(&self) -> Vec<(String, String)> {
        self.providers()
            .iter()
            .map(|p| (p.provider.config().id.clone(), p.label.clone()))
            .collect()
    }

    fn find(&self, id: &str) -> Option<Arc<OidcProvider>> {
        self.providers()
            .into_iter()
            .find(|p| p.provider.config().id == id)
    }
}

impl OidcProvider {
    /// The audit trail's method for this provider.
    pub(crate) fn method(&self) -> String {
        format!("oidc:{}", self.provider.config().id)
    }
}

/// Answers `/login/oidc/...`; `None` for other paths.
pub(crate) async fn answer(
    state: &State,
    req: Request<Incoming>,
    client: &Client,
) -> Option<Response<Body>> {
    let rest = req.uri().path().strip_prefix("/login/oidc/")?.to_owned();
    let (id, callback) = match rest.strip_suffix("/callback") {
        Some(id) => (id.to_owned(), true),
        None => (rest, false),
    };
    let Some(oidc) = state.config.oidc.clone() else {
        return Some(page::not_found(&id));
    };
    let Some(p) = oidc.find(&id) else {
        return Some(page::not_found(&id));
    };
    if let Err(e) = state.audit_gate(Some(b"text/html")) {
        return Some(e.into_response());
    }
    Some(match callback {
        false => flow::start(state, &oidc, &p, req, client).await,
        true => flow::callback(state, &oidc, &p, req, client).await,
    })
}

/// The value of cookie `name` in `req`'s Cookie headers.
/// Every value of cookie `name` the request carries (a browser sends one per path and domain
/// that matches: more than one means someone planted one).
pub(crate) fn cookie_values(headers: &http::HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(n, _)| n.trim() == name)
        .map(|(_, v)| v.trim().to_owned())
        .collect()
}

/// The value of query parameter `name`, percent-decoded.
pub(crate) fn query_param(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.uri()
        .query()?
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| {
            percent_encoding::percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
}
