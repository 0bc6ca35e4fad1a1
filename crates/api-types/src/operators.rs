//! Bodies of `/v1/operators`, `/v1/login`, `/v1/logout` and `/v1/tokens`. Passwords and tokens
//! go in; hashes never come out, and a token comes out once, when it is made.

use serde::{Deserialize, Serialize};
use warden_core::{OperatorRecord, OperatorSource, Role, TokenKind, TokenRecord};

/// Body of `POST /v1/operators`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct NewOperator {
    /// Name.
    pub name: String,
    /// Password in clear; hashed with Argon2id before it is stored.
    pub password: String,
    /// Roles: `{"role": "owner"}`, `{"role": "deployer", "apps": ["web"]}`, `{"role": "viewer"}`.
    pub roles: Vec<Role>,
}

/// Body of `PATCH /v1/operators/{name}`: what changes. Any change ends every token of the
/// operator.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct OperatorChange {
    /// New password in clear; hashed with Argon2id before it is stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// New roles, replacing the old ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roles: Option<Vec<Role>>,
}

/// An operator as the API shows it: never the hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct OperatorView {
    /// Name.
    pub name: String,
    /// Roles.
    pub roles: Vec<Role>,
    /// Where the operator comes from.
    pub source: OperatorSource,
    /// Whether the operator can sign in with a password.
    pub password: bool,
}

impl From<OperatorRecord> for OperatorView {
    fn from(o: OperatorRecord) -> Self {
        Self {
            name: o.name,
            roles: o.roles,
            source: o.source,
            password: o.password_hash.is_some(),
        }
    }
}

/// Body of `POST /v1/login`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Login {
    /// Operator name.
    pub name: String,
    /// Password in clear.
    pub password: String,
}

/// Answer of `POST /v1/login` and `POST /v1/tokens`: the token, shown this once.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct IssuedToken {
    /// Public id, for listing and revoking.
    pub id: String,
    /// The token: send it as `Authorization: Bearer <token>`. Never shown again.
    pub token: String,
    /// The operator it acts as.
    pub operator: String,
    /// Expiry, milliseconds since the Unix epoch.
    pub expires_ms: u64,
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedToken")
            .field("id", &self.id)
            .field("token", &"<redacted>")
            .field("operator", &self.operator)
            .field("expires_ms", &self.expires_ms)
            .finish()
    }
}

/// Body of `POST /v1/tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    /// What it is for.
    pub label: String,
    /// Seconds until it expires (1 to 31536000, a year); 90 days if not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in: Option<u64>,
}

/// A token as `GET /v1/tokens` lists it: never the token or its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TokenView {
    /// Public id.
    pub id: String,
    /// The operator it acts as.
    pub operator: String,
    /// Session (`warden login`) or API token.
    pub kind: TokenKind,
    /// What it is for.
    pub label: String,
    /// Creation, milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// Expiry, milliseconds since the Unix epoch.
    pub expires_ms: u64,
}

impl From<TokenRecord> for TokenView {
    fn from(t: TokenRecord) -> Self {
        Self {
            id: t.id,
            operator: t.operator,
            kind: t.kind,
            label: t.label,
            created_ms: t.created_ms,
            expires_ms: t.expires_ms,
        }
    }
}
