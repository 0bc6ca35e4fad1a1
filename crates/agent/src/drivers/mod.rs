//! The ways the agent can run an instance, behind one trait (`launch::Driver`): a plain
//! process (`process`) or a sandbox ([`sandbox`]), both spawned through `spawn`.
//!
//! Everything that needs `unsafe` (spawning, the sandbox's own processes, the connection
//! hand-over) is [`warden_sandbox`]'s: the agent has none.

pub(crate) mod attached;
pub(crate) mod data;
pub(crate) mod launch;
pub(crate) mod process;
pub mod sandbox;
pub(crate) mod uids;

pub(crate) use warden_sandbox::{leftovers, spawn};

use std::sync::Arc;

use warden_core::DriverKind;
use warden_sandbox::process::Children;

pub(crate) use launch::{Driver, Launch, LaunchError};

/// The drivers of this node, and which one apps that name none get.
pub(crate) struct Drivers {
    process: process::ProcessDriver,
    sandbox: sandbox::SandboxDriver,
    default: DriverKind,
    /// Why the default is what it is, for the operator.
    why: String,
    /// Derives each instance's secret (see [`warden_core::identity`]).
    identity: warden_core::identity::IdentityKey,
    /// Every child a driver started and nobody reaped yet: instances, slots, builds, trials.
    children: Arc<Children>,
}

// === impl Drivers ===

impl Drivers {
    /// The drivers; the default is the sandbox when this node can make one.
    pub(crate) fn new(
        sandbox: sandbox::SandboxDriver,
        identity: warden_core::identity::IdentityKey,
        children: Arc<Children>,
    ) -> Self {
        let (default, why) = match warden_sandbox::user_namespaces() {
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
            process: process::ProcessDriver::new(children.clone()),
            sandbox,
            default,
            why,
            identity,
            children,
        }
    }

    /// The children the drivers started that are still alive, which shutdown ends.
    pub(crate) fn children(&self) -> &Children {
        &self.children
    }

    /// The driver of apps that name none, and why.
    pub(crate) fn default(&self) -> (DriverKind, &str) {
        (self.default, &self.why)
    }

    /// The environment every instance `id` of `spec` gets, but for its label and port: the
    /// spec's, the app's name, the instance's id and its secret.
    pub(crate) fn base_env(
        &self,
        spec: &warden_core::AppSpec,
        id: &str,
    ) -> Result<std::collections::BTreeMap<String, String>, LaunchError> {
        let mut env = launch::base_env(spec, id)?;
        env.insert(
            warden_core::identity::SECRET_ENV.into(),
            self.identity.instance_secret(id),
        );
        Ok(env)
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
