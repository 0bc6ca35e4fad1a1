//! `warden operators` (who may change warden, with which roles) and `warden tokens` (an
//! operator's personal API tokens for automation).

use anyhow::bail;
use clap::Subcommand;
use serde_json::json;
use warden_api_types::{
    IssuedToken, NewOperator, NewToken, OperatorChange, OperatorSource, OperatorView, Role,
    TokenView,
};

use crate::client::Client;
use crate::{table, Output};

/// `warden operators ...`
#[derive(Debug, Subcommand)]
pub enum OperatorsCommand {
    /// List operators and their roles
    List,
    /// Add a local operator. Without --password-stdin a password is generated and printed once.
    Add {
        /// Operator name
        name: String,
        /// Role: owner (everything) or viewer (reads only) (repeatable)
        #[arg(long = "role", value_parser = ["owner", "viewer"])]
        roles: Vec<String>,
        /// An app this operator deploys: push, config, rollback, scale, logs (repeatable)
        #[arg(long = "deploys")]
        deploys: Vec<String>,
        /// Read the password from standard input (first line)
        #[arg(long)]
        password_stdin: bool,
    },
    /// Change an operator's password or roles; every token of theirs ends
    Change {
        /// Operator name
        name: String,
        /// New role, replacing the old ones: owner or viewer (repeatable)
        #[arg(long = "role", value_parser = ["owner", "viewer"])]
        roles: Vec<String>,
        /// An app this operator deploys, replacing the old roles (repeatable)
        #[arg(long = "deploys")]
        deploys: Vec<String>,
        /// Read the new password from standard input (first line)
        #[arg(long)]
        password_stdin: bool,
    },
    /// Remove an operator; every token of theirs ends
    Remove {
        /// Operator name
        name: String,
    },
}

/// `warden tokens ...`
#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// List your tokens (an owner: everyone's)
    List,
    /// Make a personal API token for automation; it is printed once
    Create {
        /// What it is for
        #[arg(long)]
        label: String,
        /// Seconds until it expires (at most a year) [default: 90 days]
        #[arg(long)]
        expires_in: Option<u64>,
    },
    /// Revoke a token by its id (`warden tokens list`)
    Revoke {
        /// Token id
        id: String,
    },
}

fn roles(names: Vec<String>, deploys: Vec<String>) -> Vec<Role> {
    let mut roles: Vec<Role> = names
        .iter()
        .map(|r| match r.as_str() {
            "owner" => Role::Owner,
            _ => Role::Viewer,
        })
        .collect();
    if !deploys.is_empty() {
        roles.push(Role::Deployer { apps: deploys });
    }
    roles
}

/// A role as a person reads it.
fn role_text(r: &Role) -> String {
    match r {
        Role::Owner => "owner".into(),
        Role::Viewer => "viewer".into(),
        Role::Deployer { apps } => format!("deployer of {}", apps.join(",")),
    }
}

pub(crate) async fn operators(
    api: &Client,
    out: &Output,
    cmd: OperatorsCommand,
) -> anyhow::Result<()> {
    match cmd {
        OperatorsCommand::List => {
            let ops: Vec<OperatorView> = api.call("GET", "/v1/operators").await?;
            out.value(&ops, |ops| {
                let rows = ops.iter().map(|o| {
                    let roles: Vec<String> = o.roles.iter().map(role_text).collect();
                    let source = match &o.source {
                        OperatorSource::Local => "local".to_owned(),
                        OperatorSource::Provider { id, .. } => format!("provider {id}"),
                    };
                    vec![o.name.clone(), roles.join("; "), source]
                });
                table::print(&["NAME", "ROLES", "SOURCE"], rows);
            });
        }
        OperatorsCommand::Add {
            name,
            roles: names,
            deploys,
            password_stdin,
        } => {
            let roles = roles(names, deploys);
            if roles.is_empty() {
                bail!("give a role: --role owner, --role viewer or --deploys APP");
            }
            let (password, generated) = if password_stdin {
                (crate::password_from_stdin()?, false)
            } else {
                (warden_auth::generate_password(), true)
            };
            let body = NewOperator {
                name,
                password: password.clone(),
                roles,
            };
            let op: OperatorView = api.call_with("POST", "/v1/operators", &body).await?;
            let mut v = serde_json::to_value(&op)?;
            if generated {
                v["password"] = json!(password);
            }
            out.value(&v, |_| {
                let roles: Vec<String> = op.roles.iter().map(role_text).collect();
                println!("operator {} added ({})", op.name, roles.join("; "));
                if generated {
                    println!("password (shown once): {password}");
                }
            });
        }
        OperatorsCommand::Change {
            name,
            roles: names,
            deploys,
            password_stdin,
        } => {
            let mut body = OperatorChange::default();
            if password_stdin {
                body.password = Some(crate::password_from_stdin()?);
            }
            let roles = roles(names, deploys);
            if !roles.is_empty() {
                body.roles = Some(roles);
            }
            if body == OperatorChange::default() {
                bail!("say what changes: --password-stdin, --role or --deploys");
            }
            let op: OperatorView = api
                .call_with("PATCH", &format!("/v1/operators/{name}"), &body)
                .await?;
            out.value(&op, |o| {
                let roles: Vec<String> = o.roles.iter().map(role_text).collect();
                println!(
                    "operator {} changed ({}); their tokens ended",
                    o.name,
                    roles.join("; ")
                );
            });
        }
        OperatorsCommand::Remove { name } => {
            api.act("DELETE", &format!("/v1/operators/{name}")).await?;
            out.done(format!("operator {name} removed; their tokens ended"));
        }
    }
    Ok(())
}

pub(crate) async fn tokens(api: &Client, out: &Output, cmd: TokensCommand) -> anyhow::Result<()> {
    match cmd {
        TokensCommand::List => {
            let tokens: Vec<TokenView> = api.call("GET", "/v1/tokens").await?;
            out.value(&tokens, |tokens| {
                let rows = tokens.iter().map(|t| {
                    vec![
                        t.id.clone(),
                        t.operator.clone(),
                        crate::w(&t.kind),
                        t.label.clone(),
                        crate::deploy::when(t.created_ms),
                        crate::deploy::when(t.expires_ms),
                    ]
                });
                table::print(
                    &["ID", "OPERATOR", "KIND", "LABEL", "CREATED", "EXPIRES"],
                    rows,
                );
            });
        }
        TokensCommand::Create { label, expires_in } => {
            let t: IssuedToken = api
                .call_with("POST", "/v1/tokens", &NewToken { label, expires_in })
                .await?;
            if out.json {
                println!(
                    "{}",
                    json!({"id": t.id, "token": t.token, "operator": t.operator, "expires_ms": t.expires_ms})
                );
            } else {
                println!(
                    "token {} of operator {} until {} UTC (shown once; send it as WARDEN_TOKEN):",
                    t.id,
                    t.operator,
                    crate::deploy::when(t.expires_ms)
                );
                println!("{}", t.token);
            }
        }
        TokensCommand::Revoke { id } => {
            api.act("DELETE", &format!("/v1/tokens/{id}")).await?;
            out.done(format!("token {id} revoked"));
        }
    }
    Ok(())
}
