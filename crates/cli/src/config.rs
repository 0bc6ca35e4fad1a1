//! Where the API is and which token to present: flag, then env (both through clap), then the
//! config file, then the data directory of a local `warden up`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::ClientArgs;

/// A resolved API address and token.
#[derive(Clone)]
pub struct Endpoint {
    /// Base URL without a trailing slash.
    pub api: String,
    /// Admin token.
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
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("warden").join("cli.toml"))
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

/// Resolves the endpoint or explains how to name one.
pub(crate) fn resolve(args: &ClientArgs) -> anyhow::Result<Endpoint> {
    let file = read_file_config(args)?;
    let endpoints = args.data_dir.join("endpoints.json");
    let api = match args.api.clone().or(file.api) {
        Some(a) => a,
        None => match std::fs::read_to_string(&endpoints) {
            Ok(text) => {
                let v: serde_json::Value = serde_json::from_str(&text)
                    .with_context(|| format!("{} is not valid JSON", endpoints.display()))?;
                v["api"].as_str().map(str::to_owned).with_context(|| format!("{} names no api", endpoints.display()))?
            }
            Err(_) => bail!(
                "cannot tell where the warden API is: pass --api URL, set WARDEN_API, write `api = \"...\"` in {}, or run from the directory holding the data dir of `warden up` ({})",
                default_config_path().map(|p| p.display().to_string()).unwrap_or_else(|| "the config file".into()),
                args.data_dir.display()
            ),
        },
    };
    let token = match (args.token.clone(), file.token, file.token_file) {
        (Some(t), _, _) | (None, Some(t), _) => t,
        (None, None, Some(p)) => read_token(&p)?,
        (None, None, None) => {
            let p = args.data_dir.join("admin-token");
            if !p.exists() {
                bail!(
                    "no admin token: pass --token, set WARDEN_TOKEN, or set token_file in the config file (a local `warden up` writes it to {})",
                    p.display()
                );
            }
            read_token(&p)?
        }
    };
    Ok(Endpoint {
        api: api.trim_end_matches('/').to_owned(),
        token,
    })
}
