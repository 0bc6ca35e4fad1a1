//! Identity providers added through the API: the check the API asks for (the config file's
//! [`super::build`], then discovery), and every gateway following `oidc/providers/` so that
//! a provider added or removed on any node is on (or off) its sign-in page without a restart.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use warden_api::routes::oidc_providers::{OidcCheck, OidcProviderView, Secret as Given};
use warden_core::{keys, OidcProviderRecord};
use warden_gateway::{OidcConfig, OidcProvider};
use warden_oidc::Secret;
use warden_store::{decode, Store};

use super::{build, secret_context, Settings};

/// The API's check of a provider.
pub(crate) struct Checker {
    pub oidc: Arc<OidcConfig>,
    /// The config file's providers, listed as `source: config`.
    pub config: Vec<Arc<OidcProvider>>,
}

/// The provider `r` describes, its secret opened with `oidc`'s sealer.
fn from_record(oidc: &OidcConfig, r: &OidcProviderRecord) -> anyhow::Result<Arc<OidcProvider>> {
    let secret = oidc
        .sealer
        .open(&secret_context(&r.id), &r.client_secret_sealed)
        .map_err(|e| anyhow::anyhow!("its client secret does not open ({e}); set it again with `warden oidc change {} --secret-file`", r.id))?;
    build(Settings {
        id: r.id.clone(),
        label: r.label.clone(),
        issuer: r.issuer.clone(),
        client_id: r.client_id.clone(),
        secret,
        scopes: r.scopes.clone(),
        redirect_url: r.redirect_url.clone(),
        username_claim: r.username_claim.clone(),
        ca_file: r.ca_file.clone(),
        jwks_refetch: warden_oidc::JWKS_REFETCH,
        rules: r.rules.clone(),
        from_file: false,
    })
}

impl OidcCheck for Checker {
    fn config_providers(&self) -> Vec<OidcProviderView> {
        self.config
            .iter()
            .map(|p| {
                let c = p.provider.config();
                OidcProviderView {
                    id: c.id.clone(),
                    label: p.label.clone(),
                    issuer: c.issuer.clone(),
                    client_id: c.client_id.clone(),
                    secret: "set".into(),
                    scopes: c.scopes.clone(),
                    redirect_url: c.redirect_url.clone(),
                    username_claim: p.username_claim.clone(),
                    ca_file: c.ca_file.clone(),
                    rules: p.rules.clone(),
                    source: "config".into(),
                }
            })
            .collect()
    }

    fn check(
        &self,
        mut record: OidcProviderRecord,
        secret: Given,
    ) -> Pin<Box<dyn Future<Output = Result<OidcProviderRecord, String>> + Send + '_>> {
        Box::pin(async move {
            record.client_secret_sealed = match secret {
                Given::Clear(s) => self
                    .oidc
                    .sealer
                    .seal(&secret_context(&record.id), &Secret::new(s.trim())),
                Given::Sealed(s) => s,
            };
            let p = from_record(&self.oidc, &record).map_err(|e| format!("{e:#}"))?;
            // Discovery (and the keys' address with it) before the provider is accepted: a
            // typo in the issuer is said now, not at someone's first sign-in.
            // The cause goes to the log, not to the caller: whether a port refused, spoke no
            // TLS or answered an error would let an owner map what this node reaches.
            p.provider.begin().await.map_err(|e| {
                tracing::warn!(provider = %record.id, issuer = %record.issuer, error = %e, "the discovery of a provider given through the API failed");
                format!(
                    "the discovery of issuer {} failed (no answer, or no valid discovery document over trusted TLS); check the issuer URL and that warden can reach it (warden's log says more)",
                    record.issuer
                )
            })?;
            Ok(record)
        })
    }
}

/// How long starting waits for the first listing of the stored providers.
const FIRST_LISTING: std::time::Duration = std::time::Duration::from_secs(30);

