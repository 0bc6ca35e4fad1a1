//! TLS session-ticket keys shared by every gateway of the cluster, so that a client resumes its
//! session at any of them.
//!
//! The keys live in the store at [`KEY`], sealed (ChaCha20-Poly1305) with a key every node
//! holds from the cluster's secrets, never in clear. Any gateway whose newest key is older than
//! the rotation period makes a new one and writes [new, newest] with compare-and-swap, so one
//! rotation wins however many gateways try; every gateway reads the record again every few
//! seconds. Tickets name the key that sealed them; a ticket of a key no longer held is simply
//! not resumed (a full handshake follows), never an error.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use warden_core::model::now_ms;
use warden_store::{CasOutcome, Store, StoreError};

/// Store key of the sealed ticket keys.
pub const KEY: &str = "cluster/tls-tickets";
/// How often the record is read again.
const REFRESH: Duration = Duration::from_secs(5);
const RECORD_AAD: &[u8] = b"warden tls ticket keys v1";

#[derive(Serialize, Deserialize, Clone)]
struct StoredKey {
    id: u32,
    created_ms: u64,
    key: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct Sealed {
    nonce: Vec<u8>,
    sealed: Vec<u8>,
}

/// The keys in use: the newest seals, every one held opens.
struct Keys {
    held: Vec<(u32, LessSafeKey)>,
    newest_created_ms: u64,
}

/// A `ProducesTickets` whose keys every gateway of the cluster shares.
pub struct SharedTickets {
    keys: RwLock<Keys>,
    period: Duration,
}

impl std::fmt::Debug for SharedTickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedTickets")
            .field("period", &self.period)
            .finish_non_exhaustive()
    }
}

/// Why the shared keys could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TicketError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The record does not open with this cluster's key.
    #[error("the store's {KEY} does not open with this cluster's secrets (damaged, or written by another cluster); delete it and every gateway makes new keys")]
    Sealed,
    /// The system's random source failed.
    #[error("the system's random source failed")]
    Random,
}

fn aead(key: &[u8]) -> Option<LessSafeKey> {
    Some(LessSafeKey::new(
        UnboundKey::new(&CHACHA20_POLY1305, key).ok()?,
    ))
}

fn random(n: usize) -> Result<Vec<u8>, TicketError> {
    let mut b = vec![0u8; n];
    SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| TicketError::Random)?;
    Ok(b)
}

fn seal(seal_key: &LessSafeKey, keys: &[StoredKey]) -> Result<Vec<u8>, TicketError> {
    let nonce = random(NONCE_LEN)?;
    let mut data = serde_json::to_vec(keys).map_err(|_| TicketError::Sealed)?;
    let n = Nonce::try_assume_unique_for_key(&nonce).map_err(|_| TicketError::Random)?;
    seal_key
        .seal_in_place_append_tag(n, Aad::from(RECORD_AAD), &mut data)
        .map_err(|_| TicketError::Sealed)?;
    serde_json::to_vec(&Sealed {
        nonce,
        sealed: data,
    })
    .map_err(|_| TicketError::Sealed)
}

fn open(seal_key: &LessSafeKey, bytes: &[u8]) -> Result<Vec<StoredKey>, TicketError> {
    let mut s: Sealed = serde_json::from_slice(bytes).map_err(|_| TicketError::Sealed)?;
    let n = Nonce::try_assume_unique_for_key(&s.nonce).map_err(|_| TicketError::Sealed)?;
    let plain = seal_key
        .open_in_place(n, Aad::from(RECORD_AAD), &mut s.sealed)
        .map_err(|_| TicketError::Sealed)?;
    serde_json::from_slice(plain).map_err(|_| TicketError::Sealed)
}

