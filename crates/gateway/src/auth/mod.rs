//! Authentication on the request path: session tokens, and HTTP Basic passwords checked with
//! Argon2id at most once per credential.
//!
//! A request names one user. It may carry a session (a bearer token or the session cookie) and
//! Basic credentials at once only when both name the same user; two different users, in any
//! mix of credentials, get 400, never one of them picked silently (an app could otherwise plant
//! another user's session in a browser). A session whose token is unknown or expired does not
//! count, so Basic credentials beside it are used. More than one Authorization header gets 400.
//!
//! Argon2id never runs on the async executor: verifications run on the blocking pool, at most
//! one per core at a time, with a bounded queue shared fairly between networks ([`fair`]); past
//! it the gateway answers 503 at once. The password is dropped as soon as it is verified and is
//! never logged.

pub(crate) mod basic;
pub(crate) mod cache;
pub(crate) mod fair;
pub(crate) mod session;
pub(crate) mod throttle;

#[cfg(test)]
mod props;

use crate::hashing::DigestMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::HeaderMap;
use tokio::sync::OnceCell;

use crate::audit::Recorder;
use crate::error::GatewayError;
use crate::metrics::{CacheResult, Metrics, Phase};
use crate::views::{Shared, User};

/// Tuning of authentication.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// How long a verified credential is trusted without hashing again.
    pub cache_ttl: Duration,
    /// How long a refused credential is answered from memory.
    pub negative_ttl: Duration,
    /// Failed sign-ins for one user from everywhere per window, beyond which addresses that
    /// have failed for that user get 429 (others still have their password checked).
    pub failures_per_user: u32,
    /// Failed sign-ins per client address per window before 429.
    pub failures_per_addr: u32,
    /// Failed sign-ins per client address for one user per window before 429.
    pub failures_per_addr_user: u32,
    /// The throttling window.
    pub window: Duration,
    /// The cost of new passwords: an unknown user's sign-in is checked against a dummy hash of
    /// this cost, so it takes as long as a real one.
    pub argon2: warden_auth::Argon2Cost,
    /// Whether names and passwords are taken at all (Basic, the sign-in form, JSON); off,
    /// each is refused with 403 and only identity providers sign people in.
    pub password_sign_in: bool,
}

pub(crate) struct Authenticator {
    argon2: warden_auth::Argon2Cost,
    /// [`AuthConfig::password_sign_in`].
    passwords: bool,
    cache: cache::CredentialCache,
    throttle: throttle::Throttle,
    /// One verification per core at a time, 64 per core waiting, fairly between networks.
    pool: fair::FairPool,
    /// Verifications under way, by credential: when a cached credential expires under load,
    /// every request carrying it waits for one Argon2id run instead of starting its own.
    inflight: Mutex<DigestMap<cache::CredKey, Arc<OnceCell<Verdict>>>>,
    /// Where every attempt's outcome is summed for the audit log.
    audit: Arc<Recorder>,
    /// Refreshes provider sessions past their provider's word (none without providers).
    pub refresher: Option<crate::oidc::refresh::Refresher>,
}

/// The outcome of one verification, shared by every request that waited for it.
#[derive(Clone, Copy)]
enum Verdict {
    Valid,
    Invalid,
    Busy,
}

