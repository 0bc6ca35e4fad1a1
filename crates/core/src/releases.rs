//! The seam through which a node that builds nothing (an API-only node of a cluster) has a
//! release made on a node that does: [`Releases`]. The api crate's delivery implements it on
//! every agent node; the cluster crate carries it over the node port, so that neither imports
//! the other.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncRead;
use tokio::sync::mpsc;

/// A release asked of a node that builds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "what", rename_all = "snake_case")]
pub enum ReleaseAsk {
    /// A push: `size` bytes of gzip'd tar follow, whose SHA-256 is `digest`.
    Push {
        /// The app.
        app: String,
        /// The build kind asked for, unchecked (the building node checks it).
        kind: Option<String>,
        /// The upload's size in bytes, as the asking node received it.
        size: u64,
        /// The upload's SHA-256, hex.
        digest: String,
        /// Who pushed.
        by: String,
        /// Where the source came from, as the client said.
        from: Option<String>,
        /// The groups the app is to admit, as the client asked (checked by the building node).
        #[serde(default)]
        groups: Option<String>,
    },
    /// A config change: vars to set and to unset.
    Config {
        /// The app.
        app: String,
        /// Vars to set.
        set: BTreeMap<String, String>,
        /// Vars to unset.
        unset: Vec<String>,
        /// Who asked.
        by: String,
    },
    /// A rollback to release `to`, or to the last one that served before the current one.
    Rollback {
        /// The app.
        app: String,
        /// The release to run again.
        to: Option<u64>,
        /// The release the asker saw serving, refused when another serves (see the API's
        /// `Rollback`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expect: Option<u64>,
        /// Who asked.
        by: String,
    },
}

impl ReleaseAsk {
    /// The app the release is of.
    pub fn app(&self) -> &str {
        match self {
            Self::Push { app, .. } | Self::Config { app, .. } | Self::Rollback { app, .. } => app,
        }
    }
}

/// A push's bytes, as they come.
pub type UploadReader = Box<dyn AsyncRead + Send + Unpin>;

/// A release's progress: NDJSON lines (the API's `ReleaseEvent`s), each item whole lines; an
/// `Err` ends the stream when the building node was lost before the release's outcome.
pub type ReleaseEvents = mpsc::Receiver<Result<String, ReleaseError>>;

/// Why a release could not be asked for, or what became of it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReleaseError {
    /// The building node refused it before anything ran (a bad name, kind or archive, an
    /// upload too large, no such app): its HTTP status and message, to answer as they are.
    #[error("{message}")]
    Refused {
        /// The HTTP status the building node answered.
        status: u16,
        /// What it said to do.
        message: String,
    },
    /// No node of the cluster can build now.
    #[error("no agent node of the cluster is live to build the release; start `warden up` with the agent role on a node of this cluster (or wait for one to answer again), then retry")]
    NoNode,
    /// The building node could not be asked (every candidate was tried).
    #[error("no agent node took the release ({0}); check `warden nodes list`, then retry")]
    Unreachable(String),
    /// The building node took the release and then broke off before its outcome.
    #[error("node {node} was lost during the release ({reason}); the release's record names node {node}, which resumes or fails it when it starts again; `warden releases {app}` shows how it ended")]
    Lost {
        /// The node that delivers the release.
        node: String,
        /// The app the release is of.
        app: String,
        /// How the connection ended.
        reason: String,
    },
    /// This node is still starting and cannot make releases yet.
    #[error("this node is still starting and takes no release yet; retry in a moment")]
    Starting,
}

/// Makes releases: a node that builds does it itself (and answers with its progress); one that
/// does not passes it to one that does.
#[async_trait]
pub trait Releases: Send + Sync + 'static {
    /// Takes `ask` (for a push, with its bytes in `upload`), and answers with its progress
    /// once its record is written, or why it was refused before anything ran. `prefer` names a
    /// node to ask first (the one that has the app's slug), where there is a choice.
    async fn release(
        &self,
        ask: ReleaseAsk,
        upload: Option<UploadReader>,
        prefer: Option<String>,
    ) -> Result<ReleaseEvents, ReleaseError>;

    /// The build and delivery log of release `number` of `app`, kept by `node`, the node that
    /// delivered it (this one when `None`); empty when it has none.
    async fn log(
        &self,
        app: &str,
        number: u64,
        node: Option<String>,
    ) -> Result<String, ReleaseError>;
}

/// This node's [`Releases`], set once the API's state is made: the node port serves before
/// that, and answers [`ReleaseError::Starting`] until then.
#[derive(Default)]
pub struct LocalReleases(OnceLock<Arc<dyn Releases>>);

impl LocalReleases {
    /// Makes releases with `inner` from now on (once; a second call is ignored).
    pub fn set(&self, inner: Arc<dyn Releases>) {
        let _ = self.0.set(inner);
    }
}

#[async_trait]
impl Releases for LocalReleases {
    async fn release(
        &self,
        ask: ReleaseAsk,
        upload: Option<UploadReader>,
        prefer: Option<String>,
    ) -> Result<ReleaseEvents, ReleaseError> {
        match self.0.get() {
            Some(inner) => inner.release(ask, upload, prefer).await,
            None => Err(ReleaseError::Starting),
        }
    }

    async fn log(
        &self,
        app: &str,
        number: u64,
        node: Option<String>,
    ) -> Result<String, ReleaseError> {
        match self.0.get() {
            Some(inner) => inner.log(app, number, node).await,
            None => Err(ReleaseError::Starting),
        }
    }
}
