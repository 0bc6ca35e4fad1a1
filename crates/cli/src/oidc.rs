//! `warden oidc`: identity providers added through the API. The client secret is read from a
//! file or standard input, never taken as an argument (it would show in `ps` and in shell
//! history), and never shown.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use warden_api_types::{NewOidcProvider, OidcProviderChange, OidcProviderView};
use warden_core::ClaimRule;

use crate::client::Client;
use crate::{table, Output};

/// `warden oidc ...`
#[derive(Debug, Subcommand)]
pub enum OidcCommand {
    /// List identity providers: the config file's and those added here
    List,
    /// Add an identity provider (checked, and its discovery tried, before it is kept)
    Add {
        /// The provider's id: letters, digits and '-'
        id: String,
        /// The issuer URL
        #[arg(long)]
        issuer: String,
        /// warden's client id at the provider
        #[arg(long)]
        client_id: String,
        /// The exact redirect URL registered at the provider (GATEWAY/login/oidc/ID/callback)
        #[arg(long)]
        redirect_url: String,
        /// The other fields.
        #[command(flatten)]
        fields: Fields,
    },
    /// Change an identity provider added here
    Change {
        /// The provider's id
        id: String,
        /// New issuer URL (give the client secret again with it: --secret-file or
        /// --secret-stdin; warden does not send the one it holds to another issuer)
        #[arg(long)]
        issuer: Option<String>,
        /// New client id
        #[arg(long)]
        client_id: Option<String>,
        /// New redirect URL
        #[arg(long)]
        redirect_url: Option<String>,
        /// The other fields.
        #[command(flatten)]
        fields: Fields,
    },
    /// Remove an identity provider added here: its button goes, its sign-ins in flight fail,
    /// its people's sessions end at their next refresh
    Remove {
        /// The provider's id
        id: String,
    },
}

/// What `add` and `change` share.
#[derive(Debug, Args)]
pub struct Fields {
    /// The sign-in button's text
    #[arg(long)]
    label: Option<String>,
    /// A file holding warden's client secret
    #[arg(long, conflicts_with = "secret_stdin")]
    secret_file: Option<PathBuf>,
    /// Read warden's client secret from standard input (first line)
    #[arg(long)]
    secret_stdin: bool,
    /// A scope asked for besides openid (repeatable) [profile, groups]
    #[arg(long = "scope")]
    scopes: Vec<String>,
    /// The claim that names the person [preferred_username]
    #[arg(long)]
    username_claim: Option<String>,
    /// PEM trust roots for the provider's TLS (a path on the gateways; a change of it needs
    /// the client secret again)
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// A JSON file of claim rules: [{"claim", "value", "level", "categories", "groups"}, ...]
    #[arg(long)]
    rules: Option<PathBuf>,
}

impl Fields {
    fn secret(&self) -> anyhow::Result<Option<String>> {
        let text = match (&self.secret_file, self.secret_stdin) {
            (Some(f), _) => std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the client secret file {}", f.display()))?,
            (None, true) => {
                let mut s = String::new();
                std::io::stdin()
                    .read_to_string(&mut s)
                    .context("reading the client secret from standard input")?;
                s.lines().next().unwrap_or("").to_owned()
            }
            (None, false) => return Ok(None),
        };
        let text = text.trim().to_owned();
        if text.is_empty() {
            bail!("the client secret given is empty");
        }
        Ok(Some(text))
    }

    fn rules(&self) -> anyhow::Result<Option<Vec<ClaimRule>>> {
        let Some(f) = &self.rules else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("cannot read the rules file {}", f.display()))?;
        let rules = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not a JSON array of rules ({{\"claim\", \"value\", \"level\", \"categories\", \"groups\"}})",
                f.display()
            )
        })?;
        Ok(Some(rules))
    }

    fn scopes(&self) -> Option<Vec<String>> {
        (!self.scopes.is_empty()).then(|| self.scopes.clone())
    }
}

pub(crate) async fn run(api: &Client, out: &Output, cmd: OidcCommand) -> anyhow::Result<()> {
    match cmd {
        OidcCommand::List => {
            let all: Vec<OidcProviderView> = api.call("GET", "/v1/oidc/providers").await?;
            out.value(&all, |all| {
                let rows = all.iter().map(|p| {
                    vec![
                        p.id.clone(),
                        p.label.clone(),
                        p.issuer.clone(),
                        p.source.clone(),
                        p.rules.len().to_string(),
                    ]
                });
                table::print(&["ID", "LABEL", "ISSUER", "SOURCE", "RULES"], rows);
            });
        }
        OidcCommand::Add {
            id,
            issuer,
            client_id,
            redirect_url,
            fields,
        } => {
            let Some(client_secret) = fields.secret()? else {
                bail!("give the client secret with --secret-file FILE or --secret-stdin");
            };
            let body = NewOidcProvider {
                id,
                label: fields.label.clone(),
                issuer,
                client_id,
                client_secret,
                scopes: fields.scopes(),
                redirect_url,
                username_claim: fields.username_claim.clone(),
                ca_file: fields.ca_file.clone(),
                rules: fields.rules()?.unwrap_or_default(),
            };
            let p: OidcProviderView = api.call_with("POST", "/v1/oidc/providers", &body).await?;
            out.value(&p, |p| {
                println!("identity provider {} added ({})", p.id, p.issuer)
            });
        }
        OidcCommand::Change {
            id,
            issuer,
            client_id,
            redirect_url,
            fields,
        } => {
            let body = OidcProviderChange {
                label: fields.label.clone(),
                issuer,
                client_id,
                client_secret: fields.secret()?,
                scopes: fields.scopes(),
                redirect_url,
                username_claim: fields.username_claim.clone(),
                ca_file: fields.ca_file.clone(),
                rules: fields.rules()?,
            };
            let path = format!("/v1/oidc/providers/{id}");
            let p: OidcProviderView = api.call_with("PATCH", &path, &body).await?;
            out.value(&p, |p| println!("identity provider {} changed", p.id));
        }
        OidcCommand::Remove { id } => {
            api.act("DELETE", &format!("/v1/oidc/providers/{id}"))
                .await?;
            out.done(format!("identity provider {id} removed"));
        }
    }
    Ok(())
}
