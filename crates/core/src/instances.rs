//! The seams between the gateway (and the API) and wherever instances come from: the data
//! path, [`Instances`], and administration beyond it, [`InstanceAdmin`].
//!
//! A gateway asks an [`Instances`] for "a ready instance of this app for this label and owner",
//! connects to it, and reports what it saw (a refused connection, taint, a per-request instance
//! whose request is done). The local agent implements it today; the cluster adds one that
//! reaches other nodes. Neither side imports the other: both depend on this trait only.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::model::{now_ms, AppSpec, InstanceRecord, Lifetime};

/// Whom an instance is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Owner {
    /// Everyone with the label.
    Shared,
    /// One user.
    User(String),
    /// One request: a fresh instance, never handed out again.
    Request,
}

// === impl Owner ===

impl Owner {
    /// The owner an app's lifetime asks for, given the user a request comes from.
    pub fn for_lifetime(lifetime: Lifetime, user: &str) -> Self {
        match lifetime {
            Lifetime::Shared => Self::Shared,
            Lifetime::PerUser => Self::User(user.to_owned()),
            Lifetime::PerRequest => Self::Request,
        }
    }

    /// The user an instance is reserved for; empty for shared and per-request instances (the
    /// form instance records and routing keys use).
    pub fn user(&self) -> &str {
        match self {
            Self::User(u) => u,
            Self::Shared | Self::Request => "",
        }
    }

    /// What an instance record holds for this owner ([`InstanceRecord::user`]): the user for a
    /// per-user instance, `None` for the others.
    pub fn reserved_for(&self) -> Option<String> {
        match self {
            Self::User(u) => Some(u.clone()),
            Self::Shared | Self::Request => None,
        }
    }
}

/// Why no instance could be had, found or changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstanceError {
    /// No app of that name is registered.
    #[error("no app named {0:?} is registered; create it with `warden apps create`")]
    UnknownApp(String),
    /// No instance with that id runs where it was looked for.
    #[error("no instance {0:?} runs on this node")]
    UnknownInstance(String),
    /// The app could not be run, or exited before it was ready. `reason` says why, with the
    /// last lines the instance printed.
    #[error("{reason}")]
    StartFailed {
        /// App name.
        app: String,
        /// The whole story, for an operator.
        reason: String,
    },
    /// The app did not become ready within its start timeout.
    #[error("{reason}")]
    StartTimeout {
        /// App name.
        app: String,
        /// The start timeout.
        ms: u64,
        /// What readiness lacked, with the last lines the instance printed.
        reason: String,
    },
    /// The app's instances for this label keep crashing: nothing starts before
    /// `retry_after` is over.
    #[error("{reason}")]
    CrashLoop {
        /// App name.
        app: String,
        /// Until the next start may be tried.
        retry_after: std::time::Duration,
        /// The whole story, for an operator.
        reason: String,
    },
    /// No instance can be had here now; `reason` says whether another node may do better
    /// ([`InstanceError::elsewhere`]) and whether asking again later may
    /// ([`InstanceError::retry_later`]).
    #[error("{detail}")]
    Unavailable {
        /// What happened, as far as where to ask next is concerned.
        reason: Unavailable,
        /// The whole story, for an operator.
        detail: String,
    },
}

/// Why no instance could be had, for a caller that decides where to ask next: another node
/// ([`Unavailable::elsewhere`]), the same one later ([`Unavailable::retry_later`]), or nobody.
///
/// It crosses the node port: a reason this node does not know (sent by a newer node) decodes as
/// [`Unavailable::Other`], never as a broken message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unavailable {
    /// A limit of this node is reached (its instances, the app's instances on it, free uids,
    /// ports or sandbox addresses): another node may have room, and this one once an instance
    /// stops.
    Limit,
    /// This node is draining or stopping: another node may start it; this one will not.
    Stopping,
    /// The store cannot be read or written: no node does better, so the caller stops; asking
    /// again later may work.
    Store,
    /// No agent runs where it was asked (a gateway- or API-only process, or no live agent node):
    /// another node's agent may start it.
    NoAgent,
    /// The node (or the instance through it) could not be reached, or did not answer sensibly:
    /// another node may do better.
    Unreachable,
    /// This node cannot do its part (a directory it cannot make, metrics it cannot register):
    /// another node may do better.
    Node,
    /// What was asked for is not on this node (an instance's logs, a slug): another node may
    /// have it.
    NotHere,
    /// A reason this node does not know, from a newer node: treated as before reasons existed
    /// (another node may be tried, and this one later).
    #[serde(other)]
    Other,
}

// === impl Unavailable ===

