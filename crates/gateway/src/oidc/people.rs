//! Provider users (`users/<name>`, marked with their provider and never with a usable password)
//! and their sessions, written at sign-in and at each refresh.

use std::time::Duration;

use http::{Response, StatusCode};
use warden_core::{keys, model::now_ms, ProviderMark, ProviderSession, SessionRecord, UserRecord};
use warden_oidc::{map_claims, Clearance, MappingError, Tokens};
use warden_store::{CasOutcome, LeaseId, Revision};

use super::page::html;
use super::{OidcConfig, OidcProvider};
use crate::auth::session::token_hash;
use crate::response::Body;
use crate::views::Shared;

/// What writing provider users and sessions needs: from the gateway's state at sign-in, from
/// the authenticator at refresh.
pub(crate) struct Ctx<'a> {
    pub store: &'a dyn warden_store::Store,
    pub views: &'a Shared,
    pub session_ttl: Duration,
}

/// How long a session's record stays in the store after the session ended (as `/login`'s).
const SESSION_RECORD_GRACE: Duration = Duration::from_secs(60);
/// Longest a sign-in waits for this gateway's view to apply it.
const SYNC_WAIT: Duration = Duration::from_secs(5);

/// Why a provider user could not be written.
pub(crate) enum Refusal {
    /// The claims give no clearance (or name another person than the user's): a 403 page.
    Forbidden(String),
    /// The store could not be written: a 503 page.
    Unavailable(String),
    /// The name the claims give is held by another account of the provider (another `sub`, or
    /// the same provider id at another issuer): a 403 page, and an audit refusal by name.
    Taken(String),
}

impl Refusal {
    pub(crate) fn into_page(self) -> Response<Body> {
        match self {
            Self::Forbidden(m) => html(StatusCode::FORBIDDEN, "No access", &m),
            Self::Taken(name) => html(
                StatusCode::FORBIDDEN,
                "Name taken",
                &format!(
                    "The user name {name:?} belongs to another account of the identity provider, \
                     which signed in with it first; warden never hands one person's name to another. \
                     An operator can remove the user (`warden users rm {name}`) if it is yours."
                ),
            ),
            Self::Unavailable(m) => {
                tracing::warn!(error = %m, "cannot record a provider sign-in");
                html(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Sign-in unavailable",
                    "The gateway cannot record sign-ins right now; try again in a moment.",
                )
            }
        }
    }
}

/// warden's name for the person: the username claim (else `sub`) made a valid user name,
/// then `_<provider id>`, so provider users never take a local user's name by accident.
pub(crate) fn user_name(p: &OidcProvider, tokens: &Tokens) -> String {
    let claims = &tokens.claims;
    let raw = claims
        .all
        .get(&p.username_claim)
        .and_then(|v| v.as_str())
        .unwrap_or(&claims.sub);
    let suffix = format!("_{}", p.provider.config().id);
    let mut base: String = raw
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '_' => c,
            _ => '-',
        })
        .skip_while(|c| !c.is_ascii_alphanumeric())
        .collect();
    base.truncate(63usize.saturating_sub(suffix.len()));
    if base.is_empty() {
        base.push('u');
    }
    base + &suffix
}

/// Maps the claims to a clearance with the lattice the gateway follows.
pub(crate) fn clearance(
    cx: &Ctx<'_>,
    p: &OidcProvider,
    tokens: &Tokens,
) -> Result<Clearance, Refusal> {
    let lattice = cx.views.read().lattice.clone();
    let Some(lattice) = lattice else {
        return Err(Refusal::Unavailable("no lattice is defined yet".into()));
    };
    map_claims(&p.rules, &tokens.claims.all, &lattice).map_err(|e| match e {
        MappingError::NoMatch { .. } => {
            Refusal::Forbidden(format!("You signed in at {}, but {e}.", p.label))
        }
        MappingError::BadRule { .. } => Refusal::Forbidden(format!(
            "warden's rules for {} do not fit its lattice ({e}); tell an operator.",
            p.label
        )),
    })
}

