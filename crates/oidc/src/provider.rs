//! One configured provider: discovery (lazy, so a gateway starts while its provider is down),
//! keys, the start of a sign-in, the code exchange and refresh.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use http::StatusCode;
use jsonwebtoken::jwk::JwkSet;
use percent_encoding::utf8_percent_encode;
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::sync::Mutex;

use crate::flow::{authorization_url, random_token, QUERY_VALUE};
use crate::http::{target, HttpClient};
use crate::jwks::{decoding_key, JwksCache};
use crate::token::{check_claims, validation, ErrorAnswer, Expect, TokenAnswer, ALLOWED};
use crate::{AuthStart, OidcError, Pkce, Secret, Tokens};

/// A provider's settings.
#[derive(Clone)]
pub struct ProviderConfig {
    /// The provider's id in warden (in paths and the audit trail).
    pub id: String,
    /// The issuer: discovery must name exactly this.
    pub issuer: String,
    /// warden's client id at the provider.
    pub client_id: String,
    /// warden's client secret.
    pub client_secret: Secret,
    /// Scopes asked for (`openid` is always asked).
    pub scopes: Vec<String>,
    /// The exact redirect URL registered at the provider.
    pub redirect_url: String,
    /// PEM trust roots for the provider's TLS; the system's when absent.
    pub ca_file: Option<PathBuf>,
    /// Shortest time between two key fetches caused by an unknown `kid`
    /// ([`crate::JWKS_REFETCH`] unless a test wants rotation seen at once).
    pub jwks_refetch: std::time::Duration,
}

impl fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("id", &self.id)
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret)
            .field("scopes", &self.scopes)
            .field("redirect_url", &self.redirect_url)
            .finish_non_exhaustive()
    }
}

/// The discovery document's fields warden uses.
#[derive(Debug, Deserialize)]
pub(crate) struct Metadata {
    issuer: String,
    authorization_endpoint: String,
    pub(crate) token_endpoint: String,
    jwks_uri: String,
    /// RFC 8628's endpoint, where the provider offers the device flow.
    #[serde(default)]
    pub(crate) device_authorization_endpoint: Option<String>,
}

/// A provider in use.
pub struct Provider {
    config: ProviderConfig,
    pub(crate) http: HttpClient,
    meta: Mutex<Option<Arc<Metadata>>>,
    jwks: Mutex<JwksCache>,
}

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Provider")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn now_secs() -> u64 {
    warden_core::model::now_ms() / 1000
}

// === impl Provider ===

impl Provider {
    /// A provider from `config`; checks its URLs and reads its trust roots, calls nothing yet.
    pub fn new(config: ProviderConfig) -> Result<Self, OidcError> {
        target(&config.issuer)?;
        // The redirect URL is the browser's, not one warden calls: plain http is fine there
        // for a gateway without TLS, but it must be an absolute URL without a fragment.
        let ok = config.redirect_url.parse::<http::Uri>().is_ok_and(|u| {
            matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some()
        }) && !config.redirect_url.contains('#');
        if !ok {
            return Err(OidcError::BadUrl {
                url: config.redirect_url.clone(),
                reason: "redirect_url must be an absolute http(s) URL without a fragment".into(),
            });
        }
        let http = HttpClient::new(config.ca_file.as_deref())?;
        Ok(Self {
            config,
            http,
            meta: Mutex::new(None),
            jwks: Mutex::new(JwksCache::default()),
        })
    }

    /// The settings.
    pub fn config(&self) -> &ProviderConfig {
        &self.config
    }

    async fn get_json<T: for<'de> Deserialize<'de>>(&self, url: &str) -> Result<T, OidcError> {
        let (status, body) = self.http.get(url).await?;
        if status != StatusCode::OK {
            return Err(OidcError::Status {
                url: url.to_owned(),
                status: status.as_u16(),
            });
        }
        serde_json::from_slice(&body).map_err(|e| OidcError::BadAnswer {
            url: url.to_owned(),
            reason: e.to_string(),
        })
    }

