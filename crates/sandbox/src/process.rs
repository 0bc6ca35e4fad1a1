//! The one handle of a child process warden started (an instance, a slot's sandbox, a build, a
//! trial), and the registry of those alive, which the agent's shutdown ends.
//!
//! A [`Process`] owns the child and its process group: whoever holds it reaps it with
//! [`Process::wait`], and dropping it unreaped (a task cancelled, an early return) kills the
//! whole group at once, so no path forgets one. Every handle is known to its node's
//! [`Children`] until it is dropped, after its owner cleaned up: builds and trials are in no
//! instance table, and a shutdown still finds them and waits for them ([`Children::end_all`]). What a killed warden left is the other
//! path, the records of [`crate::leftovers`] and the reaper.

use std::collections::HashMap;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::process::Child;
use tokio::sync::Notify;

/// The children of one node whose handles live, by the key each handle holds: its process group
/// and whether it is reaped. A handle leaves when dropped, not when reaped: its owner still
/// cleans up after the exit (a sandbox's cgroups go only once everything in it is gone), and
/// the shutdown waits for that too.
#[derive(Debug, Default)]
pub struct Children {
    live: Mutex<HashMap<u64, Entry>>,
    next: AtomicU64,
    /// Set once [`Children::end_all`] began: what ends now was ended by the shutdown.
    ending: AtomicBool,
    /// Woken whenever a child leaves the registry.
    left: Notify,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    pgid: u32,
    reaped: bool,
}

