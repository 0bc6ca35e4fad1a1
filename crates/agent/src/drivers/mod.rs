//! The ways the agent can run an instance, behind one trait (`launch::Driver`): a plain
//! process (`process`) or a sandbox ([`sandbox`]), both spawned through `spawn`.
//!
//! Only this module and `crate::net` use `unsafe`, each block with a `SAFETY:` comment.

pub(crate) mod launch;
pub(crate) mod process;
pub mod sandbox;
pub(crate) mod spawn;

use warden_core::DriverKind;

pub(crate) use launch::{base_env, Driver, Launch, LaunchError};

/// The drivers of this node, and which one apps that name none get.
pub(crate) struct Drivers {
    process: process::ProcessDriver,
    sandbox: sandbox::SandboxDriver,
    default: DriverKind,
    /// Why the default is what it is, for the operator.
    why: String,
}

// === impl Drivers ===

impl Drivers {
    /// The drivers; the default is the sandbox when this node can make one.
    pub(crate) fn new(sandbox: sandbox::SandboxDriver) -> Self {
        let (default, why) = match sandbox::user_namespaces() {
            Ok(()) => (
                DriverKind::Sandbox,
                "this node can create user namespaces".to_owned(),
            ),
            Err(e) => (
                DriverKind::Process,
                format!("this node cannot create user namespaces ({e}); allow them (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0) or run warden as root to isolate apps"),
            ),
        };
        Self {
            process: process::ProcessDriver,
            sandbox,
            default,
            why,
        }
    }

    /// The driver of apps that name none, and why.
    pub(crate) fn default(&self) -> (DriverKind, &str) {
        (self.default, &self.why)
    }

    /// The driver of `kind`.
    pub(crate) fn get(&self, kind: DriverKind) -> &dyn Driver {
        match kind {
            DriverKind::Process => &self.process,
            DriverKind::Sandbox => &self.sandbox,
        }
    }

    /// The sandbox driver, which the slot pool prepares sandboxes with.
    pub(crate) fn sandbox(&self) -> &sandbox::SandboxDriver {
        &self.sandbox
    }
}
