//! The seam between the API, which takes pushes and makes releases, and the agent, which builds
//! slugs and tries them: [`Builds`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;

use crate::{AppSpec, BuildKind};

/// Names of the files in a slug's home (`<slugs>/<id>/`) that more than one role reads: the
/// agent writes them, and the cluster server sends the archive to nodes that fetch it.
pub mod slug_files {
    /// The slug as one gzip'd tar (its mark and its tree); never inside the archive itself.
    pub const ARCHIVE: &str = "slug.tar.gz";
    /// The archive's SHA-256, hex, written last: the slug is complete when it is there.
    pub const DIGEST: &str = "slug.sha256";
}

/// Where a build's or a trial's output lines go, as they come.
pub type Output = Arc<dyn Fn(&str) + Send + Sync>;

/// A built slug.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    /// The slug's id: SHA-256 over the source archive's digest and how it was built.
    pub slug: String,
    /// How it was built.
    pub kind: BuildKind,
    /// What instances run (the Procfile's `web`, through `/bin/sh -c`); empty for a static site.
    pub command: Vec<String>,
    /// What a push's release phase runs once before its trial (the Procfile's `release`,
    /// through `/bin/sh -c`); empty when there is none.
    pub release: Vec<String>,
    /// What each of its Procfile's other process types runs (`worker`, `clock`; neither
    /// `web` nor `release`), by name, through `/bin/sh -c`.
    pub processes: std::collections::BTreeMap<String, Vec<String>>,
    /// The slug's files on this node, for a static site the gateway serves.
    pub dir: PathBuf,
    /// SHA-256 of the slug's archive, for nodes that fetch it.
    pub archive: String,
    /// Whether an earlier push had built it already.
    pub cached: bool,
}

/// Why a push could not be built. `BadArchive` is the pusher's to fix before anything ran.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The upload is not a usable archive (or holds something a slug may not).
    #[error("{0}")]
    BadArchive(String),
    /// The tree does not say how to build or run it.
    #[error("{0}")]
    Detect(String),
    /// The build ran and failed, or ran out of time.
    #[error("{0}")]
    Failed(String),
    /// The node could not do its part (disk, directories, no driver).
    #[error("{0}")]
    Node(String),
}

/// Why a release's trial instance did not become ready.
#[derive(Debug, thiserror::Error)]
pub enum TrialError {
    /// The instance exited, or was not ready within the app's start timeout; with the last
    /// lines it printed. The release is the pusher's to fix.
    #[error("{0}")]
    NotReady(String),
    /// The node could not start it (its slug, its directory, its driver).
    #[error("{0}")]
    Node(String),
}

/// Why a push's release phase (the Procfile's `release` command) did not pass.
#[derive(Debug, thiserror::Error)]
pub enum ReleasePhaseError {
    /// The command exited non-zero or ran out of time (with its last lines), or made a table
    /// warden cannot label (named). The release is the pusher's to fix.
    #[error("{0}")]
    Failed(String),
    /// The node could not run it (its slug, its directory, its driver, the data server).
    #[error("{0}")]
    Node(String),
}

