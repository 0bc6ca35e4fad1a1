//! One slot of the slot pool: a sandbox prepared up to the point where only the app is
//! missing, waiting in `sandbox-init` for its start message.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use nix::sys::signal::Signal;
use warden_sandbox::process::Process;

use crate::drivers::launch::{Held, LaunchError, Started};
use crate::drivers::sandbox::SandboxHeld;

/// A prepared sandbox waiting for its app.
pub(crate) struct Slot {
    /// The id the instance will have; its directory and log are already named after it.
    pub id: String,
    pub(super) log: PathBuf,
    pub(super) fingerprint: String,
    pub(super) child: Process,
    pub(super) addr: warden_core::InstanceAddr,
    pub(super) control: std::os::unix::net::UnixStream,
    /// Set once `sandbox-init` said the sandbox is prepared.
    pub(super) prepared: Arc<AtomicBool>,
    pub(super) held: SandboxHeld,
}

// === impl Slot ===

impl Slot {
    /// Sends the start message: the app starts in the prepared sandbox.
    pub(crate) fn go(
        mut self,
        env: std::collections::BTreeMap<String, String>,
    ) -> Result<Started, LaunchError> {
        let sent = self
            .control
            .write_all(&warden_sandbox::go_message(env))
            .and_then(|()| self.control.shutdown(std::net::Shutdown::Write));
        if let Err(source) = sent {
            self.kill();
            return Err(LaunchError::Sandbox {
                what: "send the prepared sandbox its start message",
                source,
            });
        }
        // The app's process, woken by the message, is queued on this thread's CPU (a socket
        // write wakes its reader as one the writer is about to hand the CPU to), and would
        // wait there until this thread blocks: 0.15 ms of a slot start, as the start goes on
        // here with its records, log line and tasks (perf trace). Giving way lets it read the
        // message and exec now, and the kernel moves it to the idlest CPU at its exec; this
        // thread is back within about 0.1 ms. Message to exec: 0.27 -> 0.11-0.14 ms
        // (docs/BENCHMARKS.md).
        std::thread::yield_now();
        // Init's word that the app accepts comes on the control socket, once the slot's own
        // watch has read the "prepared" byte there (a slot taken before that is polled).
        let listening = self
            .prepared
            .load(std::sync::atomic::Ordering::Acquire)
            .then(|| self.control.try_clone().ok())
            .flatten();
        let mut held = self.held;
        held.control = Some(self.control);
        Ok(Started {
            child: self.child,
            addr: self.addr,
            held: Some(Box::new(held)),
            listening,
            owner: None,
        })
    }

    /// Whether its sandbox still runs.
    pub(super) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub(super) fn kill(&self) {
        self.child.signal(Signal::SIGKILL);
    }

    /// Kills the sandbox and removes its files once it is gone; `dir` is its instance directory.
    pub(super) fn discard(self, dir: PathBuf) {
        self.kill();
        let _ = std::fs::remove_file(&self.log);
        let Slot {
            mut child, held, ..
        } = self;
        // The cgroups can only go once the sandbox's processes are gone.
        tokio::spawn(async move {
            let _ = child.wait().await;
            Box::new(held).release().await;
            crate::drivers::leftovers::remove_instance_dir(&dir);
        });
    }
}