impl Authenticator {
    pub fn new(config: &AuthConfig, audit: Arc<Recorder>) -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Self {
            argon2: config.argon2,
            passwords: config.password_sign_in,
            cache: cache::CredentialCache::new(config.cache_ttl, config.negative_ttl, 100_000),
            throttle: throttle::Throttle::new(
                config.window,
                throttle::Limits {
                    per_addr: config.failures_per_addr,
                    per_addr_user: config.failures_per_addr_user,
                    per_user: config.failures_per_user,
                },
            ),
            pool: fair::FairPool::new(cores, 64 * cores),
            inflight: Mutex::new(DigestMap::default()),
            audit,
            refresher: None,
        }
    }

    /// The user a request is from; see the module's documentation for the rules.
    pub async fn authenticate(
        &self,
        views: &Shared,
        headers: &HeaderMap,
        peer: IpAddr,
        m: &Metrics,
    ) -> Result<Arc<User>, GatewayError> {
        let mut authorization = headers
            .get_all(http::header::AUTHORIZATION)
            .iter()
            .map(http::HeaderValue::as_bytes);
        let first = authorization.next();
        if authorization.next().is_some() {
            return Err(two_authorizations());
        }
        let cookies = headers
            .get_all(http::header::COOKIE)
            .iter()
            .map(http::HeaderValue::as_bytes);
        self.authenticate_raw(views, first, cookies, peer, m).await
    }

    /// [`Self::authenticate`] from the raw value of the one Authorization header and the values
    /// of every Cookie header.
    pub async fn authenticate_raw<'a>(
        &self,
        views: &Shared,
        authorization: Option<&'a [u8]>,
        cookies: impl Iterator<Item = &'a [u8]>,
        peer: IpAddr,
        m: &Metrics,
    ) -> Result<Arc<User>, GatewayError> {
        let basic = authorization.and_then(basic::parse);
        let mut by_session: Option<Arc<User>> = None;
        let mut presented = false;
        for token in session::tokens(authorization, cookies) {
            presented = true;
            let Some((u, stale)) = session_user(views, token, self.refresher.as_ref()) else {
                continue;
            };
            // A provider session past its provider's word is refreshed before it counts; one
            // that ended counts as no session.
            let u = match (stale, &self.refresher) {
                (false, _) => u,
                (true, None) => continue,
                (true, Some(r)) => {
                    match r.refresh(views, &session::token_hash(token), peer).await {
                        Ok(u) => u,
                        Err(GatewayError::Unauthenticated) => continue,
                        Err(e) => return Err(e),
                    }
                }
            };
            match &by_session {
                Some(prev) if prev.record.name != u.record.name => {
                    return Err(GatewayError::TwoUsers);
                }
                Some(_) => {}
                None => by_session = Some(u),
            }
        }
        match (by_session, basic) {
            (Some(u), Some(b)) if b.user != u.record.name => Err(GatewayError::TwoUsers),
            // A request with a valid session is no sign-in: the one that made the session was
            // (the login, recorded then), and the request itself is in an access or refusal
            // record by user. Summing it again here cost a second contended sum per request.
            (Some(u), _) => Ok(u),
            (None, Some(b)) => {
                self.password(views, &b.user, b.password, peer, "basic", m)
                    .await
            }
            (None, None) => {
                // A token no session has: the user it was for is unknown, so none is named.
                if presented {
                    self.audit
                        .sign_in(crate::audit::UNKNOWN, peer, "session", "failed");
                }
                Err(GatewayError::Unauthenticated)
            }
        }
    }

    /// Whether names and passwords are taken at all.
    pub fn passwords(&self) -> bool {
        self.passwords
    }

    /// Checks a name and password sent by `method` (`basic`, `form`), and records the attempt;
    /// refused at once while password sign-in is off.
    pub async fn password(
        &self,
        views: &Shared,
        name: &str,
        password: String,
        peer: IpAddr,
        method: &str,
        m: &Metrics,
    ) -> Result<Arc<User>, GatewayError> {
        if !self.passwords {
            return Err(GatewayError::PasswordsOff);
        }
        let user = views.read().users.get(name).cloned();
        // The audit trail names only users that exist: a name no user has may be a password
        // typed in the wrong field, and made-up names must not fill the period's tally.
        let shown = if user.is_some() {
            name
        } else {
            crate::audit::UNKNOWN
        };
        let fingerprint = user.as_ref().map_or([0; 32], |u| u.fingerprint);
        let key = self.cache.key(name, &password);
        let cached = self.cache.lookup(&key, &fingerprint);
        if cached == Some(true) {
            m.cache(CacheResult::Hit);
            let outcome = if user.is_some() { "ok" } else { "failed" };
            self.audit.sign_in(shown, peer, method, outcome);
            return user.ok_or(GatewayError::Unauthenticated);
        }
        if let Err(wait) = self.throttle.check(name, peer) {
            m.throttled.inc();
            self.audit.sign_in(shown, peer, method, "throttled");
            return Err(GatewayError::Throttled {
                retry_after: wait.as_secs().max(1),
            });
        }
        if cached == Some(false) {
            m.cache(CacheResult::Negative);
            self.audit.sign_in(shown, peer, method, "failed");
            self.throttle.fail(name, peer);
            return Err(GatewayError::Unauthenticated);
        }
        m.cache(CacheResult::Miss);
        let cell = self
            .inflight_lock()
            .entry(key)
            .or_insert_with(|| Arc::new(OnceCell::new()))
            .clone();
        // If the request running the verification goes away, a waiting one takes it over.
        let verdict = *cell
            .get_or_init(|| self.verify(&user, password, key, fingerprint, peer, m))
            .await;
        {
            let mut inflight = self.inflight_lock();
            if inflight.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                inflight.remove(&key);
            }
        }
        match (verdict, user) {
            (Verdict::Busy, _) => Err(GatewayError::Busy),
            (Verdict::Valid, Some(u)) => {
                self.audit.sign_in(shown, peer, method, "ok");
                Ok(u)
            }
            _ => {
                self.audit.sign_in(shown, peer, method, "failed");
                self.throttle.fail(name, peer);
                warden_core::log_limited!(info, user = %name, %peer, "sign-in refused");
                Err(GatewayError::Unauthenticated)
            }
        }
    }
}

