//! Operators: the people (and their automation) who change warden through the API, each with
//! roles, and the tokens they present. A separate namespace from app users (`users/<name>`): an
//! app user is not an operator unless made one.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What an operator may do. An operator holds one or more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "role", rename_all = "snake_case", deny_unknown_fields)]
pub enum Role {
    /// Everything.
    Owner,
    /// Push, config, rollback, scale, releases and logs of the named apps, and reads of them;
    /// nothing else changes.
    Deployer {
        /// The apps, by name.
        apps: Vec<String>,
    },
    /// Every read except the store backup and what shows secrets (config values, app data);
    /// no change.
    Viewer,
}

/// Where an operator comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum OperatorSource {
    /// Made through the API, signing in with a password kept here.
    #[default]
    Local,
    /// Made by a sign-in through an identity provider
    /// (`{"provider": {"id": "corp", "issuer": "https://…", "subject": "248289761001"}}`): no
    /// password, roles replaced from the person's claims at every sign-in. Only a sign-in with
    /// the same issuer and subject is this operator: the name comes from a claim any account
    /// may share (`preferred_username`), the subject is the provider's stable id of the person.
    Provider {
        /// The provider's id (its `[[oidc]]` table's `id`).
        id: String,
        /// The provider's issuer when the operator was made.
        issuer: String,
        /// The person's `sub` at that issuer.
        subject: String,
    },
}

impl OperatorSource {
    /// The provider's id, for an operator from one.
    pub fn provider(&self) -> Option<&str> {
        match self {
            Self::Local => None,
            Self::Provider { id, .. } => Some(id),
        }
    }
}

/// An operator. Stored at `operators/<name>`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct OperatorRecord {
    /// Name, by the rules of every name (`validate_name`).
    pub name: String,
    /// Argon2id hash in PHC string form; `None` for an operator who cannot sign in with a
    /// password (one from an identity provider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_hash: Option<String>,
    /// What the operator may do.
    pub roles: Vec<Role>,
    /// Changes whenever the password or roles change: a token is valid only for the
    /// generation it was issued for.
    pub generation: String,
    /// Where the operator comes from.
    #[serde(default)]
    pub source: OperatorSource,
}

impl fmt::Debug for OperatorRecord {
    // The hash is an offline-cracking target: keep it out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperatorRecord")
            .field("name", &self.name)
            .field(
                "password_hash",
                &self.password_hash.as_ref().map(|_| "<redacted>"),
            )
            .field("roles", &self.roles)
            .field("generation", &self.generation)
            .field("source", &self.source)
            .finish()
    }
}

/// What a token was issued by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    /// `POST /v1/login`: a session, ended by `POST /v1/logout`.
    Session,
    /// `POST /v1/tokens`: for automation, listed and revocable.
    Api,
}

/// An operator's token. Stored at `api-tokens/<sha256 of token>`: the token itself never is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TokenRecord {
    /// Short public id, for listing and revoking (not the token, nor its hash).
    pub id: String,
    /// The operator it acts as.
    pub operator: String,
    /// The operator's generation when it was issued: a changed password or roles ends it.
    pub generation: String,
    /// Session or API token.
    pub kind: TokenKind,
    /// What it is for, as its maker said.
    #[serde(default)]
    pub label: String,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// Expiry time, milliseconds since the Unix epoch.
    pub expires_ms: u64,
}
