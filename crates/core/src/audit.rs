//! The audit trail's seam (issue 35): what a role records ([`Event`]) and the one trait it
//! records through ([`Audit`]). Roles depend on this module only; the node's log itself (a
//! hash-chained file per node, anchored in the store) is the `warden-audit` crate's, wired in
//! by the binary. [`NoAudit`] records nothing, for tests and processes without a log.
//!
//! No event carries a secret: no password, token, session id or config value. A change's body
//! is recorded as a digest, never as itself.

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

/// The most deciding claims a sign-in record keeps (rules are few; a provider's claims are not
/// warden's to store in bulk).
pub const MAX_CLAIMS: usize = 16;
/// The longest deciding claim a sign-in record keeps, in bytes.
pub const MAX_CLAIM: usize = 128;

/// One thing that happened, as the log keeps it (under the record's `event`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "snake_case")]
#[cfg_attr(feature = "schema", schemars(rename = "AuditEvent"))]
pub enum Event {
    /// A sign-in at the gateway: `outcome` is `ok`, `failed`, `throttled`, `refreshed` (a
    /// provider session refreshed) or `refused` (a provider account took a name another holds).
    SignIn {
        /// The user name given.
        user: String,
        /// The client's address.
        addr: String,
        /// How: `basic`, `form`, …
        method: String,
        /// `ok`, `failed`, `throttled`, `refreshed` or `refused`.
        outcome: String,
        /// For a provider sign-in or refresh that gave a clearance: the claim values that
        /// matched its mapping rules (`claim=value`, at most [`MAX_CLAIMS`], each cut to
        /// [`MAX_CLAIM`] bytes). Never a token.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        claims: Vec<String>,
        /// How many such attempts in the minute this record sums up (the gateway aggregates
        /// them per minute per user, address, method and outcome, so a flood writes one record
        /// a minute); absent: one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        count: Option<u64>,
        /// When the first of them came (ms since the epoch).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        first_ms: Option<u64>,
        /// When the last of them came.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_ms: Option<u64>,
    },
    /// A user's requests to one instance of an app at one label, aggregated over a minute.
    Access {
        /// The user.
        user: String,
        /// The app.
        app: String,
        /// The label the requests were served at.
        label: String,
        /// The instance that served them.
        instance: String,
        /// The node the instance runs on.
        node: String,
        /// How many requests.
        count: u64,
        /// Bytes the gateway counted for them: each request as sent to the instance (head and
        /// body) and its answer's body when its length was known as the answer came.
        bytes: u64,
        /// When the first began (ms since the epoch).
        first_ms: u64,
        /// When the last began.
        last_ms: u64,
    },
    /// Requests refused (401, 403, 404), aggregated by user or address: the gateway's, and the
    /// API's refusals of its token (by address and route).
    Refusal {
        /// The status answered.
        status: u16,
        /// The user, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        /// The client's address, when no user is known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        addr: Option<String>,
        /// The app asked for, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        app: Option<String>,
        /// The API route's template (e.g. `/v1/apps`), for a refusal of the API.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        route: Option<String>,
        /// How many requests.
        count: u64,
        /// When the first came.
        first_ms: u64,
        /// When the last came.
        last_ms: u64,
    },
    /// An instance tainted: relabelled from `from` to `to`.
    Taint {
        /// The app.
        app: String,
        /// The instance.
        instance: String,
        /// The label before.
        from: String,
        /// The label after.
        to: String,
    },
    /// Rows a declassifier wrote down from one label to a lower one.
    Declassified {
        /// The declassifier app.
        app: String,
        /// The label read.
        from: String,
        /// The label written.
        to: String,
        /// How many rows.
        count: u64,
    },
    /// A change through the API: recorded (durably) before it is acted on with outcome
    /// `pending`, then again with the status it ended with.
    Change {
        /// Who: the credential that made it (`admin token`: the only API credential today).
        actor: String,
        /// The HTTP method.
        method: String,
        /// The route's template, e.g. `/v1/apps/{name}`.
        route: String,
        /// The name or id in the path, if the route has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target: Option<String>,
        /// `pending`, then the status answered (e.g. `201`).
        outcome: String,
        /// SHA-256 (hex) of what was there before, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        before: Option<String>,
        /// HMAC-SHA256 (hex) of the request's body under the log's key ([`Audit::digest`]):
        /// never the body, which may hold secrets, nor a plain hash a guess can be tested on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
    },
    /// This node's log started or stopped, or a node joined or was lost.
    Node {
        /// What happened.
        event: NodeEvent,
        /// Which node joined or was lost (absent for this node's own start and stop, and in
        /// records written before it was kept).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
    },
    /// Records that are not in the log, and why.
    Gap {
        /// Why, in words.
        why: String,
        /// How many records were lost, when counted.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lost: Option<u64>,
    },
    /// Older segments were dropped by retention: the chain goes on from `hash`, the hash of
    /// record `up_to_seq`, the last one dropped.
    Pruned {
        /// The last sequence number dropped.
        up_to_seq: u64,
        /// Its hash.
        hash: String,
    },
}