impl Children {
    /// An empty registry.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// How many handles live (their child running, or reaped and its owner not yet done).
    pub fn len(&self) -> usize {
        crate::lock(&self.live).len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the shutdown pass began: a child that ends now was ended by it, not by itself.
    pub fn ending(&self) -> bool {
        self.ending.load(Ordering::Relaxed)
    }

    /// Sends `signal` to process group `pgid` if it is the group of a child of this registry
    /// whose leader has not exited: then its id cannot be another process's. Says whether it
    /// was sent.
    ///
    /// For callers that hold a child's id but not its handle (the agent's table of instances):
    /// a raw `killpg` on an id read before the child's exit could reach whatever took the id
    /// after the child was reaped. Here the check and the signal are one step under the
    /// registry's lock, and [`Process::wait`] marks a child as exited under that lock before
    /// it reaps it.
    pub fn signal(&self, pgid: u32, signal: Signal) -> bool {
        let live = crate::lock(&self.live);
        let alive = live.values().any(|e| e.pgid == pgid && !e.reaped);
        if alive {
            signal_group(pgid, signal);
        }
        alive
    }

    /// Ends every child: SIGTERM to each process group not yet reaped, then waits until every
    /// handle is dropped (its owner done) or `grace` has passed, and sends SIGKILL to the
    /// groups still unreaped. Returns how many handles there were.
    pub async fn end_all(&self, grace: Duration) -> usize {
        self.ending.store(true, Ordering::Relaxed);
        let entries = {
            // Signalled under the lock, as in `signal`: none is reaped meanwhile.
            let live = crate::lock(&self.live);
            for e in live.values().filter(|e| !e.reaped) {
                signal_group(e.pgid, Signal::SIGTERM);
            }
            live.len()
        };
        let all_gone = async {
            loop {
                // Registered before the check: a child leaving in between still wakes us.
                let left = self.left.notified();
                if self.is_empty() {
                    return;
                }
                left.await;
            }
        };
        if tokio::time::timeout(grace, all_gone).await.is_err() {
            // A reaped group is left alone: its id may be another's by now.
            for e in crate::lock(&self.live).values().filter(|e| !e.reaped) {
                signal_group(e.pgid, Signal::SIGKILL);
            }
        }
        entries
    }

    fn add(&self, pgid: u32) -> u64 {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let entry = Entry {
            pgid,
            reaped: false,
        };
        crate::lock(&self.live).insert(key, entry);
        key
    }

    fn reaped(&self, key: u64) {
        if let Some(e) = crate::lock(&self.live).get_mut(&key) {
            e.reaped = true;
        }
    }

    fn remove(&self, key: u64) {
        crate::lock(&self.live).remove(&key);
        self.left.notify_waiters();
    }
}

/// A started child, leader of its own process group. Reap it with [`Process::wait`]; dropped
/// unreaped, it kills the group.
#[derive(Debug)]
pub struct Process {
    child: Child,
    pid: Option<u32>,
    /// A pidfd of the child, readable once it has exited, before it is reaped (see
    /// [`Process::wait`]); `None` where the kernel has no `pidfd_open` (before Linux 5.3).
    pidfd: Option<std::os::fd::OwnedFd>,
    reaped: bool,
    /// The registry it is known to.
    children: Arc<Children>,
    /// Its key there; none when it had no pid to be known by.
    key: Option<u64>,
}

impl Process {
    /// Takes `child` (spawned with `process_group(0)`) into a handle known to `children`.
    pub(crate) fn new(child: Child, children: &Arc<Children>) -> Self {
        let pid = child.id();
        let key = pid.map(|pgid| children.add(pgid));
        // Before anything can reap the child (only its handle does): the pidfd is its own.
        let pidfd = pid.and_then(pidfd_open);
        if pid.is_some() && pidfd.is_none() {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!("pidfd_open failed (a kernel before Linux 5.3?): a child's exit is marked only once it is reaped, so stopping an instance at that moment could signal a process that took its id")
            });
        }
        Self {
            child,
            pid,
            pidfd,
            reaped: pid.is_none(),
            children: children.clone(),
            key,
        }
    }

    /// The process id, which is also its group's; `None` once it has exited (see
    /// [`Process::wait`]).
    pub fn id(&self) -> Option<u32> {
        self.pid.filter(|_| !self.reaped)
    }

    /// Waits for the child to exit and reaps it; the group is left alone from then on (its id
    /// may be handed out again). The exit is marked in the registry before the reap (seen on
    /// the pidfd, while the child is a zombie that still holds its id), so that
    /// [`Children::signal`] never reaches a process that took the id after it.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.exited().await;
        let status = self.child.wait().await;
        if status.is_ok() {
            self.reaped();
        }
        status
    }

    /// Waits until the child has exited, without reaping it (a zombie, it still holds its id),
    /// and marks it exited. Returns at once where there is no pidfd; the caller's reap then
    /// marks it.
    async fn exited(&mut self) {
        use std::os::fd::AsFd;
        use tokio::io::{unix::AsyncFd, Interest};
        let Some(fd) = &self.pidfd else { return };
        // SAFETY: the pidfd is owned by `self` and borrowed for as long as the registration
        // lives (this block), so it stays open and the same description throughout.
        let gone = match unsafe { AsyncFd::register_with_interest(fd.as_fd(), Interest::READABLE) }
        {
            Ok(exit) => exit.readable().await.is_ok(),
            Err(_) => false,
        };
        if gone {
            self.reaped();
        }
    }

    /// The child's exit status if it has exited (reaping it, marked first as in
    /// [`Process::wait`]), `None` while it runs.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if self.pidfd.as_ref().is_some_and(exited_now) {
            self.reaped();
        }
        let status = self.child.try_wait();
        if let Ok(Some(_)) = status {
            self.reaped();
        }
        status
    }

    /// Sends `signal` to the child's whole process group, unless it is reaped.
    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = self.id() {
            signal_group(pid, signal);
        }
    }

    /// Whether the shutdown pass of its registry began (so an end now is the shutdown's).
    pub fn ended_by_shutdown(&self) -> bool {
        self.children.ending()
    }

    /// Marks the child as gone: exited (seen on its pidfd, about to be reaped) or reaped.
    fn reaped(&mut self) {
        self.reaped = true;
        if let Some(key) = self.key {
            self.children.reaped(key);
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if !self.reaped {
            self.signal(Signal::SIGKILL);
            // Tokio reaps it in the background once it is dead.
            let _ = self.child.start_kill();
        }
        if let Some(key) = self.key.take() {
            self.children.remove(key);
        }
    }
}

/// Whether the process of `pidfd` has exited (its pidfd is readable), without waiting.
fn exited_now(pidfd: &std::os::fd::OwnedFd) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1))
}

