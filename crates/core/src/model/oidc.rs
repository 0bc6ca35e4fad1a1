//! Identity providers added through the API (issue 36), stored at `oidc/providers/<id>`, and
//! the claim rules they share with the config file's `[[oidc]]` tables.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One mapping rule, as written in the config file or an API body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ClaimRule {
    /// The claim looked at (`groups`, `roles`, `department`, …).
    pub claim: String,
    /// The value that makes the rule match: the claim's string, or one of its array's strings.
    pub value: String,
    /// The level the rule gives.
    #[serde(default)]
    pub level: Option<String>,
    /// The categories the rule gives.
    #[serde(default)]
    pub categories: Vec<String>,
    /// The groups the rule gives.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// A provider added through the API: the config table's fields, the client secret sealed
/// under the key the sign-in records are sealed with (context `oidc-client-secret:<id>`).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcProviderRecord {
    /// The provider's id (a valid name without `_`).
    pub id: String,
    /// The sign-in page's button text.
    pub label: String,
    /// The issuer URL.
    pub issuer: String,
    /// warden's client id at the provider.
    pub client_id: String,
    /// warden's client secret, sealed; never returned by the API.
    pub client_secret_sealed: String,
    /// Scopes asked for besides `openid`.
    pub scopes: Vec<String>,
    /// The exact redirect URL registered at the provider.
    pub redirect_url: String,
    /// The claim that names the person.
    pub username_claim: String,
    /// PEM trust roots for the provider's TLS (a path on the gateways); the system's when absent.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Claims → clearance rules.
    #[serde(default)]
    pub rules: Vec<ClaimRule>,
}

impl fmt::Debug for OidcProviderRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Sealed, but no business in a log either.
        f.debug_struct("OidcProviderRecord")
            .field("id", &self.id)
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}
