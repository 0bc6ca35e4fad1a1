//! Bodies of `/v1/oidc/providers`: identity providers added through the API. The client secret
//! goes in (sealed before it is stored); it never comes out.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use warden_core::ClaimRule;

/// Body of `POST /v1/oidc/providers`: the fields of a config file's `[[oidc]]` table, with the
/// client secret itself in place of a file.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct NewOidcProvider {
    /// The provider's id: letters, digits and '-'.
    pub id: String,
    /// The sign-in page's button text [absent: the id].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The issuer URL; discovery must name exactly it.
    pub issuer: String,
    /// warden's client id at the provider.
    pub client_id: String,
    /// warden's client secret; sealed before it is stored, never returned.
    pub client_secret: String,
    /// Scopes asked for besides `openid` [`profile`, `groups`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<String>>,
    /// The exact redirect URL registered at the provider.
    pub redirect_url: String,
    /// The claim that names the person (default `preferred_username`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username_claim: Option<String>,
    /// PEM trust roots for the provider's TLS, a path on the gateways [the system's].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Claims → clearance rules.
    #[serde(default)]
    pub rules: Vec<ClaimRule>,
}

impl fmt::Debug for NewOidcProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewOidcProvider")
            .field("id", &self.id)
            .field("issuer", &self.issuer)
            .field("client_secret", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// Body of `PATCH /v1/oidc/providers/{id}`: what changes (the rest stays).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct OidcProviderChange {
    /// New button text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// New issuer URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// New client id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// New client secret; sealed before it is stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// New scopes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<String>>,
    /// New redirect URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_url: Option<String>,
    /// New username claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username_claim: Option<String>,
    /// New trust roots file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// New rules, replacing the old ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<ClaimRule>>,
}

impl fmt::Debug for OidcProviderChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OidcProviderChange")
            .field("issuer", &self.issuer)
            .field(
                "client_secret",
                &self.client_secret.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

/// A provider as the API shows it: never its client secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct OidcProviderView {
    /// The provider's id.
    pub id: String,
    /// The button text.
    pub label: String,
    /// The issuer URL.
    pub issuer: String,
    /// warden's client id.
    pub client_id: String,
    /// `set`: the secret is kept (and never shown).
    pub secret: String,
    /// Scopes asked for besides `openid`.
    pub scopes: Vec<String>,
    /// The redirect URL.
    pub redirect_url: String,
    /// The claim that names the person.
    pub username_claim: String,
    /// Trust roots file, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Claims → clearance rules.
    pub rules: Vec<ClaimRule>,
    /// `config` (the config file's, changed only there) or `api`.
    pub source: String,
}

impl From<warden_core::OidcProviderRecord> for OidcProviderView {
    fn from(r: warden_core::OidcProviderRecord) -> Self {
        Self {
            id: r.id,
            label: r.label,
            issuer: r.issuer,
            client_id: r.client_id,
            secret: "set".into(),
            scopes: r.scopes,
            redirect_url: r.redirect_url,
            username_claim: r.username_claim,
            ca_file: r.ca_file,
            rules: r.rules,
            source: "api".into(),
        }
    }
}