impl SharedTickets {
    /// Reads (or makes) the cluster's keys, then keeps them current until the last handle is
    /// dropped. `seal` is the 32-byte key the record is sealed with; `period` how long a key
    /// seals new tickets (a ticket lives as long).
    pub async fn start(
        store: Arc<dyn Store>,
        seal: &[u8],
        period: Duration,
    ) -> Result<Arc<Self>, TicketError> {
        let seal = aead(seal).ok_or(TicketError::Sealed)?;
        let this = Arc::new(Self {
            keys: RwLock::new(Keys {
                held: Vec::new(),
                newest_created_ms: 0,
            }),
            period,
        });
        this.refresh(&*store, &seal).await?;
        let weak = Arc::downgrade(&this);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REFRESH).await;
                let Some(this) = weak.upgrade() else { return };
                if let Err(e) = this.refresh(&*store, &seal).await {
                    tracing::warn!(error = %e, "refreshing the shared TLS ticket keys failed");
                }
            }
        });
        Ok(this)
    }

    /// Reads the record, rotates it when its newest key is due, and takes its keys.
    async fn refresh(&self, store: &dyn Store, seal_key: &LessSafeKey) -> Result<(), TicketError> {
        loop {
            let current = store.get(KEY).await?;
            let (mut keys, expected) = match &current {
                Some(e) => (open(seal_key, &e.value)?, Some(e.mod_revision)),
                None => (Vec::new(), None),
            };
            let due = keys.first().is_none_or(|k| {
                now_ms().saturating_sub(k.created_ms) >= self.period.as_millis() as u64
            });
            if due {
                let id = keys.first().map_or(1, |k| k.id.wrapping_add(1));
                keys.truncate(1);
                keys.insert(
                    0,
                    StoredKey {
                        id,
                        created_ms: now_ms(),
                        key: random(32)?,
                    },
                );
                let sealed = seal(seal_key, &keys)?;
                if let CasOutcome::Conflict { .. } = store
                    .compare_and_swap(KEY, expected, Some(sealed), None)
                    .await?
                {
                    continue; // another gateway rotated first: take its keys
                }
            }
            let held = keys
                .iter()
                .filter_map(|k| Some((k.id, aead(&k.key)?)))
                .collect();
            if let Ok(mut k) = self.keys.write() {
                *k = Keys {
                    held,
                    newest_created_ms: keys.first().map_or(0, |k| k.created_ms),
                };
            }
            return Ok(());
        }
    }

    /// When the newest key was made (ms since the epoch), for tests and status.
    pub fn newest_created_ms(&self) -> u64 {
        self.keys.read().map_or(0, |k| k.newest_created_ms)
    }
}

impl rustls::server::ProducesTickets for SharedTickets {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        u32::try_from(self.period.as_secs()).unwrap_or(u32::MAX)
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let keys = self.keys.read().ok()?;
        let (id, key) = keys.held.first()?;
        let nonce = random(NONCE_LEN).ok()?;
        let mut out = Vec::with_capacity(4 + NONCE_LEN + plain.len() + 16);
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&nonce);
        let mut data = plain.to_vec();
        key.seal_in_place_append_tag(
            Nonce::try_assume_unique_for_key(&nonce).ok()?,
            Aad::from(&id.to_be_bytes()),
            &mut data,
        )
        .ok()?;
        out.extend_from_slice(&data);
        Some(out)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        if cipher.len() < 4 + NONCE_LEN {
            return None;
        }
        let (id, rest) = cipher.split_at(4);
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let id = u32::from_be_bytes(id.try_into().ok()?);
        let keys = self.keys.read().ok()?;
        let (_, key) = keys.held.iter().find(|(k, _)| *k == id)?;
        let mut data = sealed.to_vec();
        let plain = key
            .open_in_place(
                Nonce::try_assume_unique_for_key(nonce).ok()?,
                Aad::from(&id.to_be_bytes()),
                &mut data,
            )
            .ok()?;
        Some(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::server::ProducesTickets;

    fn store() -> Arc<dyn Store> {
        let dir = tempfile::tempdir().unwrap().keep();
        Arc::new(warden_store::EmbeddedStore::open(&dir.join("store.redb")).unwrap())
    }

    #[tokio::test]
    async fn gateways_open_each_others_tickets_across_a_rotation_and_the_store_holds_no_key() {
        let store = store();
        let seal = [7u8; 32];
        let a = SharedTickets::start(store.clone(), &seal, Duration::from_secs(3600))
            .await
            .unwrap();
        let b = SharedTickets::start(store.clone(), &seal, Duration::from_secs(3600))
            .await
            .unwrap();
        let ticket = a.encrypt(b"session state").unwrap();
        assert_eq!(b.decrypt(&ticket).unwrap(), b"session state");
        let mut tampered = ticket.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert_eq!(b.decrypt(&tampered), None);

        // A rotation (period 0: due at once) keeps the previous key for tickets already out.
        let c = SharedTickets::start(store.clone(), &seal, Duration::ZERO)
            .await
            .unwrap();
        let newer = c.encrypt(b"later").unwrap();
        assert_ne!(newer[..4], ticket[..4], "a new key seals new tickets");
        assert_eq!(c.decrypt(&ticket).unwrap(), b"session state");
        a.refresh(&*store, &aead(&seal).unwrap()).await.unwrap();
        assert_eq!(a.decrypt(&newer).unwrap(), b"later");

        let raw = store.get(KEY).await.unwrap().unwrap().value;
        assert!(
            serde_json::from_slice::<Vec<StoredKey>>(&raw).is_err(),
            "sealed, not plain"
        );

        // Another cluster's seal does not open the record.
        let wrong =
            SharedTickets::start(store.clone(), &[8u8; 32], Duration::from_secs(3600)).await;
        assert!(matches!(wrong, Err(TicketError::Sealed)));
    }
}
