//! How an app's instances run, beside its spec (`app.rs`): the driver, whom an instance serves,
//! its resource limits, how a new one starts, its network and how requests are balanced.

use serde::{Deserialize, Serialize};

/// The network of a sandboxed instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Only loopback: the app reaches nothing, and the gateway reaches it through sockets opened
    /// inside its namespace.
    #[default]
    Isolated,
    /// Also a veth pair on the node's bridge, for apps that need egress. The bridge port is
    /// isolated, so instances do not reach each other. Needs warden to run as root.
    Bridged,
}

/// How a new instance is started when a request needs one (seed 002's JIT, tap pool and AOT).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum StartPath {
    /// Everything is created on the request.
    #[default]
    Jit,
    /// Namespaces, mounts, network and limits are prepared ahead; only the app is started on
    /// the request. Needs the `sandbox` driver.
    Slot,
    /// Instances already run per label; the request takes one and a new spare starts behind it.
    Warm,
}

/// Which driver runs an app's instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum DriverKind {
    /// A child process on a loopback port; needs no privileges, isolates little.
    Process,
    /// Linux namespaces, a read-only system view, seccomp and resource limits; the instance's
    /// network namespace holds only loopback.
    Sandbox,
}

/// Whom one instance serves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Lifetime {
    /// Every user with the instance's label.
    #[default]
    Shared,
    /// One user; never another, even one with the same label.
    PerUser,
    /// One request: the instance is stopped after its response and never reused.
    PerRequest,
}

/// Resource limits of one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Memory in MiB: the cgroup's memory limit (resident memory, files the instance writes
    /// to its tmpfs, no swap) where cgroups are used, else the address-space rlimit.
    #[serde(default = "default_memory_mb")]
    pub memory_mb: u64,
    /// Processes and threads.
    #[serde(default = "default_max_processes")]
    pub processes: u64,
    /// CPU time in seconds over the instance's life; 0 means unlimited.
    #[serde(default)]
    pub cpu_seconds: u64,
    /// CPU rate in thousandths of a core (1000 = one core), enforced by the cpu cgroup
    /// controller where it is used; 0 means uncapped.
    #[serde(default)]
    pub millicpus: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_mb: default_memory_mb(),
            processes: default_max_processes(),
            cpu_seconds: 0,
            millicpus: 0,
        }
    }
}

fn default_memory_mb() -> u64 {
    1024
}

fn default_max_processes() -> u64 {
    64
}

/// Load-balancing policy across the instances of one app and label.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Each instance in turn.
    #[default]
    RoundRobin,
    /// The instance with the fewest requests in flight.
    LeastOutstanding,
}
