//! Who calls the API and what they may do. Every guarded route passes [`authorize`]: it finds
//! the principal (the break-glass admin token, compared in constant time, or an operator's
//! token, found by its SHA-256) and checks its roles against the route in one table
//! ([`table::check`]). A request that passes carries its [`Principal`], which the audit
//! records as the change's actor and a release as its `by`.

pub(crate) mod git;
pub(crate) mod table;
pub(crate) mod throttle;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::Digest as _;
use subtle::ConstantTimeEq;
use warden_core::{keys, OperatorRecord, OperatorSource, Role, TokenKind, TokenRecord};

use crate::error::ApiError;
use crate::Api;

/// Who a change made with the break-glass admin token is recorded as; an operator's changes
/// are recorded as `operator:<name>`.
pub(crate) const ACTOR: &str = "admin token";

/// The path parameter of `path` where `template` has one (`{name}`, `{id}`): the first.
pub(crate) fn target(template: &str, path: &str) -> Option<String> {
    template
        .split('/')
        .zip(path.split('/'))
        .find(|(t, _)| t.starts_with('{'))
        .map(|(_, p)| p.to_owned())
}

/// Whether a path segment names a process type's spec (`demo~worker`, or `%7E` escaped),
/// which no app's name can.
fn names_process_type(segment: &str) -> bool {
    segment.contains(warden_core::PROCESS_SEP) || segment.to_ascii_lowercase().contains("%7e")
}

/// Who made a request.
#[derive(Debug, Clone)]
pub(crate) enum Principal {
    /// The shared break-glass admin token: every role.
    Admin,
    /// An operator, through one of their tokens.
    Operator {
        /// Operator name.
        name: String,
        /// Their roles now.
        roles: Vec<Role>,
        /// The SHA-256 (hex) of the token presented: its record's key.
        token_hash: String,
        /// The operator's generation the token was issued for (their password and roles then):
        /// a token made with this one must be for the same, or a request authenticated just
        /// before a password change could mint one for after it.
        generation: String,
    },
}

impl Principal {
    /// As the audit trail and releases name it.
    pub(crate) fn actor(&self) -> String {
        match self {
            Self::Admin => ACTOR.to_owned(),
            Self::Operator { name, .. } => format!("operator:{name}"),
        }
    }

    /// Whether it may see the secrets of `app` (its config values): the owner, and deployers
    /// of that app. Viewers and deployers of other apps see the names of config vars only.
    pub(crate) fn sees_secrets_of(&self, app: &str) -> bool {
        match self {
            Self::Admin => true,
            Self::Operator { roles, .. } => roles.iter().any(|r| match r {
                Role::Owner => true,
                Role::Deployer { apps } => apps.iter().any(|a| a == app),
                Role::Viewer => false,
            }),
        }
    }

    /// Whether it holds the owner role.
    pub(crate) fn owner(&self) -> bool {
        match self {
            Self::Admin => true,
            Self::Operator { roles, .. } => roles.contains(&Role::Owner),
        }
    }
}

/// What stands for a config value a caller may not see.
pub(crate) const HIDDEN: &str = "(hidden: needs the deployer role of this app or the owner role)";

/// `env` with every value hidden unless `who` may see `app`'s secrets: the names of config vars
/// are no secret, their values (API keys, passwords) are.
pub(crate) fn redact_env(
    who: &Principal,
    app: &str,
    env: &mut std::collections::BTreeMap<String, String>,
) {
    if !who.sees_secrets_of(app) {
        for v in env.values_mut() {
            HIDDEN.clone_into(v);
        }
    }
}

/// The SHA-256 (hex) of a token: how its record is keyed.
pub(crate) fn token_hash(token: &str) -> String {
    warden_core::id::hex(&sha2::Sha256::digest(token.as_bytes()))
}

/// Makes and stores a token for `op` that lasts `ttl`; returns (token, record).
pub(crate) async fn issue(
    api: &Api,
    op: &OperatorRecord,
    kind: TokenKind,
    label: String,
    ttl: std::time::Duration,
) -> Result<(String, TokenRecord), ApiError> {
    let now = warden_core::model::now_ms();
    sweep_expired(api, now).await?;
    let token = warden_core::id::secret_token();
    let record = TokenRecord {
        id: warden_core::id::short_id(),
        operator: op.name.clone(),
        generation: op.generation.clone(),
        kind,
        label,
        created_ms: now,
        expires_ms: now.saturating_add(ttl.as_millis() as u64),
    };
    let bytes = serde_json::to_vec(&record).map_err(ApiError::internal)?;
    api.store
        .put(&keys::api_token(&token_hash(&token)), bytes, None)
        .await?;
    Ok((token, record))
}

