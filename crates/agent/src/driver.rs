//! The seam between the agent's bookkeeping and the ways it can run an instance.
//!
//! A driver turns a launch (command, env, limits, a private directory) into a running child
//! and the address the gateway reaches it at. Everything else (records, readiness, reaping,
//! restarts) is the agent's and the same for every driver.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::sandbox::bridge::Bridge;
use crate::sandbox::cgroup::Cgroups;
use crate::sandbox::Held;

use tokio::process::Child;
use warden_core::AppSpec;

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
    /// The node's bridge, for network mode `bridged`.
    pub bridge: &'a Arc<Bridge>,
    /// The node's cgroups, for the sandbox's limits.
    pub cgroups: &'a Cgroups,
}

/// A started instance.
pub(crate) struct Started {
    /// The process whose exit is the instance's exit; signalling its process group stops it.
    pub child: Child,
    /// Where the gateway connects: `host:port`, or `fd+unix:<path>` for a socket that hands
    /// out connections opened inside the instance's own network namespace.
    pub addr: String,
    /// What the instance holds until it is gone (bridge address, cgroups).
    pub held: Held,
}

/// A way to run instances.
pub(crate) trait Driver: Send + Sync {
    /// Starts the instance. The error says what went wrong for the operator.
    fn start(&self, launch: &Launch<'_>) -> Result<Started, String>;
}
