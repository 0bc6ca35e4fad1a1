//! What every node of a cluster shares, and how a node gets it without files copied by hand.
//!
//! The first node on an empty store makes the cluster's secrets (the admin token, the identity
//! key that instance secrets derive from, and the cluster CA that signs node certificates) and a
//! join token. It stores the secrets sealed with a key derived from the join token
//! (HKDF-SHA256, then ChaCha20-Poly1305), never in clear, and keeps the join token in its data
//! dir. Every later node is started with that token (`--join-token-file`) and opens the same
//! secrets from the store: one short string is all an operator carries between machines, as
//! with `kubeadm join --token` or k3s's `K3S_TOKEN`.
//!
//! Each node writes what it opened into its own data dir (admin-token, identity-key, the CA
//! certificate), mode 0600, so the CLI and a restart work as on one machine.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use warden_store::{CasOutcome, Store};

use crate::files;

/// Store key of the sealed secrets.
pub const SECRETS_KEY: &str = "cluster/secrets";
const AAD: &[u8] = b"warden cluster secrets v1";
const TOKEN_PREFIX: &str = "wjt1-";

/// The secrets every node of the cluster holds.
#[derive(Serialize, Deserialize)]
pub struct Secrets {
    /// The admin token of every API node.
    pub admin_token: String,
    /// Hex identity key: instance secrets and request signatures derive from it.
    pub identity_key: String,
    /// PEM certificate of the cluster CA.
    pub ca_cert: String,
    /// PEM key of the cluster CA.
    pub ca_key: String,
    /// Hex key that seals the gateways' shared TLS ticket keys in the store.
    pub ticket_seal: String,
}

/// The sealed form stored at [`SECRETS_KEY`].
#[derive(Serialize, Deserialize)]
struct Sealed {
    version: u32,
    salt: String,
    nonce: String,
    sealed: String,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn key_for(token: &str, salt: &[u8]) -> anyhow::Result<LessSafeKey> {
    struct Len;
    impl hkdf::KeyType for Len {
        fn len(&self) -> usize {
            32
        }
    }
    let mut key = [0u8; 32];
    hkdf::Salt::new(hkdf::HKDF_SHA256, salt)
        .extract(token.as_bytes())
        .expand(&[AAD], Len)
        .and_then(|okm| okm.fill(&mut key))
        .map_err(|_| anyhow::anyhow!("cannot derive the sealing key"))?;
    let unbound = UnboundKey::new(&CHACHA20_POLY1305, &key)
        .map_err(|_| anyhow::anyhow!("cannot make the sealing key"))?;
    Ok(LessSafeKey::new(unbound))
}

fn random<const N: usize>() -> anyhow::Result<[u8; N]> {
    let mut b = [0u8; N];
    SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| anyhow::anyhow!("the system's random source failed"))?;
    Ok(b)
}

fn seal(secrets: &Secrets, token: &str) -> anyhow::Result<Vec<u8>> {
    let salt = random::<16>()?;
    let nonce = random::<NONCE_LEN>()?;
    let mut data = serde_json::to_vec(secrets)?;
    key_for(token, &salt)?
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(AAD),
            &mut data,
        )
        .map_err(|_| anyhow::anyhow!("cannot seal the cluster secrets"))?;
    Ok(serde_json::to_vec(&Sealed {
        version: 1,
        salt: b64().encode(salt),
        nonce: b64().encode(nonce),
        sealed: b64().encode(data),
    })?)
}

fn open(bytes: &[u8], token: &str) -> anyhow::Result<Secrets> {
    let sealed: Sealed = serde_json::from_slice(bytes)
        .with_context(|| format!("the store's {SECRETS_KEY} is damaged"))?;
    if sealed.version != 1 {
        bail!(
            "{SECRETS_KEY} has version {}; upgrade this node's warden",
            sealed.version
        );
    }
    let salt = b64().decode(&sealed.salt)?;
    let nonce: [u8; NONCE_LEN] = b64()
        .decode(&sealed.nonce)?
        .try_into()
        .map_err(|_| anyhow::anyhow!("{SECRETS_KEY} is damaged (nonce)"))?;
    let mut data = b64().decode(&sealed.sealed)?;
    let plain = key_for(token, &salt)?
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(AAD),
            &mut data,
        )
        .map_err(|_| {
            anyhow::anyhow!(
                "the join token does not open this cluster's secrets: give --join-token-file the \
                 token of this cluster (the first node keeps it in its data dir, file join-token)"
            )
        })?;
    Ok(serde_json::from_slice(plain)?)
}

