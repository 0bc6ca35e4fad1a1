//! The seam between the agent's bookkeeping and the ways it can run an instance.
//!
//! A driver turns a launch (command, env, a log file, a private directory) into a running child
//! and the address the gateway reaches it at. Everything else (records, readiness, reaping,
//! restarts) is the agent's and the same for every driver.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use warden_core::AppSpec;
use warden_sandbox::process::Process;

use warden_sandbox::{bridge::BridgeError, cgroup::CgroupError};

/// What to start.
pub(crate) struct Launch<'a> {
    /// The app's spec.
    pub spec: &'a AppSpec,
    /// Environment without `PORT`: the driver chooses the port.
    pub env: BTreeMap<String, String>,
    /// File that receives the instance's stdout and stderr.
    pub log: &'a Path,
    /// A directory only this instance may write; removed when it exits.
    pub dir: &'a Path,
    /// A slug's build rather than an instance: the workdir is writable (and, in a sandbox, the
    /// host's network shared) for the build alone.
    pub build: bool,
}

/// What a started instance holds on the node until its process is reaped (a bridge address,
/// cgroups).
pub(crate) trait Held: Send {
    /// What the kernel's out-of-memory killer did to the instance, if anything; read as soon as
    /// it is reaped.
    fn oom_note(&self) -> Option<String>;
    /// Lets go of everything, once the instance's process is reaped.
    fn release(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// A started instance.
pub(crate) struct Started {
    /// The process whose exit is the instance's exit; signalling its process group stops it.
    pub child: Process,
    /// Where the gateway connects: `host:port`, or `fd+unix:<path>` for a socket that hands
    /// out connections opened inside the instance's own network namespace.
    pub addr: warden_core::InstanceAddr,
    /// What the instance holds until it is gone; `None` when nothing.
    pub held: Option<Box<dyn Held>>,
    /// Where a sandbox's init says the app accepts connections (see
    /// `lifecycle::ready::Listening`); `None` when nothing will say.
    pub listening: Option<std::os::unix::net::UnixStream>,
    /// The uid whose socket must accept a connection to a TCP `addr` for the instance to count
    /// as ready: the app's own, since any process on the host may bind a loopback port the app
    /// was told before the app does. `None` for an address only the instance can listen on.
    pub owner: Option<u32>,
}

/// A way to run instances.
pub(crate) trait Driver: Send + Sync {
    /// Starts the instance.
    fn start(&self, launch: &Launch<'_>) -> Result<Started, LaunchError>;
    /// Starts a one-off process attached to a client through `stdio` instead of the log.
    fn start_attached(
        &self,
        launch: &Launch<'_>,
        stdio: super::attached::Attached,
    ) -> Result<Started, LaunchError>;
}

/// Why a driver could not start an instance. Each message says what an operator checks.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A file or directory the instance needs could not be made.
    #[error("cannot create {}: {source}", path.display())]
    Create {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No loopback port was free.
    #[error("no free loopback port: {0}")]
    NoPort(std::io::Error),
    /// The program named by the app's command is not there.
    #[error("program {program:?} not found (looked in the workdir or {search})")]
    NotFound {
        /// The program as the spec names it.
        program: String,
        /// The PATH searched.
        search: &'static str,
    },
    /// A process could not be started.
    #[error("cannot run {what}: {source}")]
    Spawn {
        /// What was run.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// Every uid for `process` instances is taken.
    #[error("every uid for process instances is in use ({of} of them); stop some instances or run apps with driver \"sandbox\"")]
    NoUid {
        /// How many uids there are.
        of: u32,
    },
    /// The program cannot be run by the unprivileged uid a `process` instance gets.
    #[error("cannot run {what} as uid {uid}: {source}; process instances never run as root, so the program, the app's files and every directory above them must be readable by other users (chmod o+rx), or run the app with driver \"sandbox\"")]
    Unreachable {
        /// What was run.
        what: String,
        /// The instance's uid.
        uid: u32,
        /// Why.
        source: std::io::Error,
    },
    /// A step of preparing a sandbox failed.
    #[error("cannot {what}: {source}")]
    Sandbox {
        /// The step.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The sandbox's network could not be had.
    #[error(transparent)]
    Bridge(#[from] BridgeError),
    /// The release's slug is not on this node and could not be fetched.
    #[error(transparent)]
    Slug(#[from] warden_slugs::SlugError),
    /// The sandbox's cgroups could not be set up.
    #[error("cannot set up the instance's cgroup: {0}")]
    Cgroup(#[from] CgroupError),
    /// The app's environment breaks the rule every API route applies; change it with `warden
    /// apps update` or `warden config`.
    #[error("the app's environment cannot be passed: {0}; fix it with `warden config` or `warden apps update`")]
    Env(#[from] warden_core::model::EnvError),
    /// The app's database could not be reached for the instance.
    #[error("cannot give the instance its database: {0}")]
    Data(#[from] warden_core::data::DataError),
}

impl LaunchError {
    /// Whether a limit of this node stopped the start (no free uid, port or sandbox address):
    /// another node may have room, and this one once an instance stops.
    pub(crate) fn is_a_node_limit(&self) -> bool {
        matches!(
            self,
            Self::NoUid { .. } | Self::NoPort(_) | Self::Bridge(BridgeError::Full { .. })
        )
    }

    /// What to add to the error for its operator: where to look. A data failure is the data
    /// server's, whose own error says it all.
    pub(crate) fn advice(&self) -> &'static str {
        match self {
            Self::Data(_) => "",
            _ => "; check the app's command and workdir",
        }
    }

    /// Whether the app's own command is at fault (missing, not executable, unreachable by its
    /// uid), rather than the node.
    pub(crate) fn is_the_apps(&self) -> bool {
        match self {
            Self::NotFound { .. } | Self::Unreachable { .. } | Self::Env(_) => true,
            Self::Spawn { source, .. } => matches!(
                source.raw_os_error(),
                Some(libc::ENOENT | libc::EACCES | libc::ENOEXEC | libc::ENOTDIR)
            ),
            _ => false,
        }
    }
}

/// The environment every instance of `spec` gets, but for its label and port; refused when the
/// spec's own does not pass the rule every API route applies (a spec stored before the rule).
pub(crate) fn base_env(spec: &AppSpec, id: &str) -> Result<BTreeMap<String, String>, LaunchError> {
    warden_core::model::validate_env(&spec.env)?;
    let mut env = spec.env.clone();
    env.insert("WARDEN_APP".into(), spec.name.clone());
    env.insert("WARDEN_INSTANCE".into(), id.to_owned());
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_environment_that_breaks_the_rule_starts_nothing() {
        let mut spec = AppSpec::new("demo", vec!["./demo".into()]);
        spec.env.insert("GREETING".into(), "hi".into());
        assert!(base_env(&spec, "i1").is_ok());
        for (k, v) in [
            ("A=B", "1"),
            ("TOKEN", "a\0b"),
            ("WARDEN_INSTANCE_SECRET", "x"),
        ] {
            let mut bad = spec.clone();
            bad.env.insert(k.into(), v.into());
            let err = base_env(&bad, "i1").expect_err(k);
            assert!(matches!(err, LaunchError::Env(_)), "{k}: {err}");
            assert!(err.is_the_apps());
        }
    }
}
