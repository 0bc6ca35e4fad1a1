//! Bodies of `/v1/users`. Passwords go in, and neither they nor their hashes ever come out.

use serde::{Deserialize, Serialize};
use warden_core::{ProviderMark, UserRecord};

/// Body of `POST /v1/users`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct NewUser {
    /// Login name.
    pub name: String,
    /// Password in clear; hashed with Argon2id before it is stored.
    pub password: String,
    /// Clearance label in the lattice's text form.
    pub clearance: String,
    /// Groups.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// Body of `PATCH /v1/users/{name}`: what changes. Any change ends the user's sessions.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct UserChange {
    /// New password in clear; hashed with Argon2id before it is stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// New clearance label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clearance: Option<String>,
    /// New groups, replacing the old ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<String>>,
}

/// A user as the API shows it: never the hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct UserView {
    /// Login name.
    pub name: String,
    /// Canonical clearance label.
    pub clearance: String,
    /// Groups.
    pub groups: Vec<String>,
    /// For a person who signs in through an identity provider: which one, and the claims and
    /// rules that decided the clearance at the last sign-in or refresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderMark>,
}

impl From<UserRecord> for UserView {
    fn from(u: UserRecord) -> Self {
        Self {
            name: u.name,
            clearance: u.clearance,
            groups: u.groups,
            provider: u.provider,
        }
    }
}

/// An app user's session at the gateways, as `GET /v1/sessions` shows it: never its token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SessionView {
    /// The user it belongs to.
    pub user: String,
    /// When it began, ms since the Unix epoch.
    pub created_ms: u64,
    /// When it ends unless ended before, ms since the Unix epoch.
    pub expires_ms: u64,
    /// The identity provider it began with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}
