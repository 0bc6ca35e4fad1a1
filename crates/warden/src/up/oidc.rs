//! The gateway's OpenID Connect providers from the config's `[[oidc]]` tables, and the key
//! that seals what their sign-ins leave in the store: on a cluster HKDF of its identity key
//! (every gateway opens what another sealed), on one node `<data dir>/oidc-key`, mode 0600.

pub(super) mod api;

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

/// What a provider is made of, from a config table or a stored record: [`build`] checks both
/// the same way.
pub(super) struct Settings {
    pub id: String,
    pub label: String,
    pub issuer: String,
    pub client_id: String,
    pub secret: Secret,
    pub scopes: Vec<String>,
    pub redirect_url: String,
    pub username_claim: String,
    pub ca_file: Option<std::path::PathBuf>,
    pub jwks_refetch: std::time::Duration,
    pub rules: Vec<warden_oidc::ClaimRule>,
    /// From the config file (else from the API).
    pub from_file: bool,
}

/// Longest provider id: user names are `<name>_<id>` of at most 63 characters.
const MAX_ID_LEN: usize = 32;

/// The one check of a provider, whether from the config file or the API: its id, then what
/// [`Provider::new`] checks (the issuer's scheme and host, the redirect URL, the trust roots).
pub(super) fn build(s: Settings) -> anyhow::Result<Arc<OidcProvider>> {
    warden_core::validate_name("oidc provider id", &s.id)
        .with_context(|| format!("identity provider id {:?}", s.id))?;
    // Provider users are named `<name>_<id>`: an id with `_` would let `bob_x` of `corp` and
    // `bob` of `x_corp` meet in one name.
    // ... and a name is at most 63 characters: a long id would leave the person's part too
    // short to tell people apart (cut to the same few characters, or to nothing).
    if s.id.len() > MAX_ID_LEN {
        anyhow::bail!(
            "identity provider id {:?} is {} characters long; use at most {MAX_ID_LEN}, which leaves room in user names (`<name>_<id>`, at most 63) for the person's name",
            s.id,
            s.id.len()
        );
    }
    if s.id.contains('_') {
        anyhow::bail!(
            "identity provider id {:?} holds '_', which separates a person's name from the provider's in user names; use letters, digits and '-'",
            s.id
        );
    }
    if let Some(f) = &s.ca_file {
        ca_file_fits(f).with_context(|| format!("identity provider {:?}", s.id))?;
    }
    let provider = Provider::new(ProviderConfig {
        id: s.id.clone(),
        issuer: s.issuer,
        client_id: s.client_id,
        client_secret: s.secret,
        scopes: s.scopes,
        redirect_url: s.redirect_url,
        ca_file: s.ca_file,
        jwks_refetch: s.jwks_refetch,
    })
    .with_context(|| format!("identity provider {:?}", s.id))?;
    Ok(Arc::new(OidcProvider {
        provider,
        label: s.label,
        rules: s.rules,
        username_claim: s.username_claim,
        from_file: s.from_file,
    }))
}

/// Largest `ca_file` read: a bundle of every public root is about 250 KiB.
const MAX_CA_FILE: u64 = 1024 * 1024;

/// `ca_file` is a regular file of at most [`MAX_CA_FILE`] bytes, checked without opening it:
/// the path may come from the API, and a FIFO would block the read, `/dev/zero` never end it.
/// One message whatever is wrong, so the API says nothing of which paths exist.
fn ca_file_fits(f: &std::path::Path) -> anyhow::Result<()> {
    match std::fs::metadata(f) {
        Ok(m) if m.is_file() && m.len() <= MAX_CA_FILE => Ok(()),
        _ => anyhow::bail!(
            "ca_file {} is not a readable regular file of at most 1 MiB; give the path of a PEM file of CA certificates",
            f.display()
        ),
    }
}

/// The sealing context of an API provider's client secret: its id, so a sealed secret copied
/// to another provider's record does not open.
pub(super) fn secret_context(id: &str) -> String {
    format!("oidc-client-secret:{id}")
}