impl Authenticator {
    fn inflight_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, DigestMap<cache::CredKey, Arc<OnceCell<Verdict>>>> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One Argon2id run on the bounded pool; its result goes into the cache.
    async fn verify(
        &self,
        user: &Option<Arc<User>>,
        password: String,
        key: cache::CredKey,
        fingerprint: cache::Fingerprint,
        peer: IpAddr,
        m: &Metrics,
    ) -> Verdict {
        let queued = Instant::now();
        // A request that goes away while queued gives its place back (see `fair`).
        let slot = self.pool.acquire(fair::Source::from(peer)).await;
        m.phase(Phase::Queue, queued.elapsed());
        let Some(_slot) = slot else {
            return Verdict::Busy;
        };
        let phc = user.as_ref().map(|u| u.record.password_hash.clone());
        let cost = self.argon2;
        let ok = tokio::task::spawn_blocking(move || {
            warden_auth::verify_password(phc.as_deref(), &password, &cost)
        })
        .await
        .unwrap_or(false);
        self.cache.insert(key, ok, fingerprint);
        if ok {
            Verdict::Valid
        } else {
            Verdict::Invalid
        }
    }
}

/// 400 for a request with more than one Authorization header.
pub(crate) fn two_authorizations() -> GatewayError {
    GatewayError::BadRequest("send one Authorization header".into())
}

/// The user of a live session: known, not expired by the gateway's own clock (the store's lease
/// may delete it later), and issued for the account as it is now (a changed or re-created
/// account has another generation). `true` beside it when the session is a provider's whose
/// word has run out, or whose provider is gone or now at another issuer (`refresher` says):
/// it must be refreshed (or ended) before it counts.
fn session_user(
    views: &Shared,
    token: &str,
    refresher: Option<&crate::oidc::refresh::Refresher>,
) -> Option<(Arc<User>, bool)> {
    let hash = session::token_hash(token);
    let v = views.read();
    let s = v.sessions.get(&hash)?;
    let now = warden_core::model::now_ms();
    if s.expires_ms <= now {
        return None;
    }
    let stale = s.provider.as_ref().is_some_and(|p| {
        p.refresh_at_ms <= now || refresher.is_some_and(|r| !r.provider_current(p))
    });
    v.users
        .get(&s.user)
        .filter(|u| u.record.generation == s.generation)
        .map(|u| (u.clone(), stale))
}
