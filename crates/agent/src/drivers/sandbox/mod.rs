//! The `sandbox` driver: each instance in its own user, pid, mount, ipc, uts and network
//! namespaces, with a read-only view of the system, a private writable directory, no
//! capabilities and no new privileges, a seccomp filter and resource limits.
//!
//! The agent writes a plan into the instance's directory and starts `warden-instance
//! sandbox-init` (see [`init`]; the instance image, held open as `drivers/image.rs`
//! says), which builds the sandbox and execs the app inside it. Network mode is
//! `isolated`: the namespace has only loopback, and the gateway reaches the app through the
//! connection-handing socket described at [`crate::connect`]. Network mode `bridged` adds a
//! veth pair on the node's bridge (see [`bridge`]). Memory, process and CPU limits are cgroups
//! where the node can use them (see [`cgroup`]) and rlimits otherwise.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use warden_core::{Limits, NetworkMode};

use super::launch::{self, Driver, Launch, LaunchError, Started};
use super::spawn::{self, INSTANCE_PATH};

pub mod bridge;
pub mod cgroup;
pub mod init;
mod seccomp;
mod spread;

/// The port an app listens on inside its own network namespace: every sandbox has its own
/// loopback, so there is no port to race for.
pub const SANDBOX_PORT: u16 = 8080;

/// Where the app finds its private writable directory inside the sandbox.
pub const DATA_MOUNT: &str = "/data";

/// What `sandbox-init` builds, written by the agent to `plan.json` in the instance directory.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Plan {
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
}

/// What a sandbox holds on the node until its process is reaped: a bridge address and its
/// cgroups.
#[derive(Default)]
pub(crate) struct SandboxHeld {
    pub lease: Option<bridge::AddrLease>,
    pub cgroup: Option<cgroup::InstanceCgroup>,
    /// The agent's end of the control socket, shut for writing once the start message is
    /// sent. Closing it while init's "prepared" byte sits unread in it would reset init's end
    /// (Unix sockets do), and init could lose the start message it was reading.
    pub control: Option<std::os::unix::net::UnixStream>,
}

impl launch::Held for SandboxHeld {
    fn oom_note(&self) -> Option<String> {
        self.cgroup.as_ref()?.oom_note()
    }

    /// The address is free again and the cgroups are removed (which can wait for the kernel).
    fn release(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            let Self {
                lease,
                cgroup,
                control,
            } = *self;
            drop(lease);
            drop(control);
            if let Some(cgroup) = cgroup {
                let _ = tokio::task::spawn_blocking(move || {
                    cgroup.release(std::time::Duration::from_secs(2))
                })
                .await;
            }
        })
    }
}

/// The start message the agent sends a prepared sandbox on its control socket: the part of the
/// app's environment that is only known when a request needs the instance.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Go {
    /// Added to (and overriding) the plan's environment.
    pub env: BTreeMap<String, String>,
}

/// Byte init writes on the control socket once the sandbox is prepared.
pub(crate) const PREPARED: u8 = b'r';

/// Name of the plan file in the instance directory.
pub(crate) const PLAN_FILE: &str = "plan.json";
/// Name of the connection-handing socket in the instance directory.
pub(crate) const CONN_SOCKET: &str = "conn.sock";
/// Name of the app's writable directory in the instance directory.
pub(crate) const DATA_DIR: &str = "data";

/// A sandbox being prepared or prepared: namespaces, mounts and loopback, with the app not yet
/// started. Sending [`Go`] on `control` starts the app; closing it unsent ends the sandbox.
pub(crate) struct Prepared {
    /// The sandbox's outermost process.
    pub child: tokio::process::Child,
    /// Where the gateway connects, as in [`Started`].
    pub addr: warden_core::InstanceAddr,
    /// The agent's end of the control socket (init's stdin).
    pub control: std::os::unix::net::UnixStream,
    /// The sandbox's bridge address and cgroups, held until it is gone.
    pub held: SandboxHeld,
}

/// Whether this node can create a user namespace, the first step of every sandbox: asked of a
/// short-lived child (the warden binary printing its version), so warden's own namespaces are
/// never touched.
pub(crate) fn user_namespaces() -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = crate::drivers::image::own_image()?;
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
pub(crate) fn go_message(env: BTreeMap<String, String>) -> Vec<u8> {
    serde_json::to_vec(&Go { env }).unwrap_or_default()
}

/// The `sandbox` driver, with what sandboxes of this node share: the bridge of network
/// `bridged` and the node's cgroup setup.
pub(crate) struct SandboxDriver {
    bridge: Arc<bridge::Bridge>,
    cgroups: cgroup::Cgroups,
}

// === impl SandboxDriver ===

impl SandboxDriver {
    pub(crate) fn new(bridge: bridge::BridgeConfig, cgroups: cgroup::Cgroups) -> Self {
        Self {
            bridge: bridge::Bridge::new(bridge),
            cgroups,
        }
    }

    /// What enforces sandbox limits on this node, in words.
    pub(crate) fn limits(&self) -> &str {
        self.cgroups.summary()
    }

    /// Removes what the node set up for sandboxes: the bridge if it made it, its cgroups.
    pub(crate) fn shutdown(&self) {
        self.bridge.remove_if_created();
        self.cgroups.remove();
    }

