//! Where the API is and which token to present. The API: flag, then env (both through clap),
//! then the config file, then the data directory of a local `warden up`, then the session of
//! `warden login`. The token: flag or env, then the session `warden login` stored for that API,
//! then the config file, then the break-glass admin token in the data directory.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::ClientArgs;

/// A resolved API address and token.
#[derive(Clone)]
pub struct Endpoint {
    /// Base URL without a trailing slash.
    pub api: String,
    /// The token presented: an operator's or the admin token.
    pub token: String,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("api", &self.api)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// The CLI config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    /// API base URL.
    api: Option<String>,
    /// Admin token in clear (prefer `token_file`).
    token: Option<String>,
    /// File holding the admin token.
    token_file: Option<PathBuf>,
}

fn default_config_path() -> Option<PathBuf> {
    Some(crate::session::config_dir()?.join("cli.toml"))
}

fn read_file_config(args: &ClientArgs) -> anyhow::Result<FileConfig> {
    let (path, explicit) = match &args.config {
        Some(p) => (p.clone(), true),
        None => match default_config_path() {
            Some(p) => (p, false),
            None => return Ok(FileConfig::default()),
        },
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => toml::from_str(&text)
            .with_context(|| format!("config file {} is not valid", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
            Ok(FileConfig::default())
        }
        Err(e) => Err(e).with_context(|| format!("cannot read config file {}", path.display())),
    }
}

fn read_token(path: &Path) -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the admin token from {}", path.display()))?
        .trim()
        .to_owned())
}

/// Where the API is, or how to name it, and the config file read on the way.
fn resolve_api(args: &ClientArgs, file: &FileConfig) -> anyhow::Result<String> {
    let endpoints = args.data_dir.join("endpoints.json");
    let api = match args.api.clone().or(file.api.clone()) {
        Some(a) => a,
        None => match std::fs::read_to_string(&endpoints) {
            Ok(text) => {
                let v: serde_json::Value = serde_json::from_str(&text)
                    .with_context(|| format!("{} is not valid JSON", endpoints.display()))?;
                v["api"].as_str().map(str::to_owned).with_context(|| format!("{} names no api", endpoints.display()))?
            }
            Err(_) => match crate::session::Session::load()? {
                Some(s) => s.api,
                None => bail!(
                    "cannot tell where the warden API is: pass --api URL, set WARDEN_API, write `api = \"...\"` in {}, or run from the directory holding the data dir of `warden up` ({})",
                    default_config_path().map(|p| p.display().to_string()).unwrap_or_else(|| "the config file".into()),
                    args.data_dir.display()
                ),
            },
        },
    };
    Ok(api.trim_end_matches('/').to_owned())
}

/// The API's address alone, for `warden login`, which needs no token yet.
pub(crate) fn api_only(args: &ClientArgs) -> anyhow::Result<String> {
    resolve_api(args, &read_file_config(args)?)
}

/// Resolves the endpoint or explains how to name one.
pub(crate) fn resolve(args: &ClientArgs) -> anyhow::Result<Endpoint> {
    let file = read_file_config(args)?;
    let api = resolve_api(args, &file)?;
    if let Some(t) = args.token.clone() {
        return Ok(Endpoint { api, token: t });
    }
    if let Some(session) = crate::session::Session::load()?.filter(|s| s.api == api) {
        return Ok(Endpoint {
            api,
            token: session.token_if_live()?,
        });
    }
    let token = match (file.token, file.token_file) {
        (Some(t), _) => t,
        (None, Some(p)) => read_token(&p)?,
        (None, None) => {
            let p = args.data_dir.join("admin-token");
            if !p.exists() {
                bail!(
                    "no token: `warden login` as an operator, pass --token, set WARDEN_TOKEN, or set token_file in the config file (a local `warden up` with the admin token on writes it to {})",
                    p.display()
                );
            }
            read_token(&p)?
        }
    };
    Ok(Endpoint { api, token })
}
