//! Stopping an instance: marked as stopped by the agent (so its exit is no crash), then
//! signalled by its process group, through the registry of the node's children, which never
//! signals a group whose leader has exited (its id may be another process's by then).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use nix::sys::signal::Signal;
use tokio::sync::watch;

use super::{Lifecycle, STOP_GRACE};
use crate::sync::lock;
use crate::AgentError;

impl Lifecycle {
    /// Stops an instance: SIGTERM to its process group, SIGKILL after a grace period. Returns
    /// once it has exited and its record is gone.
    pub(crate) async fn kill(&self, id: &str) -> Result<(), AgentError> {
        let (pid, mut exited) = self
            .mark_stopping(id)
            .ok_or_else(|| AgentError::UnknownInstance(id.to_owned()))?;
        let children = self.deps.drivers.children();
        children.signal(pid, Signal::SIGTERM);
        if tokio::time::timeout(STOP_GRACE, exited.wait_for(|e| *e))
            .await
            .is_err()
        {
            children.signal(pid, Signal::SIGKILL);
            let _ = exited.wait_for(|e| *e).await;
        }
        Ok(())
    }

    /// Stops `id` in the background.
    pub(crate) fn kill_soon(self: &Arc<Self>, id: String) {
        let me = self.clone();
        tokio::spawn(async move {
            let _ = me.kill(&id).await;
        });
    }

    /// Stops a per-request instance after its request, in the background. It is killed at
    /// once: it has served the one request it was for.
    pub(crate) fn retire(&self, id: &str) {
        if let Some((pid, _)) = self.mark_stopping(id) {
            self.deps.drivers.children().signal(pid, Signal::SIGKILL);
        }
    }

    /// Marks an instance as stopped by the agent (so its exit is no crash); its pid and exit
    /// signal, or None if it is not running here.
    fn mark_stopping(&self, id: &str) -> Option<(u32, watch::Receiver<bool>)> {
        let table = lock(&self.table);
        let r = table.running.get(id)?;
        r.stopping.store(true, Ordering::Relaxed);
        Some((r.record.pid, r.exited.clone()))
    }
}
