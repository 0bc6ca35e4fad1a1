//! The `process` driver: an app instance is a plain child process listening on a loopback port.
//!
//! Needs no privileges. Isolation is limited to a clean environment, a process group of its
//! own and, when the agent runs as root, an unprivileged uid of its own (`super::uids`) that
//! owns the instance's private directory and nothing else; the instance still shares the
//! host's network, file system view and kernel interface. The `sandbox` driver adds
//! namespaces, seccomp and limits on top of the same spawn.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};

use std::os::unix::fs::PermissionsExt;

use std::sync::Arc;

use warden_sandbox::process::Children;

use super::attached::{Attached, AttachedStdin};
use super::launch::{Driver, Launch, LaunchError, Started};
use super::spawn;
use super::uids::{Lease, Uids};

/// A free loopback port. Another process could take it before the instance binds; the instance
/// then exits at once and the start fails with its message, never a hang.
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// The `process` driver: a plain child process on a loopback port.
pub(crate) struct ProcessDriver {
    /// Uids for instances; `None` when the agent is not root and instances run as its user.
    uids: Option<Uids>,
    /// Where every instance's handle is known until it is reaped.
    children: Arc<Children>,
}

impl ProcessDriver {
    /// The driver; instances never run as root.
    pub(crate) fn new(children: Arc<Children>) -> Self {
        Self {
            uids: nix::unistd::geteuid().is_root().then(Uids::default),
            children,
        }
    }

    /// When root: a uid of the instance's own, which gets its private directory (mode 0700).
    fn own_uid(&self, l: &Launch<'_>) -> Result<Option<Lease>, LaunchError> {
        let Some(uids) = &self.uids else {
            return Ok(None);
        };
        let lease = uids.take().ok_or(LaunchError::NoUid {
            of: super::uids::RANGE,
        })?;
        let uid = lease.uid();
        std::os::unix::fs::chown(l.dir, Some(uid), Some(uid))
            .and_then(|()| std::fs::set_permissions(l.dir, std::fs::Permissions::from_mode(0o700)))
            .map_err(|source| LaunchError::Create {
                path: l.dir.to_owned(),
                source,
            })?;
        Ok(Some(lease))
    }
}

impl Driver for ProcessDriver {
    fn start(&self, l: &Launch<'_>) -> Result<Started, LaunchError> {
        self.start_with(l, None)
    }

    fn start_attached(&self, l: &Launch<'_>, stdio: Attached) -> Result<Started, LaunchError> {
        self.start_with(l, Some(stdio))
    }
}

impl ProcessDriver {
    fn start_with(&self, l: &Launch<'_>, stdio: Option<Attached>) -> Result<Started, LaunchError> {
        let lease = self.own_uid(l)?;
        if let (true, Some(lease), Some(w)) = (l.build, &lease, &l.spec.workdir) {
            warden_slugs::chown_tree(std::path::Path::new(w), lease.uid(), lease.uid()).map_err(
                |source| LaunchError::Create {
                    path: w.into(),
                    source,
                },
            )?;
        }
        let port = free_port().map_err(LaunchError::NoPort)?;
        let mut env = l.env.clone();
        // A process type (`worker`) listens on nothing, so it is told no port.
        if l.spec.listens() {
            env.insert("PORT".into(), port.to_string());
        }
        // Absolute: an app that changes directory must still find it.
        let dir = std::path::absolute(l.dir).unwrap_or_else(|_| l.dir.to_owned());
        env.insert("WARDEN_DATA_DIR".into(), dir.display().to_string());
        // An app that names its own HOME keeps it.
        env.entry("HOME".into())
            .or_insert_with(|| dir.display().to_string());
        let what = || l.spec.command.first().cloned().unwrap_or_default();
        let mut cmd =
            spawn::command(&l.spec.command, &env, l.log).map_err(|source| LaunchError::Spawn {
                what: what(),
                source,
            })?;
        if let Some(dir) = &l.spec.workdir {
            cmd.current_dir(dir);
        }
        if let Some(io) = stdio {
            if let AttachedStdin::Pipe(stdin) = io.stdin {
                cmd.stdin(std::process::Stdio::from(stdin));
            }
            cmd.stdout(std::process::Stdio::from(io.stdout))
                .stderr(std::process::Stdio::from(io.stderr));
        }
        if let Some(lease) = &lease {
            // std drops supplementary groups (setgroups(0)) before setuid when it runs as root.
            cmd.uid(lease.uid()).gid(lease.uid());
        }
        let child = spawn::spawn(cmd, l.dir, &self.children).map_err(|source| match &lease {
            Some(lease) if source.kind() == std::io::ErrorKind::PermissionDenied => {
                LaunchError::Unreachable {
                    what: what(),
                    uid: lease.uid(),
                    source,
                }
            }
            _ => LaunchError::Spawn {
                what: what(),
                source,
            },
        })?;
        let owner = match &lease {
            Some(lease) => lease.uid(),
            None => nix::unistd::geteuid().as_raw(),
        };
        Ok(Started {
            child,
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)).into(),
            held: lease.map(|l| Box::new(l) as Box<dyn super::launch::Held>),
            listening: None,
            owner: Some(owner),
        })
    }
}
