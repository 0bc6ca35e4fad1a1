//! Anchors: the head of a node's chain written to the store (`audit/anchors/<node>`) every few
//! seconds when it moved, and once more at stop, with an HMAC under the audit key. A log
//! rewritten, replaced or cut on the node's disk no longer holds the anchored record, and an
//! anchor forged in the store fails its MAC.

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use tokio::sync::watch;
use warden_core::keys;
use warden_store::Store;

use crate::chain::hex;
use crate::Shared;

/// The anchor of a node's log, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anchor {
    /// The anchored record's sequence number.
    pub seq: u64,
    /// Its hash.
    pub hash: String,
    /// When it was anchored (ms since the epoch).
    pub at_ms: u64,
    /// HMAC-SHA256 (hex) under the audit key of `node|seq|hash`.
    pub mac: String,
}

fn mac(key: &[u8; 32], node: &str, seq: u64, hash: &str) -> String {
    // HMAC takes a key of any length: this cannot fail.
    let Ok(mut m) = Hmac::<Sha256>::new_from_slice(key) else {
        return String::new();
    };
    m.update(format!("{node}|{seq}|{hash}").as_bytes());
    hex(&m.finalize().into_bytes())
}

/// The key change bodies are digested under: HMAC of a label of its own under the audit key,
/// so no body digest is ever an anchor's MAC.
pub(crate) fn body_key(key: &[u8; 32]) -> [u8; 32] {
    let Ok(mut m) = Hmac::<Sha256>::new_from_slice(key) else {
        return [0; 32];
    };
    m.update(b"warden audit body digest v1");
    m.finalize().into_bytes().into()
}

/// HMAC-SHA256 (hex) of `body` under `key` (see [`body_key`]).
pub(crate) fn body_digest(key: &[u8; 32], body: &[u8]) -> String {
    let Ok(mut m) = Hmac::<Sha256>::new_from_slice(key) else {
        return String::new();
    };
    m.update(body);
    hex(&m.finalize().into_bytes())
}

/// The anchor of `node`'s record `seq` with `hash`.
pub(crate) fn make(key: &[u8; 32], node: &str, seq: u64, hash: &str) -> Anchor {
    Anchor {
        seq,
        hash: hash.to_owned(),
        at_ms: warden_core::model::now_ms(),
        mac: mac(key, node, seq, hash),
    }
}

/// Whether `a`'s MAC is `node`'s under `key`.
pub(crate) fn holds(key: &[u8; 32], node: &str, a: &Anchor) -> bool {
    bool::from(
        mac(key, node, a.seq, &a.hash)
            .as_bytes()
            .ct_eq(a.mac.as_bytes()),
    )
}

/// Reads `node`'s anchor from the store.
pub(crate) async fn read(store: &dyn Store, node: &str) -> Result<Option<Anchor>, String> {
    warden_store::get_json::<Anchor>(store, &keys::audit_anchor(node))
        .await
        .map(|a| a.map(|(a, _)| a))
        .map_err(|e| e.to_string())
}

/// Writes the head as `node`'s anchor if it moved since `last`; the head written.
pub(crate) async fn publish(
    store: &dyn Store,
    shared: &Shared,
    key: &[u8; 32],
    node: &str,
    last: u64,
) -> u64 {
    let (seq, hash) = match shared.head.lock() {
        Ok(h) => h.clone(),
        Err(_) => return last,
    };
    if seq == last || seq == 0 {
        return last;
    }
    let anchor = make(key, node, seq, &hash);
    match warden_store::put_json(store, &keys::audit_anchor(node), &anchor, None).await {
        Ok(_) => {
            shared
                .anchored
                .store(seq, std::sync::atomic::Ordering::Release);
            seq
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot anchor the audit log in the store; trying again");
            last
        }
    }
}

/// Anchors the head every `every` while it moves, until `stop` turns true.
pub(crate) async fn run(
    store: Arc<dyn Store>,
    shared: Arc<Shared>,
    key: [u8; 32],
    node: String,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut last = 0;
    loop {
        last = publish(&*store, &shared, &key, &node, last).await;
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
