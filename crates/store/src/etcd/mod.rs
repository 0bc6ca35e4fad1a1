//! The etcd backend: the [`Store`] contract on etcd's own primitives, for a cluster of nodes.
//!
//! warden implements no consensus: etcd's revisions are the store's revisions, a transaction
//! comparing a key's mod (or create) revision is compare-and-swap, etcd leases are leases, and a
//! watch from a revision is an etcd watch. What etcd does not do, this module adds on the
//! client side: whole-token prefixes (a range `[p, p + "0")`, filtered, since `/` is the byte
//! before `0`), content hashes (computed from the value), and failover: the client balances over
//! every endpoint, an operation that meets an unreachable or leaderless member is tried again
//! on another for a bounded time, and a watch whose member dies resumes from the next revision
//! elsewhere without the watcher noticing.

mod connect;
mod watch;

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
};

pub use connect::{EtcdOptions, EtcdTls};

use crate::{
    content_hash, CasOutcome, Entry, Hash, LeaseId, Listing, Revision, Store, StoreError, Watch,
};

/// How long an operation keeps trying other members before it fails: longer than an etcd
/// leader election (about a second by default), so a killed member costs a wait, not an error.
const FAILOVER_BUDGET: Duration = Duration::from_secs(10);

/// How often a node compacts etcd's history.
const COMPACT_EVERY: Duration = Duration::from_secs(60);
/// Revisions of history kept: at one write a second per node, over an hour for a few nodes.
const KEEP_REVISIONS: u64 = 10_000;

/// Largest listing accepted from etcd.
const MAX_LISTING: usize = 1 << 30;

/// The store on an etcd cluster.
pub struct EtcdStore {
    client: Client,
    endpoints: String,
    /// Why the last operation failed, until one succeeds again (for `ready`).
    unready: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

impl EtcdStore {
    /// Connects to the cluster `options` names and checks that it answers.
    pub async fn connect(options: &EtcdOptions) -> Result<Self, StoreError> {
        let client = connect::client(options).await?;
        let store = Self {
            client,
            endpoints: options.endpoints.join(","),
            unready: std::sync::Arc::default(),
        };
        // A first read, so that a wrong address or credential fails at start with a clear
        // message instead of at the first request.
        let first = store.get("cluster").await;
        if let Err(e) = first {
            return Err(StoreError::Open {
                path: format!("etcd://{}", store.endpoints),
                reason: format!(
                    "{e}; check the addresses in --store, and that --etcd-ca, --etcd-cert, \
                     --etcd-key, --etcd-user and --etcd-password-file match how etcd serves \
                     its clients"
                ),
            });
        }
        store.spawn_compactor();
        Ok(store)
    }