/// Deletes the records of tokens expired by `now`: they are refused already, and tokens carry
/// no lease, so without this every login would leave one behind for good. Done when a token
/// is made, which is as often as they can pile up.
async fn sweep_expired(api: &Api, now: u64) -> Result<(), ApiError> {
    let listing = api.store.list(keys::API_TOKENS).await?;
    for e in listing.entries {
        if let Ok(t) = warden_store::decode::<TokenRecord>(&e.key, &e.value) {
            if now >= t.expires_ms {
                api.store.delete(&e.key).await?;
            }
        }
    }
    Ok(())
}

/// The peer's address, if the server gave it.
pub(crate) fn peer(req: &Request) -> Option<std::net::IpAddr> {
    req.extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
}

/// 401 with `WWW-Authenticate: Bearer`, saying `why`.
pub(crate) fn unauthorized(why: impl Into<String>) -> Response {
    let mut resp = ApiError::new(StatusCode::UNAUTHORIZED, why).into_response();
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

/// The principal `presented` names, or why none.
async fn identify(api: &Api, presented: &str) -> Result<Principal, Response> {
    if presented.is_empty() {
        return Err(unauthorized(if api.admin_token().is_some() {
            "a token is required: `warden login`, or send `Authorization: Bearer <token>` (the break-glass admin token is in DATA_DIR/admin-token)"
        } else {
            "a token is required: `warden login`, or send `Authorization: Bearer <token>`"
        }));
    }
    if let Some(admin) = api.admin_token() {
        if bool::from(presented.as_bytes().ct_eq(admin.as_bytes())) {
            return Ok(Principal::Admin);
        }
    }
    by_hash(api, token_hash(presented)).await
}

/// A signed-in dashboard browser's credential, as its session record keeps it: by hash, the
/// token itself being nowhere. Only a request extension, which nothing from the network can
/// set: the dashboard puts it on the requests it makes of the API's router for the browser.
#[derive(Debug, Clone)]
pub(crate) enum Hashed {
    /// An operator's session token, by its SHA-256 (hex).
    Token(String),
    /// The break-glass admin token, by its SHA-256 (hex): the session ends when the token is
    /// turned off or replaced.
    Admin(String),
}

/// The principal a dashboard session's `hashed` credential names, or why none; every check of
/// a presented token holds (revoked, expired, an older generation, a removed operator).
pub(crate) async fn identify_hashed(api: &Api, hashed: &Hashed) -> Result<Principal, Response> {
    match hashed {
        Hashed::Token(hash) => by_hash(api, hash.clone()).await,
        Hashed::Admin(hash) => match api.admin_token() {
            Some(a) if bool::from(token_hash(a).as_bytes().ct_eq(hash.as_bytes())) => {
                Ok(Principal::Admin)
            }
            _ => Err(unauthorized(
                "the admin token this session signed in with is off or was replaced; sign in again",
            )),
        },
    }
}

/// The operator whose token has SHA-256 `hash`, or why none.
async fn by_hash(api: &Api, hash: String) -> Result<Principal, Response> {
    let stored = warden_store::get_json::<TokenRecord>(&*api.store, &keys::api_token(&hash))
        .await
        .map_err(|e| ApiError::from(e).into_response())?;
    let Some((token, _)) = stored else {
        return Err(unauthorized(
            "this token is unknown, revoked or logged out; `warden login` for a new one",
        ));
    };
    if warden_core::model::now_ms() >= token.expires_ms {
        return Err(unauthorized(
            "this token has expired; `warden login` again (or make a new API token with `warden tokens create`)",
        ));
    }
    let op =
        warden_store::get_json::<OperatorRecord>(&*api.store, &keys::operator(&token.operator))
            .await
            .map_err(|e| ApiError::from(e).into_response())?;
    let Some((op, _)) = op else {
        return Err(unauthorized(format!(
            "operator {:?} of this token was removed; an owner can add them again with `warden operators add`",
            token.operator
        )));
    };
    if op.generation != token.generation {
        return Err(unauthorized(
            "this token was issued before the operator's password or roles changed; `warden login` again",
        ));
    }
    if let OperatorSource::Provider { id, issuer, .. } = &op.source {
        // Removing the provider (or its operator_rules) ends its operators' access at once:
        // their roles came from rules no longer in force.
        let configured = api
            .idp
            .as_ref()
            .and_then(|idp| idp.find(id))
            .is_some_and(|p| &p.provider.config().issuer == issuer);
        if !configured {
            return Err(unauthorized(format!(
                "operator {:?} signs in through the identity provider {id:?}, which no longer gives operator roles here; log in another way, or ask an owner",
                op.name
            )));
        }
    }
    Ok(Principal::Operator {
        name: op.name,
        roles: op.roles,
        token_hash: hash,
        generation: token.generation,
    })
}

/// The app a request is about, for the roles that hold apps: the path's `{name}` on
/// `/v1/apps/{name}/…`; the app of the instance `{id}` names; the `app` of the body that
/// starts an instance (read here, then handed on whole).
async fn app_of(
    api: &Api,
    req: Request,
    route: &str,
) -> Result<(Request, Option<String>), Response> {
    match route {
        "/v1/instances/{id}" | "/v1/instances/{id}/logs" => {
            let id = target(route, req.uri().path()).unwrap_or_default();
            let listing = api
                .store
                .list(keys::INSTANCES)
                .await
                .map_err(|e| ApiError::from(e).into_response())?;
            // `instances/<app>/<id>`; a process type's instance is its app's.
            let app = listing.entries.iter().find_map(|e| {
                let mut parts = e.key.splitn(3, '/').skip(1);
                let (app, this) = (parts.next()?, parts.next()?);
                let app = warden_core::split_process_app(app).map_or(app, |(app, _)| app);
                (this == id).then(|| app.to_owned())
            });
            // This node's instance not yet in the store (recorded behind its first request).
            let app = app.or_else(|| {
                let own = api.instances.as_ref()?.record(&id)?;
                let app = own.app.as_str();
                Some(
                    warden_core::split_process_app(app)
                        .map_or(app, |(app, _)| app)
                        .to_owned(),
                )
            });
            Ok((req, app))
        }
        "/v1/instances" if req.method() == axum::http::Method::POST => {
            #[derive(serde::Deserialize)]
            struct Named {
                app: String,
            }
            let (parts, body) = req.into_parts();
            let bytes = axum::body::to_bytes(body, 64 * 1024).await.map_err(|_| {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "the body is over 64 KiB or was cut off; send {\"app\": …, \"label\": …}",
                )
                .into_response()
            })?;
            // A process type's instances are started by its counts, never by this route: a
            // name of one is judged as its app's (and the route refuses it).
            let app = serde_json::from_slice::<Named>(&bytes).ok().map(|n| {
                warden_core::split_process_app(&n.app)
                    .map_or(n.app.as_str(), |(app, _)| app)
                    .to_owned()
            });
            Ok((
                Request::from_parts(parts, axum::body::Body::from(bytes)),
                app,
            ))
        }
        _ => {
            let app = route
                .starts_with("/v1/apps/{name}")
                .then(|| target(route, req.uri().path()))
                .flatten();
            Ok((req, app))
        }
    }
}

