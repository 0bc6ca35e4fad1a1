//! Operators from an identity provider: `operators/<name>` records with `source` = the
//! provider, no password, their roles replaced from the person's claims at every sign-in
//! (`operator_rules`, see `warden_oidc::map_operator`). A change of roles is a new generation,
//! so every token issued before it is refused; a person no rule gives a role any more loses
//! the record and its tokens at their next sign-in. An operator is bound to the person's issuer
//! and subject (`OperatorSource::Provider`): a sign-in of another account whose name claim maps
//! to the same name (the mapping is lossy, and `preferred_username` is not unique at every
//! provider) is refused, and never removes nor rewrites the operator; a local operator of the
//! same name is never taken over. With the admin token off, a sign-in never removes nor demotes
//! the last owner (as `warden operators` never does).

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
    let config = p.provider.config();
    let claims = &tokens.claims;
    let who = SignIn {
        source: OperatorSource::Provider {
            id: config.id.clone(),
            issuer: config.issuer.clone(),
            subject: claims.sub.clone(),
        },
        name: warden_oidc::operator_name(&claims.all, &p.username_claim, &claims.sub),
        label: &p.label,
        route,
    };
    let name = &who.name;
    let roles = match warden_oidc::map_operator(&p.rules, &claims.all) {
        Ok(r) => r.roles,
        Err(e @ OperatorRuleError::NoMatch { .. }) => {
            // What they still hold stops working now, not when it expires.
            remove_if_same(api, &who).await?;
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!("you signed in at {} as {name:?}, but {e}", p.label),
            ));
        }
        Err(e) => {
            tracing::warn!(provider = %config.id, error = %e, "operator rules unusable");
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "warden's operator rules for {} are unusable; tell an owner (warden's log says why)",
                    p.label
                ),
            ));
        }
    };
    let op = upsert(api, &who, roles).await?;
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
    let issued = crate::authz::issue(
        api,
        &op,
        TokenKind::Session,
        format!("{how} at {}", config.id),
        ttl,
    )
    .await?;
    who.audit(api, "200", None);
    Ok(issued)
}

/// Who a provider sign-in is: the provider's identity of the person, and warden's name for
/// them.
struct SignIn<'a> {
    source: OperatorSource,
    name: String,
    label: &'a str,
    route: &'a str,
}

impl SignIn<'_> {
    /// Records what the sign-in did to the operator in the audit trail: `outcome` the status,
    /// `before` the SHA-256 of the roles it found (where it changed or kept them).
    fn audit(&self, api: &Api, outcome: &str, before: Option<&[Role]>) {
        api.audit.record(Event::Change {
            actor: format!("operator:{}", self.name),
            method: if self.route.starts_with("/ui/") {
                "GET"
            } else {
                "POST"
            }
            .into(),
            route: self.route.into(),
            target: Some(self.name.clone()),
            outcome: outcome.into(),
            before: before
                .map(|r| crate::authz::token_hash(&serde_json::to_string(r).unwrap_or_default())),
            after: None,
        });
    }

    /// Refuses a sign-in that would take `o`, another operator of the same name: a local one,
    /// one of another provider, or another person's (another subject). The answer says no more
    /// than that the name is taken (the caller is anyone with an account at the provider);
    /// warden's log says which.
    fn check_same(&self, o: &OperatorRecord) -> Result<(), ApiError> {
        if o.source == self.source {
            return Ok(());
        }
        let holder = match &o.source {
            OperatorSource::Local => "a local operator".to_owned(),
            OperatorSource::Provider { id, subject, .. } => {
                format!("the operator of provider {id:?}, subject {subject:?}")
            }
        };
        tracing::warn!(operator = %o.name, source = ?self.source, "provider sign-in refused: the name is {holder}'s");
        Err(ApiError::conflict(format!(
            "you signed in at {}, but the operator name {:?} your account gives is another operator's, and warden never hands an operator to a different account; ask an owner (warden's log says whose it is)",
            self.label, self.name
        )))
    }

    /// With the admin token off, refuses a sign-in that would remove or demote the last
    /// owner `o` (nobody could change warden any more): the operator is kept as it was, the
    /// refusal audited.
    async fn keep_an_owner(&self, api: &Api, o: &OperatorRecord) -> Result<(), ApiError> {
        if !o.roles.contains(&Role::Owner) {
            return Ok(());
        }
        if crate::routes::operators::keep_an_owner(api, &o.name)
            .await
            .is_ok()
        {
            return Ok(());
        }
        self.audit(api, "409", Some(&o.roles));
        tracing::warn!(operator = %o.name, "provider sign-in would take the owner role from the last owner: refused, the operator kept");
        Err(ApiError::conflict(format!(
            "the identity provider {} no longer gives {:?} the owner role, but they are warden's last owner and the admin token is off: the operator is kept as it was and this sign-in refused. Make another owner first (`warden operators add NAME --role owner`) with a session still held, or restart with the admin token on",
            self.label, o.name
        )))
    }
}

