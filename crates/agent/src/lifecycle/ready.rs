//! Waiting until a new instance is ready: it accepts a connection and, when the app names a
//! health path, answers it 2xx or 3xx; or, for a process type that listens on nothing
//! (`worker:`), it started and is still running a moment later.

use std::time::Duration;

use tokio::sync::watch;
use warden_core::InstanceAddr;

use super::health;

/// How long readiness is polled every millisecond before the polls back off.
const FAST_POLL: Duration = Duration::from_millis(100);

/// How a wait for readiness ended.
pub(crate) enum Ready {
    Yes,
    Exited,
    /// What was still missing.
    TimedOut(String),
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

/// Waits until the app at `addr` is ready, the process exits, or `timeout` passes. Ready means
/// accepting a TCP connection and, when the app names a health path, answering it 2xx or 3xx.
pub(crate) async fn wait_ready(
    addr: &InstanceAddr,
    health: Option<&str>,
    mut exited: watch::Receiver<bool>,
    timeout: Duration,
) -> Ready {
    let started = tokio::time::Instant::now();
    let deadline = started + timeout;
    let mut pause = Duration::from_millis(1);
    // What the health path said last; `None` until it has answered anything.
    let mut answer: Option<String> = None;
    let mut accepted = false;
    loop {
        if *exited.borrow() {
            return Ready::Exited;
        }
        if let Ok(conn) = warden_sandbox::connect(addr).await {
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
            let missing = match (health, answer) {
                (Some(path), Some(a)) => {
                    format!("its health path {path} {a}; it must answer 2xx or 3xx")
                }
                (Some(path), None) if accepted => format!("its health path {path} did not answer"),
                _ => "it must listen on 127.0.0.1:$PORT".to_owned(),
            };
            return Ready::TimedOut(missing);
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = exited.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
        // Most apps accept within tens of milliseconds: poll at the timer's resolution until
        // then, so a start is not rounded up to the next of a doubling series of polls, and
        // back off for slow ones.
        if started.elapsed() >= FAST_POLL {
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
}
