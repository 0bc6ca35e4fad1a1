//! Operators from an identity provider: `operators/<name>` records with `source` = the
//! provider, no password, their roles replaced from the person's claims at every sign-in
//! (`operator_rules`, see `warden_oidc::map_operator`). A change of roles is a new generation,
//! so every token issued before it is refused; a person no rule gives a role any more loses
//! the record and its tokens at their next sign-in. A local operator of the same name is never
//! taken over.

use std::time::Duration;

use axum::http::StatusCode;
use warden_core::audit::Event;
use warden_core::{
    keys, model::now_ms, OperatorRecord, OperatorSource, Role, TokenKind, TokenRecord,
};
use warden_oidc::{OperatorRule, OperatorRuleError, Provider, Sealer, Tokens};
use warden_store::CasOutcome;

use crate::error::ApiError;
use crate::Api;

/// An identity provider operators sign in through (an `[[oidc]]` table with operator rules).
pub struct OperatorProvider {
    /// The provider (its id is the operators' `source`).
    pub provider: Provider,
    /// Its name for people (`label`).
    pub label: String,
    /// Claims → roles.
    pub rules: Vec<OperatorRule>,
    /// The claim that names the person (`preferred_username`); `sub` where absent.
    pub username_claim: String,
    /// Whether the dashboard offers a sign-in through it (its redirect URL is the dashboard's
    /// callback).
    pub dashboard: bool,
}

/// The providers operators sign in through, and the key that seals what their sign-ins leave
/// in the store (the provider's device codes).
pub struct OperatorIdp {
    /// The providers, by their ids.
    pub providers: Vec<OperatorProvider>,
    /// Seals device codes at rest.
    pub sealer: Sealer,
}

impl OperatorIdp {
    /// The provider of id `id`.
    pub(crate) fn find(&self, id: &str) -> Option<&OperatorProvider> {
        self.providers.iter().find(|p| p.provider.config().id == id)
    }

    /// The providers' ids, for an error that lists them.
    pub(crate) fn ids(&self) -> String {
        self.providers
            .iter()
            .map(|p| p.provider.config().id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Ends a provider sign-in whose ID token `tokens` checked: the person's roles from their
/// claims (no rule matched: their operator and tokens removed, 403 naming the claims), their
/// operator written ([`upsert`]), a session token that lasts no longer than the provider's
/// tokens (min(the API's session time, their expiry)), the sign-in recorded in the audit trail
/// as a change on `route` by the operator. `how` labels the token ("device login").
pub(crate) async fn sign_in(
    api: &Api,
    p: &OperatorProvider,
    tokens: Tokens,
    how: &str,
    route: &str,
) -> Result<(String, TokenRecord), ApiError> {
    let id = p.provider.config().id.clone();
    let claims = &tokens.claims;
    let name = warden_oidc::operator_name(&claims.all, &p.username_claim, &claims.sub);
    let roles = match warden_oidc::map_operator(&p.rules, &claims.all) {
        Ok(r) => r.roles,
        Err(e @ OperatorRuleError::NoMatch { .. }) => {
            // What they still hold stops working now, not when it expires.
            remove_if_from(api, &id, &name).await?;
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!("you signed in at {} as {name:?}, but {e}", p.label),
            ));
        }
        Err(e) => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "warden's operator rules for {} are unusable ({e}); tell an owner",
                    p.label
                ),
            ))
        }
    };
    let op = upsert(api, &id, &name, roles).await?;
    let allowed = Duration::from_millis(tokens.expires_ms.saturating_sub(now_ms()));
    let ttl = api.session_ttl.min(allowed);
    if ttl.is_zero() {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            format!(
                "the identity provider {}'s tokens have already expired; sign in again",
                p.label
            ),
        ));
    }
    let issued =
        crate::authz::issue(api, &op, TokenKind::Session, format!("{how} at {id}"), ttl).await?;
    api.audit.record(Event::Change {
        actor: format!("operator:{}", op.name),
        method: if route.starts_with("/ui/") {
            "GET"
        } else {
            "POST"
        }
        .into(),
        route: route.into(),
        target: Some(op.name.clone()),
        outcome: "200".into(),
        before: None,
        after: None,
    });
    Ok(issued)
}

/// Refuses to let a sign-in through `provider` take the operator `o` of the same name.
fn check_source(o: &OperatorRecord, provider: &str) -> Result<(), ApiError> {
    match &o.source {
        OperatorSource::Provider(id) if id == provider => Ok(()),
        OperatorSource::Provider(other) => Err(ApiError::conflict(format!(
            "operator {:?} signs in through the identity provider {other:?}, not {provider:?}; a sign-in through one provider never takes another's operator",
            o.name
        ))),
        OperatorSource::Local => Err(ApiError::conflict(format!(
            "a local operator named {:?} exists, and a sign-in through the identity provider {provider:?} never takes one over; log in with its password (`warden login --name {}`), or an owner removes it (`warden operators remove {}`) to give the name to the provider's person",
            o.name, o.name, o.name
        ))),
    }
}

/// Writes operator `name` from `provider` with `roles`: made if new, a new generation (and
/// their old tokens deleted) if the roles changed, left alone otherwise (their other sessions
/// go on).
pub(crate) async fn upsert(
    api: &Api,
    provider: &str,
    name: &str,
    roles: Vec<Role>,
) -> Result<OperatorRecord, ApiError> {
    let key = keys::operator(name);
    // A few tries: two sign-ins of one person may write at the same moment.
    for _ in 0..3 {
        let old = warden_store::get_json::<OperatorRecord>(&*api.store, &key).await?;
        if let Some((o, _)) = &old {
            check_source(o, provider)?;
            if o.roles == roles && o.password_hash.is_none() {
                return Ok(o.clone());
            }
        }
        let record = OperatorRecord {
            name: name.to_owned(),
            password_hash: None,
            roles: roles.clone(),
            generation: warden_core::id::short_id(),
            source: OperatorSource::Provider(provider.to_owned()),
        };
        let bytes = serde_json::to_vec(&record).map_err(ApiError::internal)?;
        let rev = old.as_ref().map(|(_, r)| *r);
        if let CasOutcome::Done(_) = api
            .store
            .compare_and_swap(&key, rev, Some(bytes), None)
            .await?
        {
            if old.is_some() {
                crate::routes::operators::end_tokens(api, name).await?;
                tracing::info!(operator = %name, provider, "provider operator's roles changed; their tokens ended");
            } else {
                tracing::info!(operator = %name, provider, "provider operator made at sign-in");
            }
            return Ok(record);
        }
    }
    Err(ApiError::conflict(format!(
        "operator {name:?} changed meanwhile; log in again"
    )))
}

/// Removes operator `name` if it comes from `provider` (a person no rule gives a role any
/// more), and their tokens: what they still hold is refused from now on. A local operator of
/// that name is left alone.
pub(crate) async fn remove_if_from(api: &Api, provider: &str, name: &str) -> Result<(), ApiError> {
    let key = keys::operator(name);
    let Some((o, rev)) = warden_store::get_json::<OperatorRecord>(&*api.store, &key).await? else {
        return Ok(());
    };
    if o.source != OperatorSource::Provider(provider.to_owned()) {
        return Ok(());
    }
    if let CasOutcome::Done(_) = api
        .store
        .compare_and_swap(&key, Some(rev), None, None)
        .await?
    {
        crate::routes::operators::end_tokens(api, name).await?;
        tracing::info!(operator = %name, provider, "provider operator lost every role at sign-in; removed with their tokens");
    }
    Ok(())
}