/// Writes the operator of sign-in `who` with `roles`: made if new, a new generation (and
/// their old tokens deleted) if the roles changed, left alone otherwise (their other sessions
/// go on). Another operator of the name is never touched (409).
async fn upsert(api: &Api, who: &SignIn<'_>, roles: Vec<Role>) -> Result<OperatorRecord, ApiError> {
    let name = &who.name;
    let key = keys::operator(name);
    // A few tries: two sign-ins of one person may write at the same moment.
    for _ in 0..3 {
        let old = warden_store::get_json::<OperatorRecord>(&*api.store, &key).await?;
        if let Some((o, _)) = &old {
            who.check_same(o)?;
            if o.roles == roles && o.password_hash.is_none() {
                return Ok(o.clone());
            }
            if !roles.contains(&Role::Owner) {
                who.keep_an_owner(api, o).await?;
            }
        }
        let record = OperatorRecord {
            name: name.clone(),
            password_hash: None,
            roles: roles.clone(),
            generation: warden_core::id::short_id(),
            source: who.source.clone(),
        };
        let bytes = serde_json::to_vec(&record).map_err(ApiError::internal)?;
        let rev = old.as_ref().map(|(_, r)| *r);
        if let CasOutcome::Done(_) = api
            .store
            .compare_and_swap(&key, rev, Some(bytes), None)
            .await?
        {
            if let Some((o, _)) = &old {
                crate::routes::operators::end_tokens(api, name).await?;
                who.audit(api, "200", Some(&o.roles));
                tracing::info!(operator = %name, before = ?o.roles, after = ?roles, "provider operator's roles changed; their tokens ended");
            } else {
                tracing::info!(operator = %name, "provider operator made at sign-in");
            }
            return Ok(record);
        }
    }
    Err(ApiError::conflict(format!(
        "operator {name:?} changed meanwhile; log in again"
    )))
}

/// Removes the operator of sign-in `who` (a person no rule gives a role any more) and their
/// tokens: what they still hold is refused from now on. Another operator of that name (local,
/// or another account's) is left alone; so is the last owner with the admin token off.
async fn remove_if_same(api: &Api, who: &SignIn<'_>) -> Result<(), ApiError> {
    let key = keys::operator(&who.name);
    let Some((o, rev)) = warden_store::get_json::<OperatorRecord>(&*api.store, &key).await? else {
        return Ok(());
    };
    if o.source != who.source {
        tracing::warn!(operator = %o.name, source = ?who.source, "provider sign-in with no role matched another operator's name: left alone");
        return Ok(());
    }
    who.keep_an_owner(api, &o).await?;
    if let CasOutcome::Done(_) = api
        .store
        .compare_and_swap(&key, Some(rev), None, None)
        .await?
    {
        crate::routes::operators::end_tokens(api, &o.name).await?;
        who.audit(api, "403", Some(&o.roles));
        tracing::info!(operator = %o.name, "provider operator lost every role at sign-in; removed with their tokens");
    }
    Ok(())
}
