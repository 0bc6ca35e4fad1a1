//! Waiting until a new instance is ready: it accepts a connection and, when the app names a
//! health path, answers it 2xx or 3xx; or, for a process type that listens on nothing
//! (`worker:`), it started and is still running a moment later.

use std::time::Duration;

use tokio::sync::watch;
use warden_core::InstanceAddr;

use super::health;
use super::peer_owner::Check;

/// How long readiness is polled every millisecond before the polls back off.
const FAST_POLL: Duration = Duration::from_millis(100);

/// How a wait for readiness ended.
pub(crate) enum Ready {
    Yes,
    Exited,
    /// What was still missing.
    TimedOut(String),
    /// The connection was taken by a socket of another uid than the instance's: a process
    /// that bound the instance's port before the app did.
    Foreign(String),
}

/// How long an instance that listens on nothing must keep running to count as started: long
/// enough that a command that fails at once (a typo, a missing module) is seen to fail.
const SETTLE: Duration = Duration::from_millis(500);

/// Waits until an instance that listens on nothing (a process type such as `worker`) is
/// ready: still running [`SETTLE`] after it started (or `timeout`, when shorter); `Exited` if
/// it ended first.
pub(crate) async fn wait_running(mut exited: watch::Receiver<bool>, timeout: Duration) -> Ready {
    let until = tokio::time::Instant::now() + SETTLE.min(timeout);
    loop {
        if *exited.borrow() {
            return Ready::Exited;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(until) => {
                return if *exited.borrow() { Ready::Exited } else { Ready::Yes };
            }
            changed = exited.changed() => {
                // The monitor is gone without saying: the process is.
                if changed.is_err() {
                    return Ready::Exited;
                }
            }
        }
    }
}

/// How often readiness is polled once the sandbox's init stopped looking for the app to accept
/// (see [`Listening`]): after `warden_sandbox::init::ANNOUNCE_FOR`. Not before: a poll hands
/// a connection over through init and closes it, on the start's path, and one that meets the
/// app's first `accept` takes the place of init's probe (whose connection the request that
/// waits would use) in an app with one worker.
const POLL_WHILE_TOLD: Duration = Duration::from_millis(50);

/// A sandbox's control socket, on which init says when the app accepts connections
/// (`warden_sandbox::LISTENING`), which it sees within 100 µs of the app's `listen` in the
/// app's first 20 ms, within 250 µs until a second (`init/handover.rs::Announce`): far sooner
/// than a poll through init every millisecond would, and without a poll's cost to a start
/// that shares the machine's cores.
pub(crate) struct Listening {
    control: tokio::net::UnixStream,
    told: bool,
    /// The connection init's probe made to the app, sent with its word: kept only when that
    /// word ends the wait (see [`wait_ready`]).
    first: Option<std::net::TcpStream>,
}

impl Listening {
    /// The agent's end of a started sandbox's control socket, if it can be watched.
    pub(crate) fn new(control: std::os::unix::net::UnixStream) -> Option<Self> {
        control.set_nonblocking(true).ok()?;
        let control = tokio::net::UnixStream::from_std(control).ok()?;
        Some(Self {
            control,
            told: false,
            first: None,
        })
    }

    /// Whether init said the app accepts.
    pub(crate) fn told(&self) -> bool {
        self.told
    }

    /// Drops what init wrote and nobody read (see `warden_sandbox::drain_control`).
    pub(crate) fn drain(&self) {
        use std::os::fd::AsRawFd;
        warden_sandbox::drain_control(self.control.as_raw_fd());
    }

    /// The connection to the app that came with init's word, once.
    pub(crate) fn take_first(&mut self) -> Option<std::net::TcpStream> {
        self.first.take()
    }

    /// Returns once init said the app accepts, or the socket ended (the whole sandbox is gone:
    /// its outer processes hold the socket too, so an init that stops looking after
    /// `ANNOUNCE_FOR` ends nothing, and the agent's polls, which begin then, carry on). Other
    /// bytes (the "prepared" byte of a sandbox started at once) are skipped, a few at most:
    /// init writes no more.
    async fn said(&mut self) {
        for _ in 0..8 {
            match warden_sandbox::control_byte(&self.control).await {
                Ok(Some((warden_sandbox::LISTENING, conn))) => {
                    self.told = true;
                    self.first = conn.map(std::net::TcpStream::from);
                    return;
                }
                Ok(Some(_)) => {}
                _ => return,
            }
        }
    }
}

