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

/// The drivers of this node.
pub(crate) struct Drivers {
    process: process::ProcessDriver,
    sandbox: sandbox::SandboxDriver,
}

// === impl Drivers ===

impl Drivers {
    pub(crate) fn new(sandbox: sandbox::SandboxDriver) -> Self {
        Self {
            process: process::ProcessDriver,
            sandbox,
        }
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
