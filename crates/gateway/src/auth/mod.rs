//! Authentication on the request path: session tokens, and HTTP Basic passwords checked with
//! Argon2id at most once per credential.
//!
//! Argon2id never runs on the async executor: verifications run on the blocking pool, at most
//! one per core at a time, with a bounded queue; past it the gateway answers 503 at once. The
//! password is dropped as soon as it is verified and is never logged.

pub(crate) mod basic;
pub(crate) mod cache;
pub(crate) mod session;
pub(crate) mod throttle;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::HeaderMap;
use tokio::sync::{OnceCell, Semaphore};

use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::views::{Shared, User};

/// Tuning of authentication.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// How long a verified credential is trusted without hashing again.
    pub cache_ttl: Duration,
    /// How long a refused credential is answered from memory.
    pub negative_ttl: Duration,
    /// Failed sign-ins per user per window before 429.
    pub failures_per_user: u32,
    /// Failed sign-ins per client address per window before 429.
    pub failures_per_addr: u32,
    /// The throttling window.
    pub window: Duration,
    /// The cost of new passwords: an unknown user's sign-in is checked against a dummy hash of
    /// this cost, so it takes as long as a real one.
    pub argon2: warden_auth::Argon2Cost,
}

pub(crate) struct Authenticator {
    argon2: warden_auth::Argon2Cost,
    cache: cache::CredentialCache,
    throttle: throttle::Throttle,
    pool: Semaphore,
    waiting: AtomicUsize,
    max_waiting: usize,
    /// Verifications under way, by credential: when a cached credential expires under load,
    /// every request carrying it waits for one Argon2id run instead of starting its own.
    inflight: Mutex<HashMap<cache::CredKey, Arc<OnceCell<Verdict>>>>,
}

/// The outcome of one verification, shared by every request that waited for it.
#[derive(Clone, Copy)]
enum Verdict {
    Valid,
    Invalid,
    Busy,
}

impl Authenticator {
    pub fn new(config: &AuthConfig) -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Self {
            argon2: config.argon2,
            cache: cache::CredentialCache::new(config.cache_ttl, config.negative_ttl, 100_000),
            throttle: throttle::Throttle::new(
                config.window,
                config.failures_per_user,
                config.failures_per_addr,
            ),
            pool: Semaphore::new(cores),
            waiting: AtomicUsize::new(0),
            max_waiting: 64 * cores,
            inflight: Mutex::new(HashMap::new()),
        }
    }

    /// The user a request is from: session token (bearer or cookie) first, then Basic.
    pub async fn authenticate(
        &self,
        views: &Shared,
        headers: &HeaderMap,
        peer: IpAddr,
        m: &Metrics,
    ) -> Result<Arc<User>, GatewayError> {
        let authorization = headers
            .get(http::header::AUTHORIZATION)
            .map(http::HeaderValue::as_bytes);
        let cookies = headers
            .get_all(http::header::COOKIE)
            .iter()
            .map(http::HeaderValue::as_bytes);
        self.authenticate_raw(views, authorization, cookies, peer, m)
            .await
    }

    /// [`Self::authenticate`] from the raw Authorization value and Cookie values.
    pub async fn authenticate_raw<'a>(
        &self,
        views: &Shared,
        authorization: Option<&[u8]>,
        cookies: impl Iterator<Item = &'a [u8]>,
        peer: IpAddr,
        m: &Metrics,
    ) -> Result<Arc<User>, GatewayError> {
        if let Some(token) = session::token_from(authorization, cookies) {
            return session_user(views, &token);
        }
        let Some(creds) = authorization.and_then(basic::parse) else {
            return Err(GatewayError::Unauthenticated);
        };
        self.password(views, &creds.user, creds.password, peer, m)
            .await
    }

    /// Checks a name and password.
    pub async fn password(
        &self,
        views: &Shared,
        name: &str,
        password: String,
        peer: IpAddr,
        m: &Metrics,
    ) -> Result<Arc<User>, GatewayError> {
        let user = views.read().users.get(name).cloned();
        let fingerprint = user.as_ref().map_or([0; 32], |u| u.fingerprint);
        let key = self.cache.key(name, &password);
        let cached = self.cache.lookup(&key, &fingerprint);
        if cached == Some(true) {
            m.cache("hit");
            return user.ok_or(GatewayError::Unauthenticated);
        }
        if let Err(wait) = self.throttle.check(name, peer) {
            m.throttled.inc();
            return Err(GatewayError::Throttled {
                retry_after: wait.as_secs().max(1),
            });
        }
        if cached == Some(false) {
            m.cache("negative");
            self.throttle.fail(name, peer);
            return Err(GatewayError::Unauthenticated);
        }
        m.cache("miss");
        let cell = self
            .inflight_lock()
            .entry(key)
            .or_insert_with(|| Arc::new(OnceCell::new()))
            .clone();
        // If the request running the verification goes away, a waiting one takes it over.
        let verdict = *cell
            .get_or_init(|| self.verify(&user, password, key, fingerprint, m))
            .await;
        {
            let mut inflight = self.inflight_lock();
            if inflight.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                inflight.remove(&key);
            }
        }
        match (verdict, user) {
            (Verdict::Busy, _) => Err(GatewayError::Busy),
            (Verdict::Valid, Some(u)) => Ok(u),
            _ => {
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
    ) -> std::sync::MutexGuard<'_, HashMap<cache::CredKey, Arc<OnceCell<Verdict>>>> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One Argon2id run on the bounded pool; its result goes into the cache.
    async fn verify(
        &self,
        user: &Option<Arc<User>>,
        password: String,
        key: cache::CredKey,
        fingerprint: cache::Fingerprint,
        m: &Metrics,
    ) -> Verdict {
        // Counted through a guard, so a request that goes away while queued frees its place.
        let waiting = Waiting(&self.waiting);
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_waiting {
            return Verdict::Busy;
        }
        let queued = Instant::now();
        let permit = self.pool.acquire().await;
        drop(waiting);
        m.phase("queue", queued.elapsed());
        let Ok(_permit) = permit else {
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

struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn session_user(views: &Shared, token: &str) -> Result<Arc<User>, GatewayError> {
    let hash = session::token_hash(token);
    let v = views.read();
    let s = v.sessions.get(&hash).ok_or(GatewayError::Unauthenticated)?;
    if s.expires_ms <= warden_core::model::now_ms() {
        return Err(GatewayError::Unauthenticated);
    }
    v.users
        .get(&s.user)
        .cloned()
        .ok_or(GatewayError::Unauthenticated)
}