/// Waits until the app at `addr` is ready, the process exits, or `timeout` passes. Ready means
/// accepting a TCP connection and, when the app names a health path, answering it 2xx or 3xx.
/// With `listening` (a sandbox's init looking for the app to accept), the polls wait for its
/// word instead of asking every millisecond, and with nothing more to ask (no health path, no
/// owner) that word is the answer: `listening` then holds the connection init's probe made
/// ([`Listening::take_first`]). With `owner`, a connection counts only if the kernel says a
/// socket of that uid accepted it (see `peer_owner.rs`).
pub(crate) async fn wait_ready(
    addr: &InstanceAddr,
    owner: Option<u32>,
    health: Option<&str>,
    mut exited: watch::Receiver<bool>,
    timeout: Duration,
    mut listening: Option<&mut Listening>,
) -> Ready {
    let started = tokio::time::Instant::now();
    let deadline = started + timeout;
    let mut pause = Duration::from_millis(1);
    // What the health path said last; `None` until it has answered anything.
    let mut answer: Option<String> = None;
    let mut accepted = false;
    // Told or not, the first look waits for init's word when it will come: an app that
    // already accepts has it waiting on the socket.
    let mut poll_now = listening.is_none();
    loop {
        if *exited.borrow() {
            return Ready::Exited;
        }
        let conn = match poll_now {
            true => warden_sandbox::connect(addr).await.ok(),
            false => None,
        };
        let conn = match (conn, owner) {
            (Some(conn), Some(uid)) => match super::peer_owner::check(&conn, uid) {
                Check::Own => Some(conn),
                Check::Foreign(why) => return Ready::Foreign(why),
                // Nothing listens there any more, or who does cannot be told now: the next
                // look tells.
                Check::Gone | Check::Unknown(_) => None,
            },
            (conn, _) => conn,
        };
        if let Some(conn) = conn {
            let Some(path) = health else {
                return Ready::Yes;
            };
            accepted = true;
            // An app that accepts and never answers must not hold the start past its timeout;
            // a check the deadline cuts short leaves the earlier answer standing.
            match tokio::time::timeout_at(deadline, health::check(conn, path)).await {
                Ok(Ok(status)) if (200..400).contains(&status) => return Ready::Yes,
                Ok(Ok(status)) => answer = Some(format!("answered {status}")),
                Ok(Err(e)) => answer = Some(format!("gave no HTTP answer ({e})")),
                Err(_) => {}
            }
        }
        if tokio::time::Instant::now() >= deadline {
            // Waiting for init's word, the agent may not have looked itself yet: once.
            if !poll_now {
                poll_now = true;
                continue;
            }
            let missing = match (health, answer) {
                (Some(path), Some(a)) => {
                    format!("its health path {path} {a}; it must answer 2xx or 3xx")
                }
                (Some(path), None) if accepted => format!("its health path {path} did not answer"),
                _ => "it must listen on 127.0.0.1:$PORT".to_owned(),
            };
            return Ready::TimedOut(missing);
        }
        let wait = match listening {
            Some(_) => {
                let announced = started + warden_sandbox::init::ANNOUNCE_FOR;
                announced
                    .saturating_duration_since(tokio::time::Instant::now())
                    .max(POLL_WHILE_TOLD)
            }
            None => pause,
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => poll_now = true,
            _ = exited.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
            // Said, or nothing more to say: either way the polls take over again.
            () = async {
                if let Some(l) = listening.as_mut() {
                    l.said().await;
                }
            }, if listening.is_some() => {
                // Init's word comes from a connection to the app's port inside the sandbox,
                // which is what a poll through init would make: with nothing more to ask (no
                // health path, no owner to check), a poll would only hand a connection over
                // and close it, on the request's path.
                let told = listening.as_ref().is_some_and(|l| l.told());
                if told && health.is_none() && owner.is_none() && !*exited.borrow() {
                    return Ready::Yes;
                }
                // Not held while the polls ask: an app with one worker per connection would
                // wait on it and answer no health check.
                drop(listening.as_mut().and_then(|l| l.take_first()));
                listening = None;
                poll_now = true;
            }
        }
        // Most apps accept within tens of milliseconds: poll at the timer's resolution until
        // then, so a start is not rounded up to the next of a doubling series of polls, and
        // back off for slow ones.
        if started.elapsed() >= FAST_POLL {
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
}