impl Unavailable {
    /// Whether another node may do better.
    pub fn elsewhere(self) -> bool {
        !matches!(self, Self::Store)
    }

    /// Whether asking the same again later may succeed.
    pub fn retry_later(self) -> bool {
        !matches!(self, Self::Stopping | Self::NoAgent | Self::NotHere)
    }
}

// === impl InstanceError ===

impl InstanceError {
    /// An [`InstanceError::Unavailable`] for `reason`, told by `detail`.
    pub fn unavailable(reason: Unavailable, detail: impl Into<String>) -> Self {
        Self::Unavailable {
            reason,
            detail: detail.into(),
        }
    }

    /// Whether another node may do better: only a shortage of this node (full, stopping,
    /// unreachable, no agent) says so. An unknown app, a failing app, a crash loop or a store
    /// that cannot be read are the same on every node.
    pub fn elsewhere(&self) -> bool {
        match self {
            Self::Unavailable { reason, .. } => reason.elsewhere(),
            _ => false,
        }
    }

    /// Whether asking the same again later may succeed (a crash loop's backoff ends; a full
    /// node frees room); an unknown app or instance, or an app that fails to start, stays so.
    pub fn retry_later(&self) -> bool {
        match self {
            Self::Unavailable { reason, .. } => reason.retry_later(),
            Self::CrashLoop { .. } | Self::StartTimeout { .. } => true,
            Self::UnknownApp(_) | Self::UnknownInstance(_) | Self::StartFailed { .. } => false,
        }
    }
}

/// A stream to an instance on another node (through that node's node port).
pub trait RemoteStream: AsyncRead + AsyncWrite + Send + Sync + Unpin {
    /// Whether an idle connection may carry another request: the far side has neither closed
    /// it nor sent anything unasked. Must not block or consume data.
    fn reusable(&self) -> bool;
}

/// A connection to an instance: an ordinary TCP socket to it on its own node (no proxy hop),
/// or a stream through the node port of the node it runs on.
pub enum InstanceStream {
    /// Straight to the instance.
    Tcp(TcpStream),
    /// Through another node.
    Remote(Box<dyn RemoteStream>),
}

