//! The thread that runs the private server's postmaster: it starts it, starts it again when
//! it exits on its own (killed, crashed) after a bounded backoff, and stops it when told.
//!
//! One thread for the server's whole life, because the parent-death signal (`setpriv
//! --pdeathsig`) fires when the *thread* that forked the child ends: every restart forks from
//! this same thread, so the server still dies with warden and only with warden.

use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// How long a fast shutdown may take before the group is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How often the thread looks whether the server has exited.
const POLL: Duration = Duration::from_millis(200);
/// The first wait before a restart; doubled at each exit in a row, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A server that ran this long before exiting is restarted after [`FIRST_BACKOFF`] again.
const STABLE: Duration = Duration::from_secs(60);

/// Makes the command that starts the server, each time: the log file is opened again and a
/// postmaster.pid left behind is dealt with first.
pub(super) type MakeCommand = Box<dyn FnMut() -> std::io::Result<Command> + Send>;

/// What the keeper tells its server's holder.
#[derive(Default)]
pub(super) struct Status {
    /// The current postmaster's pid; 0 while none runs.
    pid: AtomicU32,
    /// How many times the server has exited on its own.
    exits: AtomicU64,
}

impl Status {
    pub(super) fn pid(&self) -> Option<u32> {
        Some(self.pid.load(Ordering::SeqCst)).filter(|&p| p != 0)
    }

    pub(super) fn exits(&self) -> u64 {
        self.exits.load(Ordering::SeqCst)
    }
}

/// The thread that started the server and keeps it; dropping it (or [`Keeper::stop`]) stops
/// the server.
pub(super) struct Keeper {
    pub(super) status: Arc<Status>,
    /// Dropped or sent to: stop the server.
    stop: mpsc::Sender<()>,
    thread: Option<JoinHandle<()>>,
}

// === impl Keeper ===

impl Keeper {
    /// Spawns the server from a new thread and returns once it is forked (not yet ready).
    pub(super) fn spawn(mut make: MakeCommand) -> std::io::Result<Keeper> {
        let (started_tx, started_rx) = mpsc::channel();
        let (stop, stop_rx) = mpsc::channel::<()>();
        let status = Arc::new(Status::default());
        let status2 = status.clone();
        let thread = std::thread::Builder::new()
            .name("warden-postgres".into())
            .spawn(move || {
                let first = make().and_then(|mut c| c.spawn());
                match first {
                    Ok(child) => {
                        status2.pid.store(child.id(), Ordering::SeqCst);
                        let _ = started_tx.send(Ok(()));
                        keep(child, &mut make, &stop_rx, &status2);
                    }
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                    }
                }
            })?;
        match started_rx.recv() {
            Ok(Ok(())) => Ok(Keeper {
                status,
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(std::io::Error::other(
                "the thread starting postgres panicked",
            )),
        }
    }

    /// Stops the server and waits for it.
    pub(super) fn stop(mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Watches `child` until told to stop; when it exits on its own, starts it again after a
/// backoff that doubles while it keeps exiting, so a server that cannot start costs a start
/// every 30 s at most, never a busy loop.
fn keep(mut child: Child, make: &mut MakeCommand, stop: &mpsc::Receiver<()>, status: &Status) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let began = Instant::now();
        let exit = loop {
            match stop.recv_timeout(POLL) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // Told to stop, or the holder is gone.
                _ => return stop_child(child),
            }
            if exited_unreaped(&child) {
                // Backends of the dead postmaster leave on their own when they notice; any
                // still there would keep its shared memory and stop the next start. Killed
                // while the postmaster is a zombie: until it is reaped its id is still its
                // group's, never another process's.
                let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
                match child.wait() {
                    Ok(exit) => break exit,
                    Err(e) => {
                        tracing::error!(error = %e, "reaping the private PostgreSQL failed");
                        return;
                    }
                }
            }
        };
        status.pid.store(0, Ordering::SeqCst);
        status.exits.fetch_add(1, Ordering::SeqCst);
        if began.elapsed() >= STABLE {
            backoff = FIRST_BACKOFF;
        }
        tracing::error!(
            pid = child.id(),
            %exit,
            retry_in_ms = backoff.as_millis() as u64,
            "the private PostgreSQL exited; starting it again (apps' data requests fail until it is back)"
        );
        // Spawning can fail too (the programs removed, out of processes): wait and retry.
        child = loop {
            match stop.recv_timeout(backoff) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            match make().and_then(|mut c| c.spawn()) {
                Ok(c) => break c,
                Err(e) => tracing::error!(
                    error = %e,
                    retry_in_ms = backoff.as_millis() as u64,
                    "starting the private PostgreSQL again failed"
                ),
            }
        };
        status.pid.store(child.id(), Ordering::SeqCst);
        tracing::warn!(pid = child.id(), "private PostgreSQL started again");
    }
}

/// Whether `child` has exited, leaving it unreaped (a zombie whose id nothing else can take).
fn exited_unreaped(child: &Child) -> bool {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(Pid::from_raw(child.id() as i32)), flags) {
        Ok(WaitStatus::StillAlive) => false,
        Ok(_) => true,
        // Not ours to wait for any more: `wait` says how it ended.
        Err(nix::errno::Errno::ECHILD) => true,
        Err(_) => false,
    }
}

/// SIGINT is PostgreSQL's fast shutdown; past the timeout the whole group is killed.
fn stop_child(mut child: Child) {
    let pid = Pid::from_raw(child.id() as i32);
    let _ = kill(pid, Signal::SIGINT);
    let deadline = Instant::now() + STOP_TIMEOUT;
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    tracing::warn!(
        pid = child.id(),
        "private PostgreSQL did not stop in time; killing it"
    );
    let _ = killpg(pid, Signal::SIGKILL);
    let _ = child.wait();
}