    /// The discovery document, fetched on first use (and again after a failed try).
    pub(crate) async fn metadata(&self) -> Result<Arc<Metadata>, OidcError> {
        let mut slot = self.meta.lock().await;
        if let Some(m) = &*slot {
            return Ok(m.clone());
        }
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.config.issuer.trim_end_matches('/')
        );
        let m: Metadata = self.get_json(&url).await?;
        if m.issuer != self.config.issuer {
            return Err(OidcError::IssuerMismatch {
                configured: self.config.issuer.clone(),
                found: m.issuer,
            });
        }
        // An https issuer's endpoints are https too: a discovery document must not send the
        // client secret or the code in clear to some port of this host.
        let issuer_https = self.config.issuer.starts_with("https://");
        let device = m.device_authorization_endpoint.iter();
        for u in [&m.authorization_endpoint, &m.token_endpoint, &m.jwks_uri]
            .into_iter()
            .chain(device)
        {
            target(u)?;
            if issuer_https && !u.starts_with("https://") {
                return Err(OidcError::BadUrl {
                    url: u.clone(),
                    reason:
                        "the issuer is https, so every endpoint its discovery names must be too"
                            .into(),
                });
            }
        }
        let m = Arc::new(m);
        *slot = Some(m.clone());
        Ok(m)
    }

    /// Begins a sign-in: new `state`, `nonce` and PKCE pair, and the URL to send the browser to.
    pub async fn begin(&self) -> Result<AuthStart, OidcError> {
        let meta = self.metadata().await?;
        let state = Secret::new(random_token());
        let nonce = Secret::new(random_token());
        let pkce = Pkce::new();
        let scope = self.scope();
        let url = authorization_url(
            &meta.authorization_endpoint,
            &[
                ("response_type", "code"),
                ("client_id", &self.config.client_id),
                ("redirect_uri", &self.config.redirect_url),
                ("scope", &scope),
                ("state", state.expose()),
                ("nonce", nonce.expose()),
                ("code_challenge", &pkce.challenge),
                ("code_challenge_method", "S256"),
            ],
        );
        Ok(AuthStart {
            url,
            state,
            nonce,
            verifier: pkce.verifier,
        })
    }

    /// Exchanges `code` (with the flow's PKCE `verifier`) for tokens; the ID token must carry
    /// `nonce`.
    pub async fn exchange(
        &self,
        code: &str,
        verifier: &Secret,
        nonce: &Secret,
    ) -> Result<Tokens, OidcError> {
        let form = form(&[
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", &self.config.redirect_url),
            ("code_verifier", verifier.expose()),
        ]);
        self.token_call(form, Some(nonce.expose()), None).await
    }

    /// Refreshes with `refresh_token`; the new ID token must name `sub`. A refused refresh
    /// (revoked, the person removed) is [`OidcError::Refused`].
    pub async fn refresh(&self, refresh_token: &Secret, sub: &str) -> Result<Tokens, OidcError> {
        let form = form(&[
            ("grant_type", "refresh_token"),
            ("refresh_token", refresh_token.expose()),
        ]);
        let mut t = self.token_call(form, None, Some(sub)).await?;
        // A provider may rotate refresh tokens or keep the old one (RFC 6749 6).
        if t.refresh_token.is_none() {
            t.refresh_token = Some(refresh_token.clone());
        }
        Ok(t)
    }

    pub(crate) async fn token_call(
        &self,
        form: String,
        nonce: Option<&str>,
        sub: Option<&str>,
    ) -> Result<Tokens, OidcError> {
        let meta = self.metadata().await?;
        let url = &meta.token_endpoint;
        let (status, body) = self.http.post_form(url, &self.basic(), form).await?;
        if status.is_client_error() {
            let error = serde_json::from_slice::<ErrorAnswer>(&body)
                .map(|e| e.error)
                .unwrap_or_else(|_| format!("status {status}"));
            return Err(OidcError::Refused { error });
        }
        if status != StatusCode::OK {
            return Err(OidcError::Status {
                url: url.clone(),
                status: status.as_u16(),
            });
        }
        let answer: TokenAnswer =
            serde_json::from_slice(&body).map_err(|e| OidcError::BadAnswer {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        let Some(id_token) = answer.id_token else {
            return Err(OidcError::BadAnswer {
                url: url.clone(),
                reason: "no id_token (warden needs one at sign-in and at each refresh to follow the person's claims)".into(),
            });
        };
        let now = now_secs();
        let expect = Expect {
            issuer: &self.config.issuer,
            client_id: &self.config.client_id,
            nonce,
            sub,
            now_secs: now,
        };
        let claims = self.validate(&id_token, &expect).await?;
        let mut expires = claims.exp;
        if let Some(e) = answer.expires_in {
            expires = expires.min(now.saturating_add(e));
        }
        Ok(Tokens {
            claims,
            refresh_token: answer.refresh_token.map(Secret::new),
            expires_ms: expires.saturating_mul(1000),
        })
    }

    /// The `Authorization` header of client_secret_basic (RFC 6749 2.3.1): both parts
    /// form-encoded, then Basic.
    pub(crate) fn basic(&self) -> String {
        let basic = STANDARD.encode(format!(
            "{}:{}",
            utf8_percent_encode(&self.config.client_id, QUERY_VALUE),
            utf8_percent_encode(self.config.client_secret.expose(), QUERY_VALUE)
        ));
        format!("Basic {basic}")
    }

    /// The scopes asked for: `openid`, then the configured ones.
    pub(crate) fn scope(&self) -> String {
        let mut scopes = vec!["openid".to_owned()];
        scopes.extend(
            self.config
                .scopes
                .iter()
                .filter(|s| *s != "openid")
                .cloned(),
        );
        scopes.join(" ")
    }

    /// Checks an ID token: algorithm in the allow-list, signature by a key of the provider's
    /// set, then the claims.
    async fn validate(
        &self,
        token: &str,
        expect: &Expect<'_>,
    ) -> Result<crate::IdClaims, OidcError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| OidcError::Token(format!("its header is unreadable: {e}")))?;
        if !ALLOWED.contains(&header.alg) {
            return Err(OidcError::Token(format!(
                "it is signed with {:?}, which warden does not accept",
                header.alg
            )));
        }
        let jwk = self.key(header.kid.as_deref()).await?;
        if let Some(alg) = jwk.common.key_algorithm {
            if format!("{alg:?}") != format!("{:?}", header.alg) {
                return Err(OidcError::Token(
                    "its algorithm is not its key's".to_owned(),
                ));
            }
        }
        let key = decoding_key(&jwk)
            .ok_or_else(|| OidcError::Token("the provider's key is unusable".into()))?;
        let data = jsonwebtoken::decode::<Map<String, Value>>(
            token,
            &key,
            &validation(header.alg, expect),
        )
        .map_err(|e| OidcError::Token(e.to_string()))?;
        check_claims(data.claims, expect)
    }

    /// The key `kid` names: from the cache, else from a new fetch of the set if the last one
    /// is old enough.
    async fn key(&self, kid: Option<&str>) -> Result<jsonwebtoken::jwk::Jwk, OidcError> {
        let mut cache = self.jwks.lock().await;
        if let Some(k) = cache.find(kid) {
            return Ok(k);
        }
        let now = Instant::now();
        if cache.may_refetch(now, self.config.jwks_refetch) {
            let meta = self.metadata().await?;
            let set: JwkSet = self.get_json(&meta.jwks_uri).await?;
            cache.set = Some(set);
            cache.fetched = Some(now);
            if let Some(k) = cache.find(kid) {
                return Ok(k);
            }
        }
        Err(OidcError::Token(format!(
            "it is signed by a key ({}) the provider does not publish",
            kid.unwrap_or("no kid")
        )))
    }
}

/// An `application/x-www-form-urlencoded` body.
pub(crate) fn form(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", utf8_percent_encode(v, QUERY_VALUE)))
        .collect::<Vec<_>>()
        .join("&")
}
