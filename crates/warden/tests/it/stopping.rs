//! A polite stop (SIGTERM) while a push's build or trial runs: no instance record names their
//! processes, yet the agent's shutdown ends them, so they are gone before it says it stopped
//! (not only once warden is on its way out, by its dropped handles, the parent-death signal or
//! the reaper, the crash path), and warden exits in its usual time with nothing of them left.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::json;
use warden_test_support::{process_alive, wait_until, Launch, Warden};

use crate::interrupted::push_in_background;
use crate::BIN;

/// Pids of the processes whose command line holds `marker`.
fn marked(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(marker)
            }) && process_alive(*pid)
        })
        .collect()
}

/// Waits until processes marked `marker` run (the push's build or trial under way), stops
/// warden with SIGTERM and asserts: every one of them is gone before the agent says it has
/// stopped, warden exits within its usual shutdown time, and none is left after it. Returns
/// warden's data dir.
fn stop_while_running(mut w: Warden, marker: &str) -> std::path::PathBuf {
    let running = wait_until(
        &format!("processes marked {marker} to run"),
        Duration::from_secs(120),
        || {
            let m = marked(marker);
            (!m.is_empty()).then_some(m)
        },
    );
    let warden = w.pid();
    let asked = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(warden as i32), Signal::SIGTERM).unwrap();
    // Polled often, the log before the processes: once the agent says it has stopped, they
    // must be gone already. (Later, warden's exit ends them anyway: dropped handles, the
    // parent-death signal, the reaper.)
    loop {
        let stopped = w.stderr().contains("agent stopped");
        let left = marked(marker);
        if left.is_empty() {
            break;
        }
        assert!(
            !stopped,
            "the agent said it stopped while the processes of {marker} still ran ({left:?}): its shutdown did not end them\n{}",
            w.stderr()
        );
        assert!(
            asked.elapsed() < Duration::from_secs(60),
            "still running a minute after SIGTERM: {left:?} (were {running:?})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = w.signal_and_wait(Signal::SIGTERM);
    // Usually a few seconds (the instances' grace is 3 s, the API's connections get 5 s).
    assert!(
        asked.elapsed() < Duration::from_secs(30),
        "warden took {:?} to stop",
        asked.elapsed()
    );
    assert!(status.success(), "{status}\n{}", w.stderr());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        marked(marker),
        Vec::<u32>::new(),
        "left after warden's exit"
    );
    w.dir.clone()
}

/// The status of release `number` of `app`.
fn status(w: &Warden, app: &str, number: u64) -> Option<String> {
    let all = w
        .api("GET", &format!("/v1/apps/{app}/releases"), None)
        .json();
    let r = all.as_array()?.iter().find(|r| r["number"] == number)?;
    Some(r["status"].as_str()?.to_owned())
}

#[test]
fn a_stop_during_a_build_ends_the_build_before_warden_exits() {
    let tmp = tempfile::tempdir().unwrap();
    let w = Launch::new(BIN).data_dir(tmp.path().join("data")).start();
    let dir = tempfile::tempdir().unwrap();
    // The build's own install script runs long: a Node app's preinstall.
    let pkg = json!({
        "name": "slow",
        "version": "1.0.0",
        "scripts": { "preinstall": "sleep 7357 & wait", "start": "node x.js" }
    });
    std::fs::write(dir.path().join("package.json"), pkg.to_string()).unwrap();
    let pushing = push_in_background(&w, "slow", dir.path());
    let data = stop_while_running(w, "sleep 7357");
    let _ = pushing.join();
    // The end was warden's, not the build's: the release did not fail, and warden started
    // again resumes it (builds it again).
    let w = Launch::new(BIN).data_dir(&data).start();
    assert_eq!(status(&w, "slow", 1).as_deref(), Some("received"));
    wait_until("the build to run again", Duration::from_secs(120), || {
        (!marked("sleep 7357").is_empty()).then_some(())
    });
}

#[test]
fn a_stop_during_a_trial_ends_the_trial_before_warden_exits() {
    let tmp = tempfile::tempdir().unwrap();
    let w = Launch::new(BIN).data_dir(tmp.path().join("data")).start();
    let dir = tempfile::tempdir().unwrap();
    // Nothing to build; the trial instance takes long to be ready (the trial waits 10 s).
    std::fs::write(
        dir.path().join("Procfile"),
        "web: sleep 7358; exec python3 server.py\n",
    )
    .unwrap();
    let pushing = push_in_background(&w, "slow", dir.path());
    let data = stop_while_running(w, "sleep 7358");
    let _ = pushing.join();
    // Not failed: warden started again tries the release again.
    let w = Launch::new(BIN).data_dir(&data).start();
    assert_eq!(status(&w, "slow", 1).as_deref(), Some("built"));
    wait_until("the trial to run again", Duration::from_secs(120), || {
        (!marked("sleep 7358").is_empty()).then_some(())
    });
}
