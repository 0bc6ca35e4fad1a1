//! Keys warden derives or reads: a cluster's own keys (HKDF of its identity key, one per
//! use) and keys kept as hex in the data dir.

/// A key of the cluster's own for `what`: HKDF-SHA256 of the cluster's identity key with `info`
/// (one per use, so no two keys are the same). Every node derives the same key.
pub(crate) fn cluster_key(identity_hex: &str, info: &[u8], what: &str) -> anyhow::Result<[u8; 32]> {
    let identity = decode_key(identity_hex.trim()).ok_or_else(|| {
        anyhow::anyhow!(
            "the cluster's identity key is damaged (it must be 64 hex digits); this node cannot \
             derive {what}: start it again with the cluster's join token"
        )
    })?;
    struct Len;
    impl ring::hkdf::KeyType for Len {
        fn len(&self) -> usize {
            32
        }
    }
    let mut key = [0u8; 32];
    ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, info)
        .extract(&identity)
        .expand(&[info], Len)
        .and_then(|okm| okm.fill(&mut key))
        .map_err(|_| anyhow::anyhow!("cannot derive {what} from the cluster's secrets"))?;
    Ok(key)
}

/// 64 hex digits as 32 bytes.
pub(crate) fn decode_key(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, b) in key.iter_mut().enumerate() {
        *b = u8::from_str_radix(text.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(key)
}

/// HKDF's info for the gateways' CSRF key on a cluster.
const CLUSTER_CSRF_KEY_INFO: &[u8] = b"warden gateway csrf v1";

/// The file in the data dir that holds a single node's CSRF key.
pub const CSRF_KEY_FILE: &str = "csrf-key";

/// The key the gateway's sign-in and sign-out forms are protected under: on a cluster derived
/// from the cluster's identity key (hex, `cluster_identity`), so a form one gateway served is
/// taken by any other; on one node `<data dir>/csrf-key` (0600, made once).
pub(crate) fn csrf_key(
    dir: &std::path::Path,
    cluster_identity: Option<&str>,
) -> anyhow::Result<[u8; 32]> {
    if let Some(identity) = cluster_identity {
        return cluster_key(identity, CLUSTER_CSRF_KEY_INFO, "the gateway's CSRF key");
    }
    let path = dir.join(CSRF_KEY_FILE);
    let text = crate::files::load_or_create(&path, warden_core::id::secret_token)?;
    decode_key(&text).ok_or_else(|| {
        anyhow::anyhow!(
            "{} is damaged (it must be 64 hex digits); remove it and start warden again (open sign-in pages will need a reload)",
            path.display()
        )
    })
}

/// HKDF's info for the dashboard's CSRF key on a cluster.
const CLUSTER_UI_KEY_INFO: &[u8] = b"warden ui csrf v1";

/// The file in the data dir that holds a single node's dashboard CSRF key.
pub const UI_KEY_FILE: &str = "ui-csrf-key";

/// The key the dashboard's forms (`/ui/`) are signed under: like [`csrf_key`], derived on a
/// cluster (so a page one node's API served is taken by another) and a private file on one
/// node, but a key of its own, so neither role's forms are taken by the other.
pub(crate) fn ui_key(
    dir: &std::path::Path,
    cluster_identity: Option<&str>,
) -> anyhow::Result<[u8; 32]> {
    if let Some(identity) = cluster_identity {
        return cluster_key(identity, CLUSTER_UI_KEY_INFO, "the dashboard's CSRF key");
    }
    let path = dir.join(UI_KEY_FILE);
    let text = crate::files::load_or_create(&path, warden_core::id::secret_token)?;
    decode_key(&text).ok_or_else(|| {
        anyhow::anyhow!(
            "{} is damaged (it must be 64 hex digits); remove it and start warden again (open dashboard pages will need a reload)",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_csrf_key_is_a_private_file_on_one_node_and_derived_on_a_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let first = csrf_key(dir.path(), None).unwrap();
        assert_eq!(csrf_key(dir.path(), None).unwrap(), first, "made once");
        let mode = std::fs::metadata(dir.path().join(CSRF_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        let identity = "ab".repeat(32);
        let other = tempfile::tempdir().unwrap();
        let derived = csrf_key(other.path(), Some(&identity)).unwrap();
        assert_eq!(
            csrf_key(dir.path(), Some(&identity)).unwrap(),
            derived,
            "every node alike"
        );
        assert!(!other.path().join(CSRF_KEY_FILE).exists(), "nothing stored");
        let audit = cluster_key(&identity, b"warden audit anchor v1", "k").unwrap();
        assert_ne!(derived, audit, "a key of its own");
    }
}