/// Finds the principal and checks the route against its roles; refusals are summed in the
/// audit trail.
pub(crate) async fn authorize(State(api): State<Api>, mut req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("", |m| m.as_str())
        .to_owned();
    // git sends the token as the password of HTTP Basic, and is answered as git shows it.
    let git = git::is_git(&route);
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned)
        .or_else(|| git.then(|| git::basic_password(req.headers())).flatten())
        .unwrap_or_default();
    // Not `&req` in the closure: a request body is not `Sync`, and this future must be `Send`.
    let from = peer(&req);
    let refused = |status: u16| {
        if api.audit.kept() {
            api.refusals.add(status, from, &route);
        }
    };
    let hashed = req.extensions().get::<Hashed>().cloned();
    let found = match hashed {
        Some(h) if presented.is_empty() => identify_hashed(&api, &h).await,
        _ => identify(&api, &presented).await,
    };
    let principal = match found {
        Ok(p) => p,
        Err(resp) => {
            refused(resp.status().as_u16());
            return if git { git::for_git(resp).await } else { resp };
        }
    };
    // A process type's spec (`demo~worker`) is its app's: no route takes its name, so its
    // counts, env and removal go only through the app's own routes and their roles.
    if let Some(name) = route
        .starts_with("/v1/apps/{name}")
        .then(|| target(&route, req.uri().path()))
        .flatten()
        .filter(|n| names_process_type(n))
    {
        return ApiError::no_app(&name).into_response();
    }
    if let Principal::Operator { roles, .. } = &principal {
        let app;
        (req, app) = match app_of(&api, req, &route).await {
            Ok(found) => found,
            Err(resp) => return resp,
        };
        if let Err(why) = table::check(roles, req.method().as_str(), &route, app.as_deref()) {
            refused(403);
            let resp = ApiError::new(StatusCode::FORBIDDEN, why).into_response();
            return if git { git::for_git(resp).await } else { resp };
        }
    }
    // A release's `by` is who authenticated, never what the client claims.
    if let Ok(v) = HeaderValue::from_str(&principal.actor()) {
        req.headers_mut().insert("x-warden-by", v);
    }
    req.extensions_mut().insert(principal);
    next.run(req).await
}