/// Builds slugs from pushed archives and tries releases before they serve.
#[async_trait]
pub trait Builds: Send + Sync + 'static {
    /// Checks the archive at `archive` (gzip'd tar, SHA-256 `digest`) and unpacks it, unless
    /// the slug it makes with `kind` (detected when `None`) is built already. Cheap errors only:
    /// a bad archive, a tree that says nothing about how to run it.
    async fn prepare(
        &self,
        app: &str,
        archive: &Path,
        digest: &str,
        kind: Option<BuildKind>,
    ) -> Result<Prepared, BuildError>;

    /// Builds what [`Builds::prepare`] unpacked, with a time limit; output goes to `out`.
    async fn build(&self, prepared: Prepared, out: Output) -> Result<Built, BuildError>;

    /// Starts one instance of `spec` for `label` outside all routing, waits until it is ready
    /// (its health path, else accepting connections), and stops it. On failure: why, with the
    /// last lines it printed.
    async fn trial(&self, spec: &AppSpec, label: &str) -> Result<(), TrialError>;

    /// Runs `command` once as a one-off process of `spec` (its driver, its slug, its config
    /// vars; for an app with data, `DATABASE_URL` logged in as its owner role), at most the
    /// build time limit, output to `out`; then, for an app with data, labels the tables it
    /// made.
    async fn release_phase(
        &self,
        spec: &AppSpec,
        command: &[String],
        out: Output,
    ) -> Result<(), ReleasePhaseError>;

    /// Starts `command` as a fresh one-off process of `spec` at `label` (its driver, its slug,
    /// its config vars; for an app with data, `DATABASE_URL` logged in as `label`'s role),
    /// attached to the returned [`crate::oneoff::OneOff`], with no time limit: it ends on its
    /// own, when the `OneOff` is dropped, or when warden stops.
    async fn one_off(
        &self,
        spec: &AppSpec,
        label: &str,
        command: &[String],
    ) -> Result<crate::oneoff::OneOff, crate::oneoff::OneOffError> {
        let _ = (spec, label, command);
        Err(crate::oneoff::OneOffError::NoAgent)
    }

    /// Slug `slug`, if it is built (or fetched) on this node.
    fn built(&self, slug: &str) -> Option<Built>;
}

/// Where a node gets a slug it did not build: another node of the cluster that has it.
#[async_trait]
pub trait SlugSource: Send + Sync + 'static {
    /// Copies the archive of slug `slug` into the file `into`, at most `max` bytes. The caller
    /// checks its digest.
    async fn fetch(&self, slug: &str, into: &Path, max: u64) -> Result<(), SlugSourceError>;
}

/// Why no node gave a slug.
#[derive(Debug, thiserror::Error)]
pub enum SlugSourceError {
    /// No other live node serves slugs.
    #[error("no other live node serves slugs; start the node that built it (an API node), or push the app again")]
    NoNode,
    /// Every node that serves slugs was asked; none gave it.
    #[error("no node gave it ({})", list(.0))]
    NoneGave(Vec<(String, SlugTransferError)>),
}

/// Why one node did not give a slug.
#[derive(Debug, thiserror::Error)]
pub enum SlugTransferError {
    /// Its node port could not be reached, or broke off.
    #[error("its node port could not be reached: {0}")]
    Unreachable(#[source] std::io::Error),
    /// It answered that it cannot (most often: it does not have the slug).
    #[error("it answered: {0}")]
    Refused(#[source] crate::InstanceError),
    /// It answered something that is no slug.
    #[error("it answered a slug request with {0}")]
    Unexpected(String),
    /// The archive is larger than a node fetches.
    #[error("its archive is {size} bytes, more than the {max} a node fetches")]
    TooLarge {
        /// The archive's size.
        size: u64,
        /// The most a node fetches.
        max: u64,
    },
    /// The transfer ended early.
    #[error("the transfer ended after {copied} of {size} bytes")]
    Short {
        /// Bytes received.
        copied: u64,
        /// Bytes announced.
        size: u64,
    },
    /// The archive could not be written on this node.
    #[error("cannot write the archive to {}: {source}; give warden room and write access in its data dir", path.display())]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The whole transfer took too long.
    #[error("no slug within {0} s")]
    TimedOut(u64),
}

fn list(failures: &[(String, SlugTransferError)]) -> String {
    let each: Vec<String> = failures.iter().map(|(n, e)| format!("{n}: {e}")).collect();
    each.join("; ")
}

/// An unpacked source waiting for its build, or a slug already built.
#[derive(Debug)]
pub struct Prepared {
    /// The slug's id.
    pub slug: String,
    /// How it will be built.
    pub kind: BuildKind,
    /// What instances will run.
    pub command: Vec<String>,
    /// What its release phase will run; empty when nothing.
    pub release: Vec<String>,
    /// Whether the app has data, as the tree's `app.toml` says; `None` when it says nothing.
    pub data: Option<bool>,
    /// The built slug, when an earlier push built it.
    pub built: Option<Built>,
    /// Where the source was unpacked, when it still has to be built.
    pub tree: Option<PathBuf>,
    /// The slug of the app's serving release, whose installed dependencies the build may
    /// start from (set by the API; never another app's).
    pub previous: Option<String>,
}