/// Writes the provider user `name` as `clearance` says; its new generation only when its
/// clearance or groups changed (so the person's other sessions go on otherwise).
pub(crate) async fn upsert_user(
    cx: &Ctx<'_>,
    p: &OidcProvider,
    name: &str,
    subject: &str,
    c: &Clearance,
) -> Result<(UserRecord, Revision), Refusal> {
    let key = keys::user(name);
    let id = &p.provider.config().id;
    let issuer = &p.provider.config().issuer;
    let unavailable = |e: warden_store::StoreError| Refusal::Unavailable(e.to_string());
    // Two tries: another gateway may write the same person at the same moment.
    for _ in 0..2 {
        let old = warden_store::get_json::<UserRecord>(cx.store, &key)
            .await
            .map_err(unavailable)?;
        if let Some((u, _)) = &old {
            match &u.provider {
                None => {
                    return Err(Refusal::Forbidden(format!(
                        "A local user named {name:?} exists; warden does not hand it to a provider sign-in. Ask an operator."
                    )))
                }
                // Pinned at the first sign-in: the provider's `iss` and `sub` (a record from
                // before the issuer was kept pins it now, to a config file's provider only).
                Some(m)
                    if m.id != *id
                        || m.subject != subject
                        || (m.issuer.is_empty() && !p.from_file)
                        || (!m.issuer.is_empty() && m.issuer != *issuer) =>
                {
                    return Err(Refusal::Taken(name.to_owned()))
                }
                Some(_) => {}
            }
        }
        let same = old
            .as_ref()
            .is_some_and(|(u, _)| u.clearance == c.label && u.groups == c.groups);
        let record = UserRecord {
            name: name.to_owned(),
            // Never a usable password: no PHC string parses from it.
            password_hash: String::new(),
            clearance: c.label.clone(),
            groups: c.groups.clone(),
            generation: match &old {
                Some((u, _)) if same => u.generation.clone(),
                _ => warden_core::id::short_id(),
            },
            provider: Some(ProviderMark {
                id: id.clone(),
                subject: subject.to_owned(),
                issuer: issuer.clone(),
                claims: c.claims.clone(),
                rules: c.matched.clone(),
                updated_ms: now_ms(),
            }),
        };
        let bytes = serde_json::to_vec(&record).map_err(|e| Refusal::Unavailable(e.to_string()))?;
        match cx
            .store
            .compare_and_swap(&key, old.as_ref().map(|(_, r)| *r), Some(bytes), None)
            .await
            .map_err(unavailable)?
        {
            CasOutcome::Done(rev) => return Ok((record, rev)),
            CasOutcome::Conflict { .. } => continue,
        }
    }
    Err(Refusal::Unavailable(format!(
        "the user {name:?} changed twice while it was being written"
    )))
}

/// The session record for `tokens`: a session lasts no longer than the provider allows
/// without a refresh token; with one, it is refreshed when the provider's word runs out.
pub(crate) fn session_record(
    cx: &Ctx<'_>,
    oidc: &OidcConfig,
    p: &OidcProvider,
    user: &UserRecord,
    tokens: &Tokens,
    token_key: &str,
    created_ms: u64,
) -> SessionRecord {
    let ttl_end = created_ms + cx.session_ttl.as_millis() as u64;
    let refresh_sealed = tokens
        .refresh_token
        .as_ref()
        .map(|rt| oidc.sealer.seal(&refresh_context(token_key), rt));
    let expires_ms = match refresh_sealed {
        Some(_) => ttl_end,
        None => ttl_end.min(tokens.expires_ms),
    };
    SessionRecord {
        user: user.name.clone(),
        generation: user.generation.clone(),
        created_ms,
        expires_ms,
        provider: Some(ProviderSession {
            id: p.provider.config().id.clone(),
            subject: tokens.claims.sub.clone(),
            issuer: p.provider.config().issuer.clone(),
            refresh_sealed,
            refresh_at_ms: tokens.expires_ms.min(expires_ms),
        }),
    }
}

/// The sealing context of a session's refresh token: the session's key.
pub(crate) fn refresh_context(session_key: &str) -> String {
    format!("oidc-refresh:{session_key}")
}

/// Signs the person in: user record, then a new session; the user's name, the session token
/// and the claim values that matched its rules (for the audit trail).
pub(crate) async fn sign_in(
    cx: &Ctx<'_>,
    oidc: &OidcConfig,
    p: &OidcProvider,
    tokens: Tokens,
) -> Result<(String, String, Vec<String>), Refusal> {
    let c = clearance(cx, p, &tokens)?;
    let name = user_name(p, &tokens);
    let (user, user_rev) = upsert_user(cx, p, &name, &tokens.claims.sub, &c).await?;
    let token = warden_core::id::secret_token();
    let key = keys::session(&token_hash(&token));
    let record = session_record(cx, oidc, p, &user, &tokens, &key, now_ms());
    let ttl = cx.session_ttl;
    let lease = cx
        .store
        .grant_lease(ttl + SESSION_RECORD_GRACE)
        .await
        .map_err(|e| Refusal::Unavailable(e.to_string()))?;
    let rev = put_session(cx, &key, &record, lease).await?;
    let _ = tokio::time::timeout(SYNC_WAIT, cx.views.caught_up(&keys::user(&name), user_rev)).await;
    let _ = tokio::time::timeout(SYNC_WAIT, cx.views.caught_up(&key, rev)).await;
    Ok((name, token, c.matched))
}

pub(crate) async fn put_session(
    cx: &Ctx<'_>,
    key: &str,
    record: &SessionRecord,
    lease: LeaseId,
) -> Result<Revision, Refusal> {
    warden_store::put_json(cx.store, key, record, Some(lease))
        .await
        .map_err(|e| Refusal::Unavailable(e.to_string()))
}

/// Waits (bounded) until this gateway's views hold `key` at `rev`.
pub(crate) async fn sync(cx: &Ctx<'_>, key: &str, rev: Revision) {
    let _ = tokio::time::timeout(SYNC_WAIT, cx.views.caught_up(key, rev)).await;
}
