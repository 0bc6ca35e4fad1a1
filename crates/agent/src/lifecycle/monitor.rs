//! An instance's process once started: its monitor reaps it, and cleans up whenever it exits
//! (its log's note of an out-of-memory kill, its records, its cgroups), and reports an exit the
//! agent did not ask for as a crash.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::{oneshot, watch};
use warden_core::{data::DataSocket, InstanceRecord, InstanceState};

use super::Lifecycle;
use crate::drivers::launch::Held;
use crate::logs;

/// Owns an instance's process: reaps it and cleans up whenever it exits.
pub(super) struct Monitor {
    pub(super) record: InstanceRecord,
    pub(super) child: warden_sandbox::process::Process,
    pub(super) held: Option<Box<dyn Held>>,
    pub(super) stopping: Arc<AtomicBool>,
    pub(super) status: oneshot::Sender<String>,
    pub(super) exited: watch::Sender<bool>,
    /// The instance's database socket: dropped with the monitor once the instance is reaped,
    /// which closes it and every connection made through it.
    pub(super) _data: Option<DataSocket>,
}

impl Monitor {
    pub(super) async fn run(mut self, life: Arc<Lifecycle>) {
        let r = &self.record;
        let (mut status, clean) = match self.child.wait().await {
            Ok(s) => (s.to_string(), s.success()),
            Err(e) => (format!("wait failed: {e}"), false),
        };
        let log: PathBuf = life.deps.paths.log(&r.app, &r.id);
        // A kill by the out-of-memory killer is told where the operator looks.
        if let Some(oom) = self.held.as_ref().and_then(|h| h.oom_note()) {
            logs::append(&log, &format!("warden: {oom}"));
            tracing::warn!("{oom}");
            life.deps.metrics.oom_killed(&r.app);
            status = format!("{status}; {oom}");
        }
        let _ = self.status.send(status.clone());
        let state = life.forget(r, &status).await;
        // Unroutable now: its address may be handed out again and its cgroups go (which can
        // wait for the kernel), before anyone waiting for the exit hears of it.
        if let Some(held) = self.held {
            held.release().await;
        }
        // Every exit the agent did not ask for is a crash of the instance's (app, label,
        // owner), whoever started it: the next start for it waits out the backoff. But for a
        // per-request instance that served and ended cleanly: it may end with its request.
        let served_its_request = r.lifetime == warden_core::Lifetime::PerRequest
            && clean
            && state == Some(InstanceState::Ready);
        if !self.stopping.load(Ordering::Relaxed) && !served_its_request {
            let tail = logs::tail(&log, logs::TAIL_LINES);
            life.deps
                .restarts
                .crashed(&r.app, &r.label, r.user_key(), &r.id, &status, &tail);
        }
        let _ = self.exited.send(true);
    }
}