    /// Starts `warden-instance sandbox-init` for `l` and returns while it prepares. `l.env` is the part of
    /// the environment known now; the rest comes with the start message.
    pub(crate) fn prepare(&self, l: &Launch<'_>) -> Result<Prepared, LaunchError> {
        let first = l.spec.command.first().map_or("", String::as_str);
        let program = resolve_program(first, l.spec.workdir.as_deref())?;
        let mut argv: Vec<String> = l
            .spec
            .command
            .iter()
            .map(|a| crate::drivers::spawn::expand_port(a, &SANDBOX_PORT.to_string()))
            .collect();
        argv[0] = program.display().to_string();
        let mut env = l.env.clone();
        env.insert("PORT".into(), SANDBOX_PORT.to_string());
        env.insert("WARDEN_DATA_DIR".into(), DATA_MOUNT.into());
        env.insert("HOME".into(), DATA_MOUNT.into());
        env.insert("TMPDIR".into(), "/tmp".into());
        // A release's PATH names its slug's own bin directories, which the sandbox shows.
        env.entry("PATH".into())
            .or_insert_with(|| INSTANCE_PATH.into());
        let lease = match l.spec.network {
            NetworkMode::Isolated => None,
            NetworkMode::Bridged => Some(self.bridge.lease()?),
        };
        if let Some(lease) = &lease {
            env.insert("WARDEN_NETWORK_ADDR".into(), lease.plan.addr.to_string());
        }
        if l.build {
            if let Some(w) = &l.spec.workdir {
                // Init derives the ids from its working directory, the instance directory as
                // the kernel names it.
                let dir = std::fs::canonicalize(l.dir).unwrap_or_else(|_| l.dir.to_owned());
                let (uid, gid) = init::host_ids(&dir, nix::unistd::geteuid().is_root());
                warden_slugs::chown_tree(Path::new(w), uid, gid).map_err(|source| {
                    LaunchError::Sandbox {
                        what: "give the build its directory",
                        source,
                    }
                })?;
            }
        }
        let data = l.dir.join(DATA_DIR);
        std::fs::create_dir_all(&data).map_err(|source| LaunchError::Create {
            path: data.clone(),
            source,
        })?;
        let id = l
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let cgroup = self.cgroups.create(&id, &l.spec.limits)?;
        let enforced = cgroup.as_ref().map(|c| c.enforced).unwrap_or_default();
        if l.spec.limits.millicpus > 0 && !enforced.cpu {
            warden_core::log_limited!(warn, app = %l.spec.name, cgroups = self.cgroups.summary(), "the app's millicpus cap is not enforced: this node does not use the cpu cgroup controller");
        }
        let plan = Plan {
            argv,
            env,
            workdir: l.spec.workdir.clone(),
            port: SANDBOX_PORT,
            limits: l.spec.limits,
            hostname: "sandbox".into(),
            bridged: lease.as_ref().map(|l| l.plan.clone()),
            cgroup_procs: cgroup.as_ref().map(|c| c.procs_files()).unwrap_or_default(),
            enforced,
            io_uring: l.spec.io_uring,
            build: l.build,
        };
        let held = SandboxHeld {
            lease,
            cgroup,
            control: None,
        };
        let json = serde_json::to_vec(&plan).map_err(|e| LaunchError::Sandbox {
            what: "encode the sandbox plan",
            source: e.into(),
        })?;
        write_private(&l.dir.join(PLAN_FILE), &json).map_err(|source| LaunchError::Sandbox {
            what: "write the sandbox plan",
            source,
        })?;
        let exe = crate::drivers::image::instance_image().map_err(|e| LaunchError::Sandbox {
            what: "find the instance image to run sandbox-init",
            source: std::io::Error::other(e),
        })?;
        // Pid 1 of the sandbox keeps this command line, and the app can read it: nothing of
        // the host's (no path of the binary or of the instance) goes in. sandbox-init finds its
        // instance directory as its working directory.
        let argv = [exe.display().to_string(), "sandbox-init".into()];
        let (control, theirs) =
            std::os::unix::net::UnixStream::pair().map_err(|source| LaunchError::Sandbox {
                what: "create the sandbox's control socket",
                source,
            })?;
        let spawn_error = |source| LaunchError::Spawn {
            what: "warden-instance sandbox-init".into(),
            source,
        };
        let mut cmd = spawn::command(&argv, &BTreeMap::new(), l.log).map_err(spawn_error)?;
        cmd.arg0("warden")
            .current_dir(l.dir)
            .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
                theirs,
            )));
        let child = spawn::spawn(cmd, l.dir).map_err(spawn_error)?;
        Ok(Prepared {
            child,
            addr: warden_core::InstanceAddr::fd_unix(l.dir.join(CONN_SOCKET)),
            control,
            held,
        })
    }
}

impl Driver for SandboxDriver {
    fn start(&self, l: &Launch<'_>) -> Result<Started, LaunchError> {
        use std::io::Write;
        let Prepared {
            child,
            addr,
            mut control,
            mut held,
        } = self.prepare(l)?;
        // Everything is known now: the message waits in the socket until init reads it. It is
        // far smaller than a socket buffer, so this write does not block.
        control
            .write_all(&go_message(BTreeMap::new()))
            .and_then(|()| control.shutdown(std::net::Shutdown::Write))
            .map_err(|source| LaunchError::Sandbox {
                what: "send the sandbox its start message",
                source,
            })?;
        held.control = Some(control);
        Ok(Started {
            child,
            addr,
            held: Some(Box::new(held)),
        })
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
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
fn resolve_program(program: &str, workdir: Option<&str>) -> Result<PathBuf, LaunchError> {
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
        .ok_or_else(|| LaunchError::NotFound {
            program: program.to_owned(),
            search: INSTANCE_PATH,
        })
}
