//! The gateway's OpenID Connect providers from the config's `[[oidc]]` tables, and the key
//! that seals what their sign-ins leave in the store: on a cluster HKDF of its identity key
//! (every gateway opens what another sealed), on one node `<data dir>/oidc-key`, mode 0600.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use warden_gateway::{OidcConfig, OidcProvider};
use warden_oidc::{Provider, ProviderConfig, Sealer, Secret};

use crate::config::Config;

/// HKDF's info for the OIDC sealing key on a cluster.
const CLUSTER_OIDC_KEY_INFO: &[u8] = b"warden oidc seal key v1";
/// The one-node sealing key's file in the data dir.
const OIDC_KEY_FILE: &str = "oidc-key";

/// The providers, or `None` when the config names none.
pub(super) fn providers(
    cfg: &Config,
    cluster: Option<&crate::cluster::Secrets>,
) -> anyhow::Result<Option<Arc<OidcConfig>>> {
    if cfg.oidc.is_empty() {
        return Ok(None);
    }
    let key = match cluster {
        Some(s) => {
            crate::keys::cluster_key(&s.identity_key, CLUSTER_OIDC_KEY_INFO, "the OIDC key")?
        }
        None => node_key(&cfg.data_dir)?,
    };
    let sealer = Sealer::new(&key).context("cannot make the OIDC sealing key")?;
    let mut providers = Vec::new();
    for t in &cfg.oidc {
        warden_core::validate_name("oidc provider id", &t.id)
            .with_context(|| format!("[[oidc]] id {:?}", t.id))?;
        // Provider users are named `<name>_<id>`: an id with `_` would let `bob_x` of `corp` and
        // `bob` of `x_corp` meet in one name.
        if t.id.contains('_') {
            anyhow::bail!(
                "[[oidc]] id {:?} holds '_', which separates a person's name from the provider's in user names; use letters, digits and '-'",
                t.id
            );
        }
        if providers
            .iter()
            .any(|p: &Arc<OidcProvider>| p.provider.config().id == t.id)
        {
            anyhow::bail!(
                "[[oidc]] id {:?} appears twice; give each provider its own id",
                t.id
            );
        }
        let secret = std::fs::read_to_string(&t.client_secret_file).with_context(|| {
            format!(
                "cannot read [[oidc]] {:?} client_secret_file {}",
                t.id,
                t.client_secret_file.display()
            )
        })?;
        let provider = Provider::new(ProviderConfig {
            id: t.id.clone(),
            issuer: t.issuer.clone(),
            client_id: t.client_id.clone(),
            client_secret: Secret::new(secret.trim()),
            scopes: t.scopes.clone(),
            redirect_url: t.redirect_url.clone(),
            ca_file: t.ca_file.clone(),
            jwks_refetch: t.jwks_refetch.map_or(warden_oidc::JWKS_REFETCH, |h| h.0),
        })
        .with_context(|| format!("[[oidc]] {:?}", t.id))?;
        providers.push(Arc::new(OidcProvider {
            provider,
            label: t.label.clone().unwrap_or_else(|| t.id.clone()),
            rules: t.rules.clone(),
            username_claim: t.username_claim.clone(),
        }));
    }
    Ok(Some(Arc::new(OidcConfig {
        providers,
        sealer,
        starts: Default::default(),
    })))
}

/// One node's sealing key: made once per data dir, mode 0600.
fn node_key(dir: &Path) -> anyhow::Result<[u8; 32]> {
    let path = dir.join(OIDC_KEY_FILE);
    let text = crate::files::load_or_create(&path, warden_core::id::secret_token)?;
    crate::keys::decode_key(text.trim()).ok_or_else(|| {
        anyhow::anyhow!(
            "{} is damaged (it must be 64 hex digits); delete it (sign-ins in flight and provider sessions end) and start again",
            path.display()
        )
    })
}
