//! Refreshing a provider session whose provider's word has run out (`refresh_at_ms`), before
//! its request goes on: one refresh per session at a time on this gateway (others wait for it
//! and use its result). New claims give a new clearance; a refused refresh (the person removed
//! at the provider, the refresh token revoked) or claims that no longer map end the session,
//! deleted from the store so every gateway drops it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use warden_core::{keys, model::now_ms, ProviderSession, SessionRecord};
use warden_store::{CasOutcome, Store};

use super::people::{self, Ctx, Refusal};
use super::OidcConfig;
use crate::audit::Recorder;
use crate::error::GatewayError;
use crate::views::{Shared, User};

/// Refreshes provider sessions for the authenticator.
pub(crate) struct Refresher {
    store: Arc<dyn Store>,
    oidc: Arc<OidcConfig>,
    session_ttl: Duration,
    audit: Arc<Recorder>,
    /// One lock per session being refreshed.
    inflight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

// === impl Refresher ===

impl Refresher {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        oidc: Arc<OidcConfig>,
        session_ttl: Duration,
        audit: Arc<Recorder>,
    ) -> Self {
        Self {
            store,
            oidc,
            session_ttl,
            audit,
            inflight: Mutex::new(HashMap::new()),
        }
    }

    /// Refreshes the session of token hash `hash`; its user as it is afterwards.
    /// `Unauthenticated` when the session ended; `Unavailable` while the provider is down.
    pub(crate) async fn refresh(
        &self,
        views: &Shared,
        hash: &str,
        peer: IpAddr,
    ) -> Result<Arc<User>, GatewayError> {
        let lock = self
            .inflight_lock()
            .entry(hash.to_owned())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
            .clone();
        let result = {
            let _one = lock.lock().await;
            self.refresh_locked(views, hash, peer).await
        };
        let mut inflight = self.inflight_lock();
        if inflight.get(hash).is_some_and(|l| Arc::ptr_eq(l, &lock)) {
            inflight.remove(hash);
        }
        result
    }

    /// True while the provider of session `ps` is still the one it signed in at (its id
    /// configured, at the same issuer); a session for which this is false is refreshed at
    /// once, which ends it without a word to any provider.
    pub(crate) fn provider_current(&self, ps: &ProviderSession) -> bool {
        self.oidc
            .find(&ps.id)
            .is_some_and(|p| p.provider.config().issuer == ps.issuer)
    }

    fn inflight_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, Arc<tokio::sync::Mutex<()>>>> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn refresh_locked(
        &self,
        views: &Shared,
        hash: &str,
        peer: IpAddr,
    ) -> Result<Arc<User>, GatewayError> {
        let key = keys::session(hash);
        let Some(s) = views.read().sessions.get(hash).cloned() else {
            return Err(GatewayError::Unauthenticated);
        };
        let Some(ps) = s.provider.clone() else {
            return current_user(views, &s);
        };
        let Some(p) = self.oidc.find(&ps.id) else {
            return self
                .end(views, &key, "its provider is no longer configured")
                .await;
        };
        // Ended, not refreshed: its refresh token and the client's credentials are for the
        // issuer it signed in at, not for whatever the id names now.
        if p.provider.config().issuer != ps.issuer {
            return self
                .end(views, &key, "its provider id now names another issuer")
                .await;
        }
        if ps.refresh_at_ms > now_ms() {
            // Refreshed while this request waited for the lock.
            return current_user(views, &s);
        }
        let method = p.method();
        let Some(sealed) = &ps.refresh_sealed else {
            return self
                .end(
                    views,
                    &key,
                    "the provider's tokens expired and it gave no refresh token",
                )
                .await;
        };
        let Ok(rt) = self
            .oidc
            .sealer
            .open(&people::refresh_context(&key), sealed)
        else {
            return self
                .end(views, &key, "its refresh token does not open")
                .await;
        };
        let tokens = match p.provider.refresh(&rt, &ps.subject).await {
            Ok(t) => t,
            Err(e) if e.provider_down() => {
                tracing::warn!(provider = %ps.id, error = %e, "cannot refresh a provider session");
                return Err(GatewayError::Unavailable {
                    app: format!("identity provider {}", p.label),
                    reason: format!("it did not answer a session refresh; sign in with a password or try again ({e})"),
                });
            }
            Err(e) => {
                // On a cluster another gateway may have refreshed this session a moment ago
                // with the same refresh token (this lock is per gateway): then the refusal is
                // about the spent token, not the person, and the session lives on.
                if self.refreshed_elsewhere(&key, ps.refresh_at_ms).await {
                    return Err(refreshed_elsewhere());
                }
                self.audit.sign_in(&s.user, peer, &method, "failed");
                tracing::info!(user = %s.user, error = %e, "provider refused a session refresh");
                return self
                    .end(views, &key, "the provider refused its refresh")
                    .await;
            }
        };
        let cx = Ctx {
            store: &*self.store,
            views,
            session_ttl: self.session_ttl,
        };
        let outcome = async {
            let c = people::clearance(&cx, &p, &tokens)?;
            let (user, user_rev) =
                people::upsert_user(&cx, &p, &s.user, &tokens.claims.sub, &c).await?;
            people::sync(&cx, &keys::user(&s.user), user_rev).await;
            let record: SessionRecord =
                people::session_record(&cx, &self.oidc, &p, &user, &tokens, &key, s.created_ms);
            Ok((self.swap_session(&key, &record).await?, c.matched))
        }
        .await;
        match outcome {
            Ok((rev, matched)) => {
                people::sync(&cx, &key, rev).await;
                self.audit
                    .sign_in_by(&s.user, peer, &method, "refreshed", &matched);
                let s = views.read().sessions.get(hash).cloned();
                s.map_or(Err(GatewayError::Unauthenticated), |s| {
                    current_user(views, &s)
                })
            }
            Err(Refusal::Taken(name)) => {
                self.audit.sign_in(&s.user, peer, &method, "refused");
                let why = format!("the name {name:?} belongs to another account of the provider");
                self.end(views, &key, &why).await
            }
            Err(Refusal::Forbidden(why)) => {
                self.audit.sign_in(&s.user, peer, &method, "failed");
                self.end(views, &key, &why).await
            }
            Err(Refusal::Unavailable(why)) => Err(GatewayError::Unavailable {
                app: "sign-in".into(),
                reason: why,
            }),
        }
    }