/// A pidfd of `pid` (close-on-exec, as every pidfd), or `None` where the kernel has none.
fn pidfd_open(pid: u32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the descriptor was just made, and nothing else owns it.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Sends `signal` to the instance's whole process group.
pub fn signal_group(pid: u32, signal: nix::sys::signal::Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(pid: i32) -> bool {
        // A zombie is dead: only its entry waits to be reaped.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(false)
    }

    /// The group's other members, found by their process group in /proc.
    fn members(pgid: u32) -> Vec<i32> {
        std::fs::read_dir("/proc")
            .expect("proc")
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|s| {
                        let rest = s.rsplit(')').next()?.to_owned();
                        rest.split_whitespace().nth(2)?.parse::<u32>().ok()
                    })
                    == Some(pgid)
            })
            .collect()
    }

    async fn wait_until(what: impl Fn() -> bool) -> bool {
        for _ in 0..500 {
            if what() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        what()
    }

    fn start(children: &Arc<Children>, script: &str) -> (Process, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("dir");
        let instance = dir.path().join("0123456789abcdef");
        std::fs::create_dir(&instance).expect("instance dir");
        let argv = ["/bin/sh".into(), "-c".into(), script.into()];
        let cmd = crate::spawn::command(
            &argv,
            &std::collections::BTreeMap::new(),
            &dir.path().join("log"),
        )
        .expect("command");
        let p = crate::spawn::spawn(cmd, &instance, children).expect("spawn");
        (p, dir)
    }

    #[test]
    fn the_registry_signals_a_group_only_while_its_leader_has_not_exited() {
        use std::os::unix::process::CommandExt;
        // A stand-in for a process that took the id of a child after that child was reaped.
        let mut stand_in = std::process::Command::new("sleep")
            .arg("300")
            .process_group(0)
            .spawn()
            .expect("sleep");
        let pgid = stand_in.id();
        let children = Children::new();
        assert!(!children.signal(pgid, Signal::SIGCONT), "no child of ours");
        let key = children.add(pgid);
        assert!(
            children.signal(pgid, Signal::SIGCONT),
            "a child of ours, running"
        );
        children.reaped(key);
        assert!(
            !children.signal(pgid, Signal::SIGKILL),
            "its leader has exited"
        );
        std::thread::sleep(Duration::from_millis(100));
        let status = stand_in.try_wait().expect("try_wait");
        let _ = stand_in.kill();
        let _ = stand_in.wait();
        assert_eq!(status, None, "the group that took the id was signalled");
    }

    #[tokio::test]
    async fn an_exited_child_is_marked_before_it_is_reaped_and_never_signalled_after() {
        let children = Children::new();
        let (mut p, _dir) = start(&children, "exit 3");
        let pgid = p.id().expect("pid");
        assert!(p.pidfd.is_some(), "pidfd_open works here");
        p.exited().await;
        // Still a zombie: its id is not free yet, and the registry already refuses it.
        let stat = std::fs::read_to_string(format!("/proc/{pgid}/stat")).expect("stat");
        assert!(
            stat.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z'),
            "not a zombie: {stat}"
        );
        assert!(!children.signal(pgid, Signal::SIGCONT), "marked as exited");
        let status = p.wait().await.expect("wait");
        assert_eq!(status.code(), Some(3));
        assert_eq!(p.id(), None);
        assert!(!children.signal(pgid, Signal::SIGCONT));
    }

    #[tokio::test]
    async fn dropping_a_running_child_kills_its_whole_group() {
        let children = Children::new();
        // The shell and a grandchild in its group, which outlives the shell unless the group is
        // killed.
        let (p, _dir) = start(&children, "sleep 300 & sleep 300 & wait");
        let pgid = p.id().expect("pid");
        assert!(
            wait_until(|| members(pgid).len() >= 3).await,
            "shell and two sleeps"
        );
        let group = members(pgid);
        assert_eq!(children.len(), 1);
        drop(p);
        assert_eq!(children.len(), 0, "a dropped handle leaves the registry");
        assert!(
            wait_until(|| group.iter().all(|&pid| !alive(pid))).await,
            "still alive: {:?}",
            group.iter().filter(|&&pid| alive(pid)).collect::<Vec<_>>()
        );
    }

    #[tokio::test]
    async fn end_all_terminates_every_group_and_kills_what_stays() {
        let children = Children::new();
        // One ends on SIGTERM; the other ignores it and needs the SIGKILL after the grace.
        let (mut polite, _d1) = start(&children, "sleep 300 & wait");
        let (mut stubborn, _d2) = start(&children, "trap '' TERM; sleep 300 & wait; sleep 300");
        let waits = tokio::spawn(async move {
            let a = polite.wait().await.expect("wait");
            let b = stubborn.wait().await.expect("wait");
            (a, b)
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(children.end_all(Duration::from_millis(500)).await, 2);
        let (a, b) = tokio::time::timeout(Duration::from_secs(10), waits)
            .await
            .expect("both end")
            .expect("task");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(a.signal(), Some(libc::SIGTERM), "{a}");
        assert_eq!(b.signal(), Some(libc::SIGKILL), "{b}");
        assert!(children.is_empty() && children.ending());
    }
}