/// Keeps `oidc`'s providers = the config file's (`config`) ∪ those stored under
/// `oidc/providers/`: the first listing is applied before this returns (a gateway that served
/// before it would refuse the stored providers' sign-ins and end their sessions as if the
/// providers were removed), then the returned task follows every change until `stop`
/// (providers whose record did not change are kept as they are, their keys and discovery
/// with them).
pub(crate) async fn follow(
    store: Arc<dyn Store>,
    oidc: Arc<OidcConfig>,
    config: Vec<Arc<OidcProvider>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<impl Future<Output = ()>> {
    let mut follower = warden_store::Follower::new(store.clone(), keys::OIDC_PROVIDERS);
    let mut providers = Providers {
        oidc,
        config,
        built: HashMap::new(),
    };
    match tokio::time::timeout(FIRST_LISTING, follower.next()).await {
        Ok(Some(warden_store::follow::Update::Listed(l))) => providers.apply(&l),
        Ok(_) => {
            if let Some(l) = relist(&*store, &mut stop).await {
                providers.apply(&l)
            }
        }
        Err(_) => anyhow::bail!(
            "the identity providers stored through the API could not be read in {}s; check that the store answers and start again",
            FIRST_LISTING.as_secs()
        ),
    }
    Ok(async move {
        loop {
            let update = tokio::select! {
                u = follower.next() => u,
                _ = stop.changed() => return,
            };
            if update.is_none() {
                return;
            }
            // The listing is small (a few providers): read it whole rather than apply events.
            let Some(listing) = relist(&*store, &mut stop).await else {
                return;
            };
            providers.apply(&listing);
        }
    })
}

/// The whole listing of `oidc/providers/`, read again after a pause while the store does not
/// answer (a missed removal must not leave a provider in place); `None` once `stop` changes.
async fn relist(
    store: &dyn Store,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> Option<warden_store::Listing> {
    loop {
        match store.list(keys::OIDC_PROVIDERS).await {
            Ok(l) => return Some(l),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the stored identity providers; trying again");
                tokio::select! {
                    _ = tokio::time::sleep(warden_store::follow::MAX_BACKOFF) => {}
                    _ = stop.changed() => return None,
                }
            }
        }
    }
}

/// The providers a gateway has: the config file's and those built from stored records.
struct Providers {
    oidc: Arc<OidcConfig>,
    config: Vec<Arc<OidcProvider>>,
    /// Each stored provider by id, with the record it was built from.
    built: HashMap<String, (Vec<u8>, Arc<OidcProvider>)>,
}

impl Providers {
    /// Rebuilds the set from `listing` and hands it to the gateway.
    fn apply(&mut self, listing: &warden_store::Listing) {
        let config = &self.config;
        let mut next = HashMap::new();
        for e in &listing.entries {
            let id = e.key.rsplit('/').next().unwrap_or_default().to_owned();
            if config.iter().any(|p| p.provider.config().id == id) {
                // The config file's wins; the API refuses to add such a provider anyway.
                continue;
            }
            if let Some((bytes, p)) = self.built.remove(&id).filter(|(b, _)| *b == e.value) {
                next.insert(id, (bytes, p));
                continue;
            }
            let made = decode::<OidcProviderRecord>(&e.key, &e.value)
                .map_err(anyhow::Error::from)
                .and_then(|r| from_record(&self.oidc, &r));
            match made {
                Ok(p) => {
                    tracing::info!(provider = %id, "identity provider from the store");
                    next.insert(id, (e.value.clone(), p));
                }
                Err(err) => {
                    tracing::warn!(provider = %id, error = %format!("{err:#}"), "cannot use a stored identity provider")
                }
            }
        }
        self.built = next;
        let mut stored: Vec<_> = self
            .built
            .iter()
            .map(|(id, (_, p))| (id.clone(), p.clone()))
            .collect();
        stored.sort_by(|a, b| a.0.cmp(&b.0));
        let mut all = config.clone();
        all.extend(stored.into_iter().map(|(_, p)| p));
        self.oidc.set_providers(all);
    }
}