fn new_secrets() -> anyhow::Result<Secrets> {
    let (ca_cert, ca_key) = warden_cluster::new_ca()?;
    Ok(Secrets {
        admin_token: warden_core::id::secret_token(),
        identity_key: warden_core::id::secret_token(),
        ca_cert,
        ca_key,
        ticket_seal: warden_core::id::secret_token(),
    })
}

/// How long a shared TLS ticket key seals new tickets (as rustls's own ticketer).
const TICKET_PERIOD: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// The TLS session-ticket keys every gateway of the cluster shares.
pub async fn shared_tickets(
    store: std::sync::Arc<dyn Store>,
    secrets: &Secrets,
) -> anyhow::Result<std::sync::Arc<dyn rustls::server::ProducesTickets>> {
    let seal: Vec<u8> = (0..secrets.ticket_seal.len() / 2)
        .filter_map(|i| u8::from_str_radix(secrets.ticket_seal.get(2 * i..2 * i + 2)?, 16).ok())
        .collect();
    if seal.len() != 32 {
        bail!("the cluster's ticket seal is damaged");
    }
    let tickets = warden_cluster::SharedTickets::start(store, &seal, TICKET_PERIOD)
        .await
        .context("cannot share TLS ticket keys through the store")?;
    Ok(tickets)
}

/// How this node came by the secrets.
pub struct Joined {
    /// The secrets.
    pub secrets: Secrets,
    /// Where the join token is kept, when this node made the cluster.
    pub made_token: Option<PathBuf>,
}

/// Opens the cluster's secrets with the join token, or, on an empty cluster, makes them, and
/// writes the admin token and identity key into `dir` for the CLI and the roles.
pub async fn join(
    store: &dyn Store,
    dir: &Path,
    token_file: Option<&Path>,
) -> anyhow::Result<Joined> {
    let own_token = dir.join("join-token");
    let token = match token_file {
        Some(f) => Some(read_token(f)?),
        None => files::read_private(&own_token)?.map(|t| t.trim().to_owned()),
    };
    let joined = match store.get(SECRETS_KEY).await? {
        Some(e) => {
            let Some(token) = token else {
                bail!(
                    "this etcd already holds a warden cluster: start this node with \
                     --join-token-file FILE, FILE holding the cluster's join token (the first \
                     node keeps it in its data dir, file join-token)"
                );
            };
            Joined {
                secrets: open(&e.value, &token)?,
                made_token: None,
            }
        }
        None => {
            if token_file.is_some() {
                bail!(
                    "--join-token-file was given but this etcd holds no warden cluster yet; \
                     check --store, or start the first node without it"
                );
            }
            let token = format!("{TOKEN_PREFIX}{}", warden_core::id::secret_token());
            let secrets = new_secrets()?;
            let sealed = seal(&secrets, &token)?;
            match store
                .compare_and_swap(SECRETS_KEY, None, Some(sealed), None)
                .await?
            {
                CasOutcome::Done(_) => {}
                CasOutcome::Conflict { .. } => bail!(
                    "another node made this cluster at the same moment: start this node again \
                     with --join-token-file holding that node's join token"
                ),
            }
            files::write_private(&own_token, token.as_bytes())?;
            Joined {
                secrets,
                made_token: Some(own_token),
            }
        }
    };
    files::write_private(
        &dir.join("admin-token"),
        joined.secrets.admin_token.as_bytes(),
    )?;
    files::write_private(
        &dir.join("identity-key"),
        joined.secrets.identity_key.as_bytes(),
    )?;
    files::write_private(
        &dir.join("cluster-ca.pem"),
        joined.secrets.ca_cert.as_bytes(),
    )?;
    Ok(joined)
}

fn read_token(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the join token file {}", path.display()))?;
    let token = text.trim();
    if !token.starts_with(TOKEN_PREFIX) {
        bail!(
            "{} does not hold a warden join token (they start with {TOKEN_PREFIX})",
            path.display()
        );
    }
    Ok(token.to_owned())
}

/// The node port's listener, bound before the agent starts so that its record can say where
/// it is.
pub struct NodePort {
    listener: tokio::net::TcpListener,
    /// The address other nodes reach it at.
    pub advertise: std::net::SocketAddr,
}

