//! The session `warden login` keeps: an operator's token with the API's URL, in a file only its
//! owner reads, under the user's config directory.

use std::path::PathBuf;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// The user's warden config directory: `$XDG_CONFIG_HOME/warden` or `~/.config/warden`.
pub(crate) fn config_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("warden"))
}

/// A stored session.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Session {
    /// The API it was made by, without a trailing slash.
    pub api: String,
    /// Operator name.
    pub operator: String,
    /// The token.
    pub token: String,
    /// Expiry, milliseconds since the Unix epoch.
    pub expires_ms: u64,
}

impl Session {
    pub(crate) fn path() -> Option<PathBuf> {
        Some(config_dir()?.join("session.json"))
    }

    /// The stored session, if any.
    pub(crate) fn load() -> anyhow::Result<Option<Self>> {
        let Some(path) = Self::path() else {
            return Ok(None);
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map(Some).with_context(|| {
                format!(
                    "{} is damaged; remove it and `warden login` again",
                    path.display()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Its token, unless it has expired.
    pub(crate) fn token_if_live(self) -> anyhow::Result<String> {
        if warden_core::model::now_ms() >= self.expires_ms {
            bail!(
                "your session as operator {} at {} has expired; run `warden login` again",
                self.operator,
                self.api
            );
        }
        Ok(self.token)
    }

    /// Writes it through a temporary file (mode 0600) and a rename, in a directory only its
    /// owner enters.
    pub(crate) fn save(&self) -> anyhow::Result<PathBuf> {
        use std::os::unix::fs::DirBuilderExt;
        let path = Self::path()
            .context("cannot tell where to keep the session: set HOME or XDG_CONFIG_HOME")?;
        let dir = path.parent().context("the session file has no directory")?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        crate::write_private(&path, &serde_json::to_vec(self)?)?;
        Ok(path)
    }
}