/// What a [`Event::Node`] record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", schemars(rename = "AuditNodeEvent"))]
pub enum NodeEvent {
    /// A node joined the cluster.
    Joined,
    /// A node was lost.
    Lost,
    /// This node's log opened.
    Started,
    /// This node's log closed cleanly.
    Stopped,
}

// === impl Event ===

impl Event {
    /// The `kind` tag, as the log writes it.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::SignIn { .. } => "sign_in",
            Event::Access { .. } => "access",
            Event::Refusal { .. } => "refusal",
            Event::Taint { .. } => "taint",
            Event::Declassified { .. } => "declassified",
            Event::Change { .. } => "change",
            Event::Node { .. } => "node",
            Event::Gap { .. } => "gap",
            Event::Pruned { .. } => "pruned",
        }
    }

    /// The user it is about, if any.
    pub fn user(&self) -> Option<&str> {
        match self {
            Event::SignIn { user, .. } | Event::Access { user, .. } => Some(user),
            Event::Refusal { user, .. } => user.as_deref(),
            _ => None,
        }
    }

    /// Who made it: a change's actor, else the user it is about.
    pub fn actor(&self) -> Option<&str> {
        match self {
            Event::Change { actor, .. } => Some(actor),
            _ => self.user(),
        }
    }

    /// The app it is about, if any (a change's target on an app route counts).
    pub fn app(&self) -> Option<&str> {
        match self {
            Event::Access { app, .. }
            | Event::Taint { app, .. }
            | Event::Declassified { app, .. } => Some(app),
            Event::Refusal { app, .. } => app.as_deref(),
            Event::Change { route, target, .. } if route.starts_with("/v1/apps/") => {
                target.as_deref()
            }
            _ => None,
        }
    }

    /// The labels it touches.
    pub fn labels(&self) -> Vec<&str> {
        match self {
            Event::Access { label, .. } => vec![label],
            Event::Taint { from, to, .. } | Event::Declassified { from, to, .. } => {
                vec![from, to]
            }
            _ => Vec::new(),
        }
    }
}

/// One record of a node's log: an event with its place in the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "AuditRecord"))]
pub struct Record {
    /// Its place in the node's log, from 1, without holes.
    pub seq: u64,
    /// When it was written (ms since the epoch).
    pub at_ms: u64,
    /// The node whose log it is in.
    pub node: String,
    /// What happened.
    pub event: Event,
    /// The hash of the record before (64 zeros for the first).
    pub prev: String,
    /// SHA-256 (hex) of `prev` and the record's bytes without `hash`.
    pub hash: String,
}

/// Which records a reader wants. Every field narrows; none: all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", schemars(rename = "AuditQuery"))]
pub struct Query {
    /// Only records of this node's log (on a cluster; one node's records all name it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Only records about this user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Only records made by this actor: a change's (`operator:<name>`, `admin token`), or the
    /// user of a sign-in, an access or a refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// Only records about this app.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
    /// Only records touching this label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Only records of this kind (`change`, `access`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Only records written at or after this time (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// Only records written before this time (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<u64>,
    /// Only records after this sequence number (for following).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    /// At most this many (default 1000): the newest, or with `after` the first after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

// === impl Query ===

impl Query {
    /// Whether `r` is one this query wants (all but `limit`).
    pub fn matches(&self, r: &Record) -> bool {
        let e = &r.event;
        self.node.as_deref().is_none_or(|n| r.node == n)
            && self.user.as_deref().is_none_or(|u| e.user() == Some(u))
            && self.actor.as_deref().is_none_or(|a| e.actor() == Some(a))
            && self.app.as_deref().is_none_or(|a| e.app() == Some(a))
            && self
                .label
                .as_deref()
                .is_none_or(|l| e.labels().contains(&l))
            && self.kind.as_deref().is_none_or(|k| e.kind() == k)
            && self.since.is_none_or(|t| r.at_ms >= t)
            && self.until.is_none_or(|t| r.at_ms < t)
            && self.after.is_none_or(|s| r.seq > s)
    }
}

/// What `verify` found in a node's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "AuditVerified"))]
pub struct Verified {
    /// The node whose log it is.
    pub node: String,
    /// Whether the log is whole: every check passed.
    pub ok: bool,
    /// Records read.
    pub records: u64,
    /// The last sequence number read.
    pub head_seq: u64,
    /// The sequence number of the anchor in the store, if one was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor_seq: Option<u64>,
    /// The first bad spot, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<Problem>,
}

/// Where a log stops being whole, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "AuditProblem"))]
pub struct Problem {
    /// The segment file.
    pub file: String,
    /// The line in it, from 1 (0: the file as a whole).
    pub line: u64,
    /// The sequence number expected or read there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// What is wrong: `edited`, `missing`, `reordered`, `truncated tail`, `not this node's
    /// chain`, `anchor`, `unreadable`.
    pub what: String,
    /// The details, in words.
    pub detail: String,
}

/// Why the audit log could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuditError {
    /// This process keeps no audit log.
    #[error("this node keeps no audit log")]
    NotKept,
    /// The log cannot take records now (a full queue, a full disk, a stopped writer).
    #[error("the audit log cannot write: {0}")]
    Unavailable(String),
    /// Reading the log failed.
    #[error("cannot read the audit log: {0}")]
    Read(String),
    /// The query cannot be answered as asked; the message says what to ask instead.
    #[error("{0}")]
    Invalid(String),
}