/// Binds the node port at `advertise` (port 0 picks a free one).
pub async fn bind_node_port(advertise: std::net::SocketAddr) -> anyhow::Result<NodePort> {
    let listener = tokio::net::TcpListener::bind(advertise)
        .await
        .with_context(|| format!("cannot listen on the node port {advertise}"))?;
    let advertise = listener.local_addr()?;
    Ok(NodePort {
        listener,
        advertise,
    })
}

/// What [`instances`] sets up.
pub struct Wired {
    /// Instances anywhere in the cluster.
    pub instances: std::sync::Arc<dyn warden_core::InstanceAdmin>,
    /// The node port's task, if this node serves one.
    pub served: Option<tokio::task::JoinHandle<()>>,
    /// The node port's counters.
    pub stats: std::sync::Arc<warden_cluster::NodePortStats>,
    /// This node as a client of the others' ports.
    pub client: warden_cluster::NodeClient,
    /// The live nodes.
    pub directory: warden_cluster::Directory,
    /// Which other nodes answer this one's pings.
    pub peers: std::sync::Arc<warden_core::Peers>,
}

/// What a node's port serves besides its agent's instances.
pub struct PortServes {
    /// Where its slugs are, for nodes that fetch them.
    pub slugs: Option<std::path::PathBuf>,
    /// Its releases, for nodes that build nothing.
    pub releases: Option<std::sync::Arc<dyn warden_core::Releases>>,
    /// Its audit log, read and verified by other nodes' APIs.
    pub audit: std::sync::Arc<dyn warden_core::audit::Audit>,
}

/// The cluster's `Instances` for this node: its own agent's directly, other nodes' through
/// their node ports; and this node's port serving its agent's instances, if it runs one, and
/// `serves`, until `stop`.
pub async fn instances(
    store: std::sync::Arc<dyn Store>,
    secrets: &Secrets,
    node: &str,
    agent: Option<std::sync::Arc<dyn warden_core::InstanceAdmin>>,
    port: Option<NodePort>,
    serves: PortServes,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Wired> {
    let PortServes {
        slugs,
        releases,
        audit,
    } = serves;
    let advertise = port
        .as_ref()
        .map_or_else(|| "127.0.0.1:0".to_owned(), |p| p.advertise.to_string());
    let tls = warden_cluster::NodeTls::issue(&secrets.ca_cert, &secrets.ca_key, node, &advertise)?;
    let stats = std::sync::Arc::new(warden_cluster::NodePortStats::default());
    // A node without an agent serves its port too (its audit log, pings); it holds no
    // instance, so every instance request there is answered "no agent".
    let served = match port {
        Some(p) => Some(tokio::spawn(warden_cluster::serve(
            p.listener,
            tls.clone(),
            agent
                .clone()
                .unwrap_or_else(|| std::sync::Arc::new(crate::no_agent::NoAgent)),
            store.clone(),
            stats.clone(),
            slugs,
            releases,
            audit,
            stop.clone(),
        ))),
        None => None,
    };
    let directory = warden_cluster::Directory::start(store.clone())
        .await
        .context("cannot list the cluster's nodes")?;
    let client = warden_cluster::NodeClient::new(&tls);
    let peers = warden_cluster::watch_peers(
        node.to_owned(),
        client.clone(),
        directory.clone(),
        stop.clone(),
    );
    let all = warden_cluster::ClusterInstances::new(
        node.to_owned(),
        agent,
        client.clone(),
        directory.clone(),
        peers.clone(),
        store,
    );
    Ok(Wired {
        instances: all.into_instances(),
        served,
        stats,
        client,
        directory,
        peers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_secrets_open_with_their_token_only_and_hold_nothing_in_clear() {
        let secrets = new_secrets().unwrap();
        let token = "wjt1-right";
        let sealed = seal(&secrets, token).unwrap();
        let text = String::from_utf8_lossy(&sealed);
        for secret in [&secrets.admin_token, &secrets.identity_key] {
            assert!(!text.contains(secret.as_str()));
        }
        assert!(!text.contains("PRIVATE KEY"));
        let opened = open(&sealed, token).unwrap();
        assert_eq!(opened.admin_token, secrets.admin_token);
        assert_eq!(opened.ca_key, secrets.ca_key);
        let wrong = open(&sealed, "wjt1-wrong").err().unwrap().to_string();
        assert!(wrong.contains("join token does not open"), "{wrong}");
    }
}