    /// Keeps etcd's history bounded: every node writes its record each second, and etcd keeps
    /// every revision until it is compacted, so without this its database would grow until it
    /// hits its space quota and refuses writes. Every node does it (compacting twice is
    /// harmless); a watcher further behind than [`KEEP_REVISIONS`] lists again.
    fn spawn_compactor(&self) {
        let store = Self {
            client: self.client.clone(),
            endpoints: self.endpoints.clone(),
            unready: self.unready.clone(),
        };
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(COMPACT_EVERY).await;
                if let Err(e) = store.compact_history(KEEP_REVISIONS).await {
                    tracing::debug!(error = %e, "compacting etcd's history failed");
                }
            }
        });
    }

    /// Compacts etcd's history to the newest `keep` revisions.
    pub async fn compact_history(&self, keep: u64) -> Result<(), StoreError> {
        let now = self
            .retry("read the revision", |mut c| async move {
                c.get("cluster", Some(GetOptions::new().with_count_only()))
                    .await
            })
            .await?;
        let target = header_revision(now.header()).saturating_sub(keep);
        if target == 0 {
            return Ok(());
        }
        let target = i64::try_from(target).unwrap_or(i64::MAX);
        match self
            .retry(
                "compact",
                |mut c| async move { c.compact(target, None).await },
            )
            .await
        {
            // Another node compacted as far already.
            Err(StoreError::Engine { reason, .. }) if reason.contains("compacted") => Ok(()),
            other => other.map(drop),
        }
    }

    /// Runs `op` against the cluster, trying again while members are unreachable or between
    /// leaders, for at most [`FAILOVER_BUDGET`].
    async fn retry<T, F, Fut>(&self, what: &'static str, mut op: F) -> Result<T, StoreError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + FAILOVER_BUDGET;
        let mut pause = Duration::from_millis(20);
        loop {
            match op(self.client.clone()).await {
                Ok(v) => {
                    if let Ok(mut u) = self.unready.lock() {
                        *u = None;
                    }
                    return Ok(v);
                }
                Err(e) if transient(&e) && tokio::time::Instant::now() + pause < deadline => {
                    tracing::debug!(op = what, error = %e, "etcd unavailable; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(e) => {
                    // Only an unreachable cluster makes the store unready; a refusal (a lease
                    // gone, a bad request) is the caller's answer.
                    let unreachable = transient(&e);
                    let e = self.error(what, e);
                    if unreachable {
                        if let Ok(mut u) = self.unready.lock() {
                            *u = Some(e.to_string());
                        }
                    }
                    return Err(e);
                }
            }
        }
    }

    fn error(&self, op: &'static str, e: etcd_client::Error) -> StoreError {
        if transient(&e) {
            return StoreError::Engine {
                op,
                reason: format!(
                    "no etcd member of {} answered within {}s ({e}); check that a majority of \
                     the members run and are reachable",
                    self.endpoints,
                    FAILOVER_BUDGET.as_secs()
                ),
            };
        }
        StoreError::Engine {
            op,
            reason: e.to_string(),
        }
    }
}

/// Whether another try may succeed: the member was unreachable, or the cluster was between
/// leaders.
pub(crate) fn transient(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(s) => {
            matches!(
                s.code(),
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Aborted
                    | tonic::Code::Cancelled
            ) || [
                "leader",
                "timed out",
                // The connection to the member broke under the request (the member died):
                // tonic reports it as an unknown status with a transport error.
                "transport error",
                "h2 protocol error",
                "connection reset",
                "broken pipe",
            ]
            .iter()
            .any(|m| s.message().to_ascii_lowercase().contains(m))
        }
        _ => false,
    }
}

/// The key range `[start, end)` that holds every key under `prefix` by whole tokens (and some
/// that are not, such as `prefix-x`, which callers filter out with `under_prefix`).
pub(crate) fn token_range(prefix: &str) -> (Vec<u8>, Vec<u8>) {
    let prefix = prefix.trim_end_matches('/');
    if prefix.is_empty() {
        return (vec![0], vec![0]);
    }
    (
        prefix.as_bytes().to_vec(),
        format!("{prefix}0").into_bytes(),
    )
}

pub(crate) fn rev(r: i64) -> Revision {
    Revision::try_from(r).unwrap_or(0)
}

fn entry(kv: &KeyValue) -> Result<Entry, StoreError> {
    let key = std::str::from_utf8(kv.key()).map_err(|_| StoreError::Corrupt {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        reason: "the key is not UTF-8; it was not written by warden".into(),
    })?;
    Ok(Entry {
        key: key.to_owned(),
        value: kv.value().to_vec(),
        hash: content_hash(kv.value()),
        create_revision: rev(kv.create_revision()),
        mod_revision: rev(kv.mod_revision()),
        lease: (kv.lease() != 0).then(|| kv.lease() as LeaseId),
    })
}