/// Resolves once a durable record is on disk (fsync'd), or says why it is not.
pub type DurableFuture = Pin<Box<dyn Future<Output = Result<(), AuditError>> + Send>>;

/// A future of the audit log's reading side.
pub type AuditFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, AuditError>> + Send + 'a>>;

/// Where roles record what happened. Recording never blocks: a record that cannot be queued is
/// counted, and the log says how many were lost as soon as it can.
pub trait Audit: Send + Sync {
    /// Queues `e`; it reaches the disk with the next batch.
    fn record(&self, e: Event);
    /// Queues `e` and resolves once it is fsync'd: for decisions acted on after (API changes).
    fn record_durable(&self, e: Event) -> DurableFuture;
    // `kept`, `health`, `required` and `refusing` have no default: a wrapper that forgot to
    // pass one on would switch the alarm or fail-closed mode off without a word (it once did).
    /// Whether this is a log at all ([`NoAudit`] is not).
    fn kept(&self) -> bool;
    /// `Ok` while the log writes; else why not (shown in `/readyz` and `warden status`).
    fn health(&self) -> Result<(), String>;
    /// Whether this node refuses access while the log cannot write (`--audit required`).
    fn required(&self) -> bool;
    /// While the log is [`required`](Audit::required) and cannot record (a write failing, the
    /// writer stopped, lost records not yet counted into a `gap`): why, in words a client may
    /// read (no secret; no path outside the log's directory). `None` otherwise, after one atomic
    /// load: it is asked on every request that would reach an instance, sign in or change.
    fn refusing(&self) -> Option<String>;
    /// A digest of a change's body for its record: HMAC-SHA256 (hex) under a key of the log's,
    /// so that equal bodies give equal digests (on a cluster, on every node) while no one
    /// without the key can test a guess of a password or a config value against it (a plain
    /// SHA-256 of a body of known shape can be searched offline).
    fn digest(&self, body: &[u8]) -> String;
    /// Counts for metrics.
    fn stats(&self) -> AuditStats {
        AuditStats::default()
    }
    /// The records `q` wants, oldest first.
    fn query(&self, q: Query) -> AuditFuture<'_, Vec<Record>> {
        let _ = q;
        Box::pin(async { Err(AuditError::NotKept) })
    }
    /// Walks the node's log and checks it against its anchor.
    fn verify(&self) -> AuditFuture<'_, Verified> {
        Box::pin(async { Err(AuditError::NotKept) })
    }
    /// Every node's log checked: on one node, this node's alone; on a cluster (see
    /// `warden_cluster::ClusterAudit`) one per node, a node that cannot be checked among them
    /// as not whole, with why.
    fn verify_all(&self) -> AuditFuture<'_, Vec<Verified>> {
        Box::pin(async { self.verify().await.map(|v| vec![v]) })
    }
}

/// Counts of a log since the process started, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditStats {
    /// The sequence number of the last record written.
    pub head_seq: u64,
    /// Records that could not be written (a full queue, a failed write).
    pub lost: u64,
}

/// Calls `flush` every `period` (the first time one period from now) until `shutdown` turns
/// true, then once more: how a role's per-period sums reach the log, the last of them at stop.
pub async fn flush_every(
    period: std::time::Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    flush: impl Fn(),
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => flush(),
            _ = shutdown.wait_for(|s| *s) => break,
        }
    }
    flush();
}

/// Records nothing: for tests and processes that keep no log.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoAudit;

impl Audit for NoAudit {
    fn record(&self, _: Event) {}
    fn kept(&self) -> bool {
        false
    }
    fn health(&self) -> Result<(), String> {
        Ok(())
    }
    fn required(&self) -> bool {
        false
    }
    fn refusing(&self) -> Option<String> {
        None
    }
    fn digest(&self, _: &[u8]) -> String {
        String::new()
    }
    fn record_durable(&self, _: Event) -> DurableFuture {
        Box::pin(async { Ok(()) })
    }
}
