//! The `sandbox` driver: turns a launch into a [`Plan`] and starts `warden-instance
//! sandbox-init` on it through [`warden_sandbox`], which builds the sandbox (namespaces,
//! mounts, seccomp, limits: see its documentation). Network mode `isolated` has only loopback
//! and the gateway reaches the app through the connection-handing socket
//! ([`warden_sandbox::connect`]); `bridged` adds a veth pair on the node's bridge
//! ([`bridge`]). What an instance holds until it is reaped (its bridge address, cgroups) is
//! released through `launch::Held`.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use warden_core::{NetworkMode, INSTANCE_PATH};
pub use warden_sandbox::{bridge, cgroup};
use warden_sandbox::{
    go_message, init, resolve_program, spawn, write_private, Plan, CONN_SOCKET, DATA_DIR,
    DATA_MOUNT, PLAN_FILE, SANDBOX_PORT,
};

use warden_sandbox::process::{Children, Process};

use super::attached::{Attached, AttachedStdin};
use super::launch::{self, Driver, Launch, LaunchError, Started};

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

/// A sandbox being prepared or prepared: namespaces, mounts and loopback, with the app not yet
/// started. Sending [`Go`] on `control` starts the app; closing it unsent ends the sandbox.
pub(crate) struct Prepared {
    /// The sandbox's outermost process.
    pub child: Process,
    /// Where the gateway connects, as in [`Started`].
    pub addr: warden_core::InstanceAddr,
    /// The agent's end of the control socket (init's stdin).
    pub control: std::os::unix::net::UnixStream,
    /// The sandbox's bridge address and cgroups, held until it is gone.
    pub held: SandboxHeld,
}

/// The `sandbox` driver, with what sandboxes of this node share: the bridge of network
/// `bridged` and the node's cgroup setup.
pub(crate) struct SandboxDriver {
    bridge: Arc<bridge::Bridge>,
    cgroups: cgroup::Cgroups,
    /// Where every sandbox's handle is known until it is reaped.
    children: Arc<Children>,
}

// === impl SandboxDriver ===

impl SandboxDriver {
    pub(crate) fn new(
        bridge: bridge::BridgeConfig,
        cgroups: cgroup::Cgroups,
        children: Arc<Children>,
    ) -> Self {
        Self {
            bridge: bridge::Bridge::new(bridge),
            cgroups,
            children,
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
        self.prepare_with(l, None)
    }

    /// [`SandboxDriver::prepare`], with the app's stdio attached to a client when `stdio` is
    /// given.
    fn prepare_with(
        &self,
        l: &Launch<'_>,
        stdio: Option<Attached>,
    ) -> Result<Prepared, LaunchError> {
        let first = l.spec.command.first().map_or("", String::as_str);
        let program = resolve_program(first, l.spec.workdir.as_deref()).map_err(|e| {
            LaunchError::NotFound {
                program: e.program,
                search: e.search,
            }
        })?;
        let mut argv: Vec<String> = l
            .spec
            .command
            .iter()
            .map(|a| spawn::expand_port(a, &SANDBOX_PORT.to_string()))
            .collect();
        argv[0] = program.display().to_string();
        let mut env = l.env.clone();
        // A process type (`worker`) listens on nothing, so it is told no port.
        if l.spec.listens() {
            env.insert("PORT".into(), SANDBOX_PORT.to_string());
        }
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
            stdin: stdio.as_ref().and_then(|io| match &io.stdin {
                AttachedStdin::Socket(path) => Some(path.clone()),
                AttachedStdin::Pipe(_) => None,
            }),
            announce_listening: l.spec.listens() && !l.build,
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
        let exe = warden_sandbox::image::instance_image().map_err(|e| LaunchError::Sandbox {
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
        if let Some(io) = stdio {
            // sandbox-init's and the helper's own messages go to the client too.
            cmd.stdout(std::process::Stdio::from(io.stdout))
                .stderr(std::process::Stdio::from(io.stderr));
        }
        let child = spawn::spawn_self_tied(cmd, l.dir, &self.children).map_err(spawn_error)?;
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
        self.start_with(l, None)
    }

    fn start_attached(&self, l: &Launch<'_>, stdio: Attached) -> Result<Started, LaunchError> {
        self.start_with(l, Some(stdio))
    }
}

impl SandboxDriver {
    fn start_with(&self, l: &Launch<'_>, stdio: Option<Attached>) -> Result<Started, LaunchError> {
        use std::io::Write;
        let Prepared {
            child,
            addr,
            mut control,
            mut held,
        } = self.prepare_with(l, stdio)?;
        // Everything is known now: the message waits in the socket until the app's process
        // (forked by init, see `warden_sandbox::init`) reads it. It is far smaller than a
        // socket buffer, so this write does not block.
        control
            .write_all(&go_message(BTreeMap::new()))
            .and_then(|()| control.shutdown(std::net::Shutdown::Write))
            .map_err(|source| LaunchError::Sandbox {
                what: "send the sandbox its start message",
                source,
            })?;
        // A copy of the socket to hear init say the app accepts (the plan asked it to).
        let listening = control.try_clone().ok();
        held.control = Some(control);
        Ok(Started {
            child,
            addr,
            held: Some(Box::new(held)),
            listening,
            // A socket in the instance's directory, handed over by its init: no one else's.
            owner: None,
        })
    }
}
