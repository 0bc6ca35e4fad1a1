//! The sandbox and the starting of every instance's processes: the only crate of warden with
//! `unsafe` code besides the binary's allocator and listener, each block with a `SAFETY:`
//! comment.
//!
//! It owns
//! - the sandbox itself: what `warden-instance sandbox-init` builds from a [`Plan`] (see
//!   [`init`]: user, pid, mount, ipc, uts and network namespaces, a read-only view of the
//!   system, a private writable directory, no capabilities and no new privileges, the
//!   `seccomp` filter), the node's [`bridge`] of network mode `bridged`, and the [`cgroup`]s
//!   that enforce an instance's limits;
//! - starting a process for an instance or a build ([`spawn`]: a clean environment, its own
//!   process group, a parent-death signal, no inherited descriptor), the one handle that owns
//!   each such child ([`process::Process`], known to a [`process::Children`] registry that
//!   shutdown ends), and the records that let a later run or the reaper end what a killed
//!   warden left ([`leftovers`]);
//! - the images it runs ([`image`]) and the connection hand-over from a sandbox's init to the
//!   gateway ([`connect`]).
//!
//! It must not touch the store, instance records, slugs or anything of routing: what to run,
//! for whom and when is the agent's (its `drivers/` turn a launch into a [`Plan`] or a
//! command and call in here). The `warden-instance` image links this crate and not the agent.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use warden_core::{Limits, INSTANCE_PATH};

pub mod bridge;
pub mod cgroup;
pub mod image;
pub mod init;
pub mod leftovers;
mod net;
pub mod process;

mod seccomp;
pub mod sock_diag;
pub mod spawn;
mod spread;

pub use net::{connect, control_byte, drain_control};

/// The port an app listens on inside its own network namespace: every sandbox has its own
/// loopback, so there is no port to race for.
pub const SANDBOX_PORT: u16 = 8080;

/// Where the app finds its private writable directory inside the sandbox.
pub const DATA_MOUNT: &str = "/data";

/// What `sandbox-init` builds, written by the agent to `plan.json` in the instance directory.
#[derive(Debug, Serialize, Deserialize)]
pub struct Plan {
    /// Absolute program path, then arguments.
    pub argv: Vec<String>,
    /// The app's whole environment.
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox.
    pub workdir: Option<String>,
    /// Port the app listens on inside.
    pub port: u16,
    /// Limits.
    pub limits: Limits,
    /// Host name inside.
    pub hostname: String,
    /// The veth wiring in network mode `bridged`; none in `isolated`.
    #[serde(default)]
    pub bridged: Option<bridge::BridgedPlan>,
    /// `cgroup.procs` files the sandbox's outer process joins before anything runs inside.
    #[serde(default)]
    pub cgroup_procs: Vec<PathBuf>,
    /// The limits those cgroups enforce; the others are left to rlimits.
    #[serde(default)]
    pub enforced: cgroup::Enforced,
    /// The app may use io_uring.
    #[serde(default)]
    pub io_uring: bool,
    /// A build rather than an instance: the workdir (the slug being built) is writable and the
    /// host's network is shared, so that package managers reach their registries.
    #[serde(default)]
    pub build: bool,
    /// A one-off process attached to a client (`warden run`): the Unix socket, as the sandbox
    /// sees it, that the app connects to as its stdin instead of /dev/null. Its stdout and
    /// stderr are sandbox-init's own, which the agent makes pipes.
    #[serde(default)]
    pub stdin: Option<String>,
    /// The app listens on `port`: init tells the agent on the control socket
    /// ([`LISTENING`]) as soon as it accepts, so that no start waits for the next of the
    /// agent's polls. False for a process that listens on nothing (`worker`) and for builds.
    #[serde(default)]
    pub announce_listening: bool,
}

/// The start message the agent sends a prepared sandbox on its control socket: the part of the
/// app's environment that is only known when a request needs the instance.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Go {
    /// Added to (and overriding) the plan's environment.
    pub env: BTreeMap<String, String>,
}

/// Byte init writes on the control socket once the sandbox is prepared.
pub const PREPARED: u8 = b'r';

/// Byte init writes on the control socket once the app accepts connections on its port (with
/// [`Plan::announce_listening`]). It never comes if the app exits first or does not accept
/// within [`init::ANNOUNCE_FOR`]; the agent's own slower polls see such an app. It comes with
/// the connection init's probe made to the app (SCM_RIGHTS; [`control_byte`] reads both).
pub const LISTENING: u8 = b'l';

/// Name of the plan file in the instance directory.
pub const PLAN_FILE: &str = "plan.json";
/// Name of the connection-handing socket in the instance directory.
pub const CONN_SOCKET: &str = "conn.sock";
/// Name of the app's writable directory in the instance directory.
pub const DATA_DIR: &str = "data";

/// Whether this node can create a user namespace, the first step of every sandbox: asked of a
/// short-lived child (the warden binary printing its version), so warden's own namespaces are
/// never touched.
pub fn user_namespaces() -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = image::own_image()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and only calls unshare(2),
    // which is async-signal-safe; it allocates nothing and touches no locks.
    unsafe {
        cmd.pre_exec(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).map_err(std::io::Error::from)
        });
    }
    let status = cmd.status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "the check exited with {status}"
        )))
    }
}

/// The bytes of a start message.
pub fn go_message(env: BTreeMap<String, String>) -> Vec<u8> {
    serde_json::to_vec(&Go { env }).unwrap_or_default()
}

/// Why a program could not be found to run in a sandbox.
#[derive(Debug, thiserror::Error)]
#[error("program {program:?} not found (looked in the workdir or {search})")]
pub struct NotFound {
    /// The program as the spec names it.
    pub program: String,
    /// The PATH searched.
    pub search: &'static str,
}

/// Writes `bytes` to `path`, readable by warden alone.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

/// The absolute path of the program: as given if absolute, under the workdir if relative with a
/// slash, else searched in the instance PATH.
pub fn resolve_program(program: &str, workdir: Option<&str>) -> Result<PathBuf, NotFound> {
    let candidates: Vec<PathBuf> = if program.starts_with('/') {
        vec![PathBuf::from(program)]
    } else if program.contains('/') {
        let base = workdir
            .map(PathBuf::from)
            .unwrap_or_else(|| std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")));
        vec![base.join(program)]
    } else {
        INSTANCE_PATH
            .split(':')
            .map(|d| Path::new(d).join(program))
            .collect()
    };
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| NotFound {
            program: program.to_owned(),
            search: INSTANCE_PATH,
        })
}

/// Locks `m`. A panic while holding one of these locks leaves plain maps and counters behind,
/// still usable, so a poisoned lock is taken as it is.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