/// The entries of `resp` whose key `keep` accepts, and those that did not decode.
fn listing(resp: &etcd_client::GetResponse, keep: impl Fn(&str) -> bool) -> Listing {
    let mut listing = Listing {
        entries: Vec::with_capacity(resp.kvs().len()),
        revision: header_revision(resp.header()),
        damaged: Vec::new(),
    };
    for kv in resp.kvs() {
        match entry(kv) {
            Ok(e) if keep(&e.key) => listing.entries.push(e),
            Ok(_) => {}
            Err(e) => listing.damaged.push((
                String::from_utf8_lossy(kv.key()).into_owned(),
                e.to_string(),
            )),
        }
    }
    listing
}

fn header_revision(h: Option<&etcd_client::ResponseHeader>) -> Revision {
    h.map(|h| rev(h.revision())).unwrap_or(0)
}

fn lease_id(lease: LeaseId) -> i64 {
    i64::try_from(lease).unwrap_or(i64::MAX)
}

#[async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let resp = self
            .retry("get", |mut c| async move { c.get(key, None).await })
            .await?;
        resp.kvs().first().map(entry).transpose()
    }

    async fn get_hash(&self, key: &str) -> Result<Option<(Hash, Revision)>, StoreError> {
        Ok(self.get(key).await?.map(|e| (e.hash, e.mod_revision)))
    }

    async fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        let (start, end) = token_range(prefix);
        let resp = self
            .retry("list", |c| {
                let (start, end) = (start.clone(), end.clone());
                // A listing of every user or session can outgrow gRPC's default 4 MiB answer.
                let mut kv = c.kv_client().max_decoding_message_size(MAX_LISTING);
                async move { kv.get(start, Some(GetOptions::new().with_range(end))).await }
            })
            .await?;
        Ok(listing(&resp, |key| {
            warden_core::keys::under_prefix(prefix, key)
        }))
    }

    async fn list_text_prefix(&self, start: &str) -> Result<Listing, StoreError> {
        let resp = self
            .retry("list", |c| {
                let mut kv = c.kv_client().max_decoding_message_size(MAX_LISTING);
                async move { kv.get(start, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        Ok(listing(&resp, |_| true))
    }

    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError> {
        let options = lease.map(|l| PutOptions::new().with_lease(lease_id(l)));
        let resp = self
            .retry("put", |mut c| {
                let (value, options) = (value.clone(), options.clone());
                async move { c.put(key, value, options).await }
            })
            .await
            .map_err(|e| with_lease(e, lease))?;
        Ok(header_revision(resp.header()))
    }

    async fn delete(&self, key: &str) -> Result<Option<Revision>, StoreError> {
        let resp = self
            .retry("delete", |mut c| async move { c.delete(key, None).await })
            .await?;
        Ok((resp.deleted() > 0).then(|| header_revision(resp.header())))
    }

    async fn compare_and_swap(
        &self,
        key: &str,
        expected: Option<Revision>,
        value: Option<Vec<u8>>,
        lease: Option<LeaseId>,
    ) -> Result<CasOutcome, StoreError> {
        let compare = match expected {
            None => Compare::create_revision(key, CompareOp::Equal, 0),
            Some(r) => {
                Compare::mod_revision(key, CompareOp::Equal, i64::try_from(r).unwrap_or(i64::MAX))
            }
        };
        let write = match &value {
            Some(v) => TxnOp::put(
                key,
                v.clone(),
                lease.map(|l| PutOptions::new().with_lease(lease_id(l))),
            ),
            None => TxnOp::delete(key, None),
        };
        let txn = Txn::new()
            .when([compare])
            .and_then([write])
            .or_else([TxnOp::get(key, None)]);
        let mut tries = 0u32;
        let resp = self
            .retry("compare-and-swap", |mut c| {
                tries += 1;
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
            .map_err(|e| with_lease(e, lease))?;
        if resp.succeeded() {
            return Ok(CasOutcome::Done(header_revision(resp.header())));
        }
        let current = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| rev(kv.mod_revision())),
            _ => None,
        });
        // A try whose answer was lost may have written: if the key now holds exactly what this
        // swap wrote (or is gone, for a delete), the conflict is our own earlier success.
        if tries > 1 {
            let now = self.get(key).await?;
            match (&value, now) {
                (Some(v), Some(e)) if &e.value == v => return Ok(CasOutcome::Done(e.mod_revision)),
                (None, None) => return Ok(CasOutcome::Done(header_revision(resp.header()))),
                _ => {}
            }
        }
        Ok(CasOutcome::Conflict { current })
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<Watch, StoreError> {
        watch::start(self, prefix, from).await
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        // etcd counts whole seconds (and raises a TTL below its minimum, about 2 s by default).
        let secs = i64::try_from(ttl.as_millis().div_ceil(1000).max(1)).unwrap_or(i64::MAX);
        let resp = self
            .retry("grant lease", |mut c| async move {
                c.lease_grant(secs, None).await
            })
            .await?;
        Ok(resp.id() as LeaseId)
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<(), StoreError> {
        let ttl = self
            .retry("keep lease alive", |mut c| async move {
                let (mut keeper, mut answers) = c.lease_keep_alive(lease_id(lease)).await?;
                keeper.keep_alive().await?;
                match answers.message().await? {
                    Some(a) => Ok(a.ttl()),
                    None => Err(etcd_client::Error::LeaseKeepAliveError(
                        "the keep-alive stream ended without an answer".into(),
                    )),
                }
            })
            .await
            .map_err(|e| with_lease(e, Some(lease)))?;
        if ttl <= 0 {
            return Err(StoreError::LeaseNotFound(lease));
        }
        Ok(())
    }

    fn ready(&self) -> Result<(), StoreError> {
        match self.unready.lock().ok().and_then(|u| u.clone()) {
            Some(reason) => Err(StoreError::Engine {
                op: "reach etcd",
                reason,
            }),
            None => Ok(()),
        }
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.retry("revoke lease", |mut c| async move {
            c.lease_revoke(lease_id(lease)).await
        })
        .await
        .map_err(|e| with_lease(e, Some(lease)))?;
        Ok(())
    }
}

/// Turns etcd's "lease not found" into the contract's error.
fn with_lease(e: StoreError, lease: Option<LeaseId>) -> StoreError {
    match (&e, lease) {
        (StoreError::Engine { reason, .. }, Some(l)) if reason.contains("lease not found") => {
            StoreError::LeaseNotFound(l)
        }
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ranges_hold_whole_tokens_and_only_near_neighbours() {
        assert_eq!(
            token_range("apps/web"),
            (b"apps/web".to_vec(), b"apps/web0".to_vec())
        );
        assert_eq!(token_range("apps/"), (b"apps".to_vec(), b"apps0".to_vec()));
        assert_eq!(token_range(""), (vec![0], vec![0]));
        let (start, end) = token_range("apps/web");
        for inside in ["apps/web", "apps/web/spec", "apps/web/z/y"] {
            assert!(start.as_slice() <= inside.as_bytes() && inside.as_bytes() < end.as_slice());
        }
        assert!(b"apps/webshop".as_slice() >= end.as_slice());
    }

    #[test]
    fn a_connection_broken_under_a_request_is_worth_another_try() {
        let broken = tonic::Status::new(tonic::Code::Unknown, "transport error");
        assert!(transient(&etcd_client::Error::GRpcStatus(broken)));
        let refused = tonic::Status::new(
            tonic::Code::InvalidArgument,
            "etcdserver: key is not provided",
        );
        assert!(!transient(&etcd_client::Error::GRpcStatus(refused)));
    }

    #[test]
    fn lease_errors_are_named() {
        let e = StoreError::Engine {
            op: "put",
            reason: "grpc request error: status: NotFound, message: \"etcdserver: requested lease not found\"".into(),
        };
        assert_eq!(with_lease(e, Some(7)), StoreError::LeaseNotFound(7));
    }
}