impl AsyncRead for InstanceStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Self::Remote(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for InstanceStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Self::Remote(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Remote(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Tcp(s) => s.is_write_vectored(),
            Self::Remote(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_flush(cx),
            Self::Remote(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Self::Remote(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Use of an instance as the gateway reports it, read by the idle reaper.
#[derive(Debug, Default)]
pub struct Activity {
    last_used_ms: AtomicU64,
    in_flight: AtomicUsize,
}

/// Marks a request in flight on an instance until dropped.
pub struct ActivityGuard(Arc<Activity>);

// === impl Activity ===

impl Activity {
    /// An instance used just now.
    pub fn new() -> Self {
        let a = Self::default();
        a.touch();
        a
    }

    /// Marks one request as in flight until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> ActivityGuard {
        // No touch here: while a request is in flight the instance is not idle whatever the
        // time says ([`Activity::idle_for`]), and the guard's drop touches it. One clock read
        // and one write of a line every core shares, fewer per request.
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        ActivityGuard(self.clone())
    }

    /// Counts as used now, without a request in flight (a spare handed out).
    pub fn touch(&self) {
        self.last_used_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// How long nothing has been in flight, as of `now` (ms since the epoch); `None` while a
    /// request is.
    pub fn idle_for(&self, now: u64) -> Option<Duration> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let last = self.last_used_ms.load(Ordering::Relaxed);
        Some(Duration::from_millis(now.saturating_sub(last)))
    }
}

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The data path: what a gateway needs of wherever instances come from (the local agent, the
/// cluster, or nothing at all) to reach one and report what it saw.
///
/// The gateway's request path calls [`Instances::ensure`] only when its views (fed by store
/// watches) hold no ready instance, and [`Instances::connect`] only for a connection its pool
/// does not have; everything else is reported after the fact.
#[async_trait]
pub trait Instances: Send + Sync + 'static {
    /// A ready instance of `spec`'s app for `label` and `owner`, started if none runs; the
    /// caller waits until it accepts connections. Shared and per-user instances are handed out
    /// again; a per-request one never is (stop it with [`Instances::retire`]).
    async fn ensure(
        &self,
        spec: &AppSpec,
        label: &str,
        owner: &Owner,
    ) -> Result<InstanceRecord, InstanceError>;

    /// Opens a connection to `instance`, wherever it runs.
    async fn connect(&self, instance: &InstanceRecord) -> std::io::Result<InstanceStream>;

    /// `instance` refused a connection; the caller has already stopped routing to it. Nothing
    /// to do for a source that watches no instance's health.
    fn refused(&self, _instance: &InstanceRecord) {}

    /// Stops a per-request instance whose request is done, in the background.
    fn retire(&self, id: &str);

    /// Raises an instance's label after it reported taint. From the moment this returns,
    /// [`Instances::ensure`] never hands it out for its old label; its record follows in the
    /// background.
    fn relabel(&self, id: &str, label: &str);

    /// Stops an instance and returns once it is gone (the gateway's answer to a taint its
    /// lattice does not know).
    async fn kill(&self, id: &str) -> Result<(), InstanceError>;

    /// The activity handle of an instance whose idle time this source watches, if any; the
    /// gateway marks its requests in flight on it. `None` from a source that reaps no idle
    /// instance.
    fn activity(&self, _id: &str) -> Option<Arc<Activity>> {
        None
    }

    /// Has `hook` told of every instance of this node relabelled after a taint, whoever saw
    /// the taint (this process's gateway or another node's), the moment it stops serving its
    /// old label: a gateway in the same process stops routing that label to it then, not once
    /// the store's record says so. Nothing to do for a source that runs no instance.
    fn on_relabel(&self, _hook: RelabelHook) {}
}

/// Told (instance id, its new label, or `None` when it is being stopped instead) by
/// [`Instances::on_relabel`].
pub type RelabelHook = Arc<dyn Fn(&str, Option<&str>) + Send + Sync>;

/// Administration beyond the data path: what the API (an instance's logs) and a node port
/// serving its agent's instances (whether an id runs here, with what label) need. A process
/// without an agent, and so without instances of its own, has none.
pub trait InstanceAdmin: Instances {
    /// The record of an instance running on this node, by id.
    fn record(&self, id: &str) -> Option<InstanceRecord>;

    /// Every instance running on this node, as its agent holds it: the store's records follow
    /// behind a request (a start a request waits for is recorded after it), so an instance may
    /// be here before it is there.
    fn own_records(&self) -> Vec<InstanceRecord> {
        Vec::new()
    }

    /// The last `lines` lines an instance printed, running or recently exited.
    fn logs(&self, id: &str, lines: usize) -> Result<String, InstanceError>;

    /// When an instance's log was last written (its mtime), which orders the lines of an
    /// app's instances; `None` where unknown.
    fn log_written(&self, _id: &str) -> Option<std::time::SystemTime> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_is_idle_only_with_nothing_in_flight() {
        let a = Arc::new(Activity::new());
        let later = now_ms() + 5_000;
        assert!(a
            .idle_for(later)
            .is_some_and(|d| d >= Duration::from_secs(4)));
        let guard = a.begin();
        assert_eq!(a.idle_for(later), None);
        drop(guard);
        assert!(a.idle_for(later).is_some());
    }

    #[test]
    fn only_a_shortage_of_this_node_sends_a_start_elsewhere() {
        let full = InstanceError::unavailable(Unavailable::Limit, "this node is full");
        let store = InstanceError::unavailable(Unavailable::Store, "the store is down");
        assert!(full.elsewhere() && full.retry_later());
        assert!(!store.elsewhere() && store.retry_later());
        assert!(InstanceError::unavailable(Unavailable::Stopping, "x").elsewhere());
        assert!(!InstanceError::unavailable(Unavailable::Stopping, "x").retry_later());
        assert!(!InstanceError::UnknownApp("a".into()).elsewhere());
        assert_eq!(full.to_string(), "this node is full");
    }

    #[test]
    fn a_reason_from_a_newer_node_decodes_as_a_generic_one() {
        let sent = InstanceError::unavailable(Unavailable::Limit, "full");
        let json = serde_json::to_string(&sent).expect("encode");
        assert_eq!(
            serde_json::from_str::<InstanceError>(&json).expect("decode"),
            sent
        );
        let newer = json.replace("\"limit\"", "\"out_of_gpus\"");
        assert_ne!(newer, json, "{json}");
        let got: InstanceError = serde_json::from_str(&newer).expect("an unknown reason decodes");
        assert_eq!(got, InstanceError::unavailable(Unavailable::Other, "full"));
        // As before reasons existed: another node may be tried.
        assert!(got.elsewhere());
    }

    #[test]
    fn owners_follow_the_lifetime() {
        assert_eq!(Owner::for_lifetime(Lifetime::Shared, "a"), Owner::Shared);
        assert_eq!(
            Owner::for_lifetime(Lifetime::PerUser, "a"),
            Owner::User("a".into())
        );
        assert_eq!(Owner::for_lifetime(Lifetime::PerRequest, "a").user(), "");
    }
}
