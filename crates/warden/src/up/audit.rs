//! This node's audit log: opened under `<data dir>/audit/` before any role starts, so every
//! role can record from its first request, and closed last, after them.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::config::Config;

/// The file in the data dir that holds a single node's audit key.
pub const AUDIT_KEY_FILE: &str = "audit-key";

/// HKDF's info for the audit anchors' key on a cluster: what sets it apart from every other key
/// derived from the cluster's identity key.
const CLUSTER_AUDIT_KEY_INFO: &[u8] = b"warden audit anchor v1";

/// The key anchors are MAC'd under: on one node `<data dir>/audit-key` (0600, made once, like
/// the data key); on a cluster derived from the cluster's identity key, so any node verifies
/// any other's anchors and nothing new is stored.
/// `cluster_identity` is the cluster's identity key (hex) on a cluster, `None` on one node.
pub(crate) fn audit_key(dir: &Path, cluster_identity: Option<&str>) -> anyhow::Result<[u8; 32]> {
    if let Some(identity) = cluster_identity {
        return crate::keys::cluster_key(identity, CLUSTER_AUDIT_KEY_INFO, "the audit key");
    }
    let path = dir.join(AUDIT_KEY_FILE);
    let text = crate::files::load_or_create(&path, warden_core::id::secret_token)?;
    crate::keys::decode_key(&text).ok_or_else(|| {
        anyhow::anyhow!(
            "{} is damaged (it must be 64 hex digits); restore it from a backup of the data dir (without it, no anchor of this node's audit log can be checked)",
            path.display()
        )
    })
}

/// The log's settings from the configuration.
fn settings(cfg: &Config) -> warden_audit::Settings {
    warden_audit::Settings {
        segment_bytes: cfg.audit_segment_mb * 1024 * 1024,
        retain_bytes: cfg.audit_retain_mb * 1024 * 1024,
        retain_age: Duration::from_secs(cfg.audit_retain_days * 24 * 3600),
        required: cfg.audit == crate::config::AuditMode::Required,
        ..warden_audit::Settings::default()
    }
}

/// Opens `node`'s audit log, anchored in `store`.
pub(super) fn open(
    cfg: &Config,
    node: &str,
    store: &Arc<dyn warden_store::Store>,
    cluster: Option<&crate::cluster::Secrets>,
) -> anyhow::Result<Arc<warden_audit::Log>> {
    let key = audit_key(&cfg.data_dir, cluster.map(|s| s.identity_key.as_str()))?;
    let dir = cfg.data_dir.join("audit");
    warden_audit::Log::open(&dir, node, key, store.clone(), settings(cfg))
        .with_context(|| format!("cannot open the audit log in {}", dir.display()))
}

/// The log's metrics: whether it writes (the alarm), its head, what it lost.
pub(super) fn render(audit: &dyn warden_core::audit::Audit) -> String {
    let stats = audit.stats();
    let writing = u8::from(audit.health().is_ok());
    format!(
        "# HELP warden_audit_writing Whether this node's audit log writes (0: an alarm, /readyz says why).\n\
         # TYPE warden_audit_writing gauge\n\
         warden_audit_writing {writing}\n\
         # HELP warden_audit_head_seq The sequence number of the audit log's last record.\n\
         # TYPE warden_audit_head_seq gauge\n\
         warden_audit_head_seq {}\n\
         # HELP warden_audit_lost_total Audit records not written (a full queue, a failed write); a gap record counts them.\n\
         # TYPE warden_audit_lost_total counter\n\
         warden_audit_lost_total {}\n",
        stats.head_seq, stats.lost
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_of_a_cluster_derives_one_audit_key_apart_from_the_data_key() {
        let dir = std::path::Path::new("/nonexistent");
        let identity = "ab".repeat(32);
        let a = audit_key(dir, Some(identity.as_str())).unwrap();
        assert_eq!(a, audit_key(dir, Some(identity.as_str())).unwrap());
        assert_ne!(a, audit_key(dir, Some("12".repeat(32).as_str())).unwrap());
        let data = crate::keys::cluster_key(&identity, b"warden data key v1", "k").unwrap();
        assert_ne!(a, data);
    }
}
