//! The OAuth 2.0 Device Authorization Grant (RFC 8628), for a sign-in from a terminal
//! (`warden login --provider`): the API asks the provider for a device code and a user code,
//! the person enters the user code on the provider's page, and the API polls the token
//! endpoint with the device code until the provider answers.
//!
//! The device code is a bearer credential until the person approves it: it is a [`Secret`] here
//! and sealed where it rests. The ID token it ends in is checked as the code flow's is, without
//! a nonce (the device flow sends none).

use http::StatusCode;
use serde::Deserialize;

use crate::provider::form;
use crate::token::ErrorAnswer;
use crate::{OidcError, Provider, Secret, Tokens};

/// The grant type of a device poll (RFC 8628 3.4).
const DEVICE_GRANT: &str = "urn:ietf:params:oauth:grant-type:device_code";
/// The interval between polls when the provider names none (RFC 8628 3.2).
const DEFAULT_INTERVAL_SECS: u64 = 5;
/// The longest user code shown (they are short words; a longer one is no provider's).
const MAX_USER_CODE: usize = 64;

/// The provider's answer to a device authorization request (RFC 8628 3.2), checked.
#[derive(Debug)]
pub struct DeviceStart {
    /// What the API polls with: never shown, sealed where it rests.
    pub device_code: Secret,
    /// What the person enters on the provider's page.
    pub user_code: String,
    /// The provider's page.
    pub verification_uri: String,
    /// The page with the code already in it, where the provider gives one.
    pub verification_uri_complete: Option<String>,
    /// How long the codes last, seconds.
    pub expires_in: u64,
    /// Seconds between two polls.
    pub interval: u64,
}

/// What one poll of the token endpoint gave.
#[derive(Debug)]
pub enum DevicePoll {
    /// The person has not yet approved (`authorization_pending`).
    Pending,
    /// Polled too often (`slow_down`): wait 5 s longer between polls from now on.
    SlowDown,
    /// Approved: the tokens, the ID token checked.
    Done(Tokens),
}

#[derive(Deserialize)]
struct Answer {
    device_code: String,
    user_code: String,
    #[serde(alias = "verification_url")]
    verification_uri: String,
    #[serde(default)]
    verification_uri_complete: Option<String>,
    expires_in: u64,
    #[serde(default)]
    interval: Option<u64>,
}

/// Whether `s` is an http(s) URL fit to print on a terminal: no control characters (a hostile
/// answer must not move the cursor or rewrite what the person reads).
fn printable_url(s: &str) -> bool {
    !s.chars().any(char::is_control)
        && s.parse::<http::Uri>().is_ok_and(|u| {
            matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some()
        })
}

// === impl Provider ===

impl Provider {
    /// Asks the provider for a device code and a user code (RFC 8628 3.1), with the configured
    /// scopes.
    pub async fn device_start(&self) -> Result<DeviceStart, OidcError> {
        let meta = self.metadata().await?;
        let Some(url) = &meta.device_authorization_endpoint else {
            return Err(OidcError::NoDeviceFlow {
                issuer: self.config().issuer.clone(),
            });
        };
        let body = form(&[("scope", &self.scope())]);
        let (status, bytes) = self.http.post_form(url, &self.basic(), body).await?;
        if status.is_client_error() {
            let error = serde_json::from_slice::<ErrorAnswer>(&bytes)
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
        let bad = |reason: &str| OidcError::BadAnswer {
            url: url.clone(),
            reason: reason.to_owned(),
        };
        let a: Answer = serde_json::from_slice(&bytes).map_err(|e| bad(&e.to_string()))?;
        if a.user_code.is_empty()
            || a.user_code.len() > MAX_USER_CODE
            || !a.user_code.chars().all(|c| c.is_ascii_graphic())
        {
            return Err(bad("its user_code is not a short printable code"));
        }
        if !printable_url(&a.verification_uri)
            || a.verification_uri_complete
                .as_deref()
                .is_some_and(|u| !printable_url(u))
        {
            return Err(bad("its verification URI is not a printable http(s) URL"));
        }
        Ok(DeviceStart {
            device_code: Secret::new(a.device_code),
            user_code: a.user_code,
            verification_uri: a.verification_uri,
            verification_uri_complete: a.verification_uri_complete,
            expires_in: a.expires_in,
            // At least a second: a provider saying 0 must not have the API hammer it.
            interval: a.interval.unwrap_or(DEFAULT_INTERVAL_SECS).max(1),
        })
    }

    /// Polls the token endpoint once with `device_code` (RFC 8628 3.4). `expired_token`,
    /// `access_denied` and every other refusal are [`OidcError::Refused`] with their code.
    pub async fn device_poll(&self, device_code: &Secret) -> Result<DevicePoll, OidcError> {
        let body = form(&[
            ("grant_type", DEVICE_GRANT),
            ("device_code", device_code.expose()),
        ]);
        match self.token_call(body, None, None).await {
            Ok(t) => Ok(DevicePoll::Done(t)),
            Err(OidcError::Refused { error }) if error == "authorization_pending" => {
                Ok(DevicePoll::Pending)
            }
            Err(OidcError::Refused { error }) if error == "slow_down" => Ok(DevicePoll::SlowDown),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_printable_http_urls_are_shown() {
        assert!(printable_url("https://idp.example/device"));
        assert!(printable_url("http://127.0.0.1:9/device?user_code=AB-CD"));
        assert!(!printable_url("https://idp.example/\u{1b}[2J"));
        assert!(!printable_url("javascript:alert(1)"));
        assert!(!printable_url("/device"));
    }
}
