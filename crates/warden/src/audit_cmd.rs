//! `warden audit verify --stopped`: a stopped single-node warden's audit log checked from its
//! data dir, reading the log files and the embedded store directly (no API to ask).

use std::path::Path;

use anyhow::{bail, Context};

/// Verifies the audit log in `dir` against the anchor in its embedded store.
pub async fn verify_stopped(dir: &Path, json: bool) -> anyhow::Result<()> {
    if !dir.join("store.redb").exists() {
        bail!(
            "{} holds no embedded store: --stopped reads a stopped single-node warden's data dir \
             (give it with --data-dir); on a cluster, ask a running node: `warden audit verify`",
            dir.display()
        );
    }
    let key_file = dir.join(crate::up::audit::AUDIT_KEY_FILE);
    let text = crate::files::read_private(&key_file)?.with_context(|| {
        format!(
            "{} is missing: without it no anchor can be checked (restore it from a backup of the data dir)",
            key_file.display()
        )
    })?;
    let key = crate::keys::decode_key(text.trim()).with_context(|| {
        format!(
            "{} is damaged (it must be 64 hex digits)",
            key_file.display()
        )
    })?;
    let log = dir.join("audit");
    let node = match crate::files::read_private(&dir.join("node-id"))? {
        Some(id) if !id.trim().is_empty() => id.trim().to_owned(),
        _ => warden_audit::node_of(&log)?
            .with_context(|| format!("{} holds no audit log", log.display()))?,
    };
    let store = warden_store::open(&warden_store::Backend::Embedded, dir)
        .await
        .with_context(|| {
            format!(
                "cannot open the store in {} (is warden still running there? stop it, or ask it: `warden audit verify` without --stopped)",
                dir.display()
            )
        })?;
    let v = warden_audit::verify_dir(&log, &node, &key, &*store).await?;
    warden_cli::audit::report(&v, json)
}