    /// Rewrites the session in place (same lease) unless it changed or ended meanwhile (a
    /// sign-out on another gateway must not be undone).
    async fn swap_session(&self, key: &str, record: &SessionRecord) -> Result<u64, Refusal> {
        let unavailable = |e: warden_store::StoreError| Refusal::Unavailable(e.to_string());
        let Some(entry) = self.store.get(key).await.map_err(unavailable)? else {
            return Err(Refusal::Forbidden("the session ended".into()));
        };
        let bytes = serde_json::to_vec(record).map_err(|e| Refusal::Unavailable(e.to_string()))?;
        match self
            .store
            .compare_and_swap(key, Some(entry.mod_revision), Some(bytes), entry.lease)
            .await
            .map_err(unavailable)?
        {
            CasOutcome::Done(rev) => Ok(rev),
            // Changed meanwhile: refreshed by another gateway (or signed out there, which the
            // views will show); this request is asked to try again, the session not ended.
            CasOutcome::Conflict { .. } => Err(Refusal::Unavailable(
                "the session was refreshed elsewhere at the same moment".into(),
            )),
        }
    }

    /// True when the session at `key` in the store was refreshed past `refresh_at_ms` (by
    /// another gateway) since this one read it.
    async fn refreshed_elsewhere(&self, key: &str, refresh_at_ms: u64) -> bool {
        let Ok(Some(e)) = self.store.get(key).await else {
            return false;
        };
        warden_store::decode::<SessionRecord>(key, &e.value)
            .ok()
            .and_then(|r| r.provider)
            .is_some_and(|p| p.refresh_at_ms > refresh_at_ms)
    }

    /// Ends the session at `key` everywhere.
    async fn end(&self, views: &Shared, key: &str, why: &str) -> Result<Arc<User>, GatewayError> {
        tracing::info!(reason = %why, "provider session ended");
        if let Ok(Some(rev)) = self.store.delete(key).await {
            let _ = tokio::time::timeout(Duration::from_secs(5), views.caught_up(key, rev)).await;
        }
        Err(GatewayError::Unauthenticated)
    }
}

/// A request that met another gateway's refresh of its session: try again.
fn refreshed_elsewhere() -> GatewayError {
    GatewayError::Unavailable {
        app: "sign-in".into(),
        reason: "the session was refreshed on another gateway at the same moment; try again".into(),
    }
}

/// The user of session `s` as the views hold it, if the session is still valid for it.
fn current_user(views: &Shared, s: &SessionRecord) -> Result<Arc<User>, GatewayError> {
    views
        .read()
        .users
        .get(&s.user)
        .filter(|u| u.record.generation == s.generation && s.expires_ms > now_ms())
        .cloned()
        .ok_or(GatewayError::Unauthenticated)
}