/// Every gateway's OpenID Connect state (the config file's providers; those added through the
/// API join when [`api::follow`] runs) and the config file's providers alone.
pub(super) fn providers(
    cfg: &Config,
    cluster: Option<&crate::cluster::Secrets>,
) -> anyhow::Result<(Arc<OidcConfig>, Vec<Arc<OidcProvider>>)> {
    let sealer = sealer(cfg, cluster)?;
    let mut providers: Vec<Arc<OidcProvider>> = Vec::new();
    for t in &cfg.oidc {
        if providers.iter().any(|p| p.provider.config().id == t.id) {
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
        let p = build(Settings {
            id: t.id.clone(),
            label: t.label.clone().unwrap_or_else(|| t.id.clone()),
            issuer: t.issuer.clone(),
            client_id: t.client_id.clone(),
            secret: Secret::new(secret.trim()),
            scopes: t.scopes.clone(),
            redirect_url: t.redirect_url.clone(),
            username_claim: t.username_claim.clone(),
            ca_file: t.ca_file.clone(),
            jwks_refetch: t.jwks_refetch.map_or(warden_oidc::JWKS_REFETCH, |h| h.0),
            rules: t.rules.clone(),
            from_file: true,
        })
        .context("in an [[oidc]] table of the config file")?;
        providers.push(p);
    }
    Ok((
        Arc::new(OidcConfig::new(providers.clone(), sealer)),
        providers,
    ))
}

/// The provider of table `t`, its client secret read from its file.
fn provider_of(t: &crate::config::types::OidcTable) -> anyhow::Result<Provider> {
    let secret = std::fs::read_to_string(&t.client_secret_file).with_context(|| {
        format!(
            "cannot read [[oidc]] {:?} client_secret_file {}",
            t.id,
            t.client_secret_file.display()
        )
    })?;
    Provider::new(ProviderConfig {
        id: t.id.clone(),
        issuer: t.issuer.clone(),
        client_id: t.client_id.clone(),
        client_secret: Secret::new(secret.trim()),
        scopes: t.scopes.clone(),
        redirect_url: t.redirect_url.clone(),
        ca_file: t.ca_file.clone(),
        jwks_refetch: t.jwks_refetch.map_or(warden_oidc::JWKS_REFETCH, |h| h.0),
    })
    .with_context(|| format!("[[oidc]] {:?}", t.id))
}

/// The sealer of what sign-ins leave in the store (module doc).
fn sealer(cfg: &Config, cluster: Option<&crate::cluster::Secrets>) -> anyhow::Result<Sealer> {
    let key = match cluster {
        Some(s) => {
            crate::keys::cluster_key(&s.identity_key, CLUSTER_OIDC_KEY_INFO, "the OIDC key")?
        }
        None => node_key(&cfg.data_dir)?,
    };
    Sealer::new(&key).context("cannot make the OIDC sealing key")
}

/// The providers operators sign in through (`warden login --provider`): the `[[oidc]]` tables
/// with `operator_rules`, or `None` when none has any. The API keeps its own [`Provider`] of
/// each (discovery and keys are fetched lazily, so this costs no call).
pub(super) fn operator_providers(
    cfg: &Config,
    cluster: Option<&crate::cluster::Secrets>,
) -> anyhow::Result<Option<Arc<warden_api::OperatorIdp>>> {
    let mut providers = Vec::new();
    for t in &cfg.oidc {
        if t.operator_rules.is_empty() {
            if t.dashboard_redirect_url.is_some() {
                anyhow::bail!(
                    "[[oidc]] {:?} has a dashboard_redirect_url but no operator_rules: say which groups give which operator roles",
                    t.id
                );
            }
            continue;
        }
        warden_oidc::check_operator_rules(&t.operator_rules)
            .with_context(|| format!("[[oidc]] {:?} operator_rules", t.id))?;
        // The API's provider redirects to the dashboard's callback; the device flow uses none.
        let mut t = t.clone();
        let dashboard = t.dashboard_redirect_url.take();
        if let Some(url) = &dashboard {
            t.redirect_url.clone_from(url);
        }
        let provider = provider_of(&t)?;
        providers.push(warden_api::OperatorProvider {
            dashboard: dashboard.is_some(),
            provider,
            label: t.label.clone().unwrap_or_else(|| t.id.clone()),
            rules: t.operator_rules.clone(),
            username_claim: t.username_claim.clone(),
        });
    }
    if providers.is_empty() {
        return Ok(None);
    }
    Ok(Some(Arc::new(warden_api::OperatorIdp {
        providers,
        sealer: sealer(cfg, cluster)?,
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
