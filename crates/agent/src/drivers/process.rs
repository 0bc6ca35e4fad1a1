//! The `process` driver: an app instance is a plain child process listening on a loopback port.
//!
//! Needs no privileges. Isolation is limited to a clean environment and a process group of its
//! own; the `sandbox` driver adds namespaces, seccomp and limits on top of the same spawn.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};

use super::launch::{Driver, Launch, LaunchError, Started};
use super::spawn;

/// A free loopback port. Another process could take it before the instance binds; the instance
/// then exits at once and the start fails with its message, never a hang.
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// The `process` driver: a plain child process on a loopback port.
pub(crate) struct ProcessDriver;

impl Driver for ProcessDriver {
    fn start(&self, l: &Launch<'_>) -> Result<Started, LaunchError> {
        let port = free_port().map_err(LaunchError::NoPort)?;
        let mut env = l.env.clone();
        env.insert("PORT".into(), port.to_string());
        env.insert("WARDEN_DATA_DIR".into(), l.dir.display().to_string());
        let what = || l.spec.command.first().cloned().unwrap_or_default();
        let mut cmd =
            spawn::command(&l.spec.command, &env, l.log).map_err(|source| LaunchError::Spawn {
                what: what(),
                source,
            })?;
        if let Some(dir) = &l.spec.workdir {
            cmd.current_dir(dir);
        }
        let child = spawn::spawn(cmd).map_err(|source| LaunchError::Spawn {
            what: what(),
            source,
        })?;
        Ok(Started {
            child,
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)).to_string(),
            held: None,
        })
    }
}
