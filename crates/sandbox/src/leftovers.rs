//! What a killed agent left running, found and ended when the next one starts.
//!
//! Instances are tied to the agent by a parent-death signal, but that reaches only the process
//! the agent forked: a `process` app's own children stay in its process group and live on, and
//! a signal lost in a race (the parent died before the child asked for it) leaves a whole
//! sandbox. So every start records its process group next to its instance directory, in a file
//! the app cannot write (`<instances>/<id>.pid`: the `process` driver hands the directory itself
//! to the app's uid), and an agent that starts ends every group a previous run recorded, then
//! the files go with the directories.
//!
//! A recorded group is ended only if it is still the one recorded: same boot, and its leader
//! has the recorded start time (or, with the leader gone, no member started before it), so a
//! process id the kernel handed out again is never signalled.
//!
//! Waiting for the next start leaves those processes running meanwhile, for good on a node that
//! never comes back. So each agent also starts a reaper ([`start_reaper`]): `warden reaper DIR`,
//! in a process group of its own, blocked on a pipe whose only writer is the agent's process.
//! However the agent dies (SIGKILL, the OOM killer, a crash) the kernel closes the pipe, and the
//! reaper ends what the records name, then exits; an agent that stops cleanly has removed them
//! first, so its reaper finds nothing.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// Extension of the files that record an instance's process group.
const EXTENSION: &str = "pid";

/// How long an ended group gets to be gone before the agent goes on anyway.
const GONE_WITHIN: Duration = Duration::from_secs(5);

/// The file that records the process group of the instance in `dir`.
pub fn pid_file(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_owned();
    name.push(".");
    name.push(EXTENSION);
    dir.with_file_name(name)
}

/// Records that the instance in `dir` runs as process group `pgid` (its leader's pid).
pub fn record(dir: &Path, pgid: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let start = start_time(pgid).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("process {pgid} is gone"),
        )
    })?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(pid_file(dir))?;
    writeln!(f, "{pgid} {start} {}", boot_id())
}

/// Removes the instance directory `dir` and the record of its process group: the instance is
/// gone.
pub fn remove_instance_dir(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_file(pid_file(dir));
}

/// Ends every process group recorded in `instances` by an earlier run and removes the records;
/// returns how many groups were still running.
pub fn end_leftovers(instances: &Path) -> usize {
    end_recorded(instances, u64::MAX)
}

/// What the agent's reaper does once its agent is gone: ends every group recorded in
/// `instances` whose leader started before now (so never one of a warden started since on the
/// same data dir), and removes those records. Returns how many groups were still running.
pub fn end_what_a_dead_agent_left(instances: &Path) -> usize {
    end_recorded(instances, now_ticks())
}

/// Ends the recorded groups that started before `before` (clock ticks since boot) and removes
/// their records; records of later groups stay.
fn end_recorded(instances: &Path, before: u64) -> usize {
    let Ok(entries) = std::fs::read_dir(instances) else {
        return 0;
    };
    let mut ended = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != EXTENSION) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if let Some(start) = recorded_start(&text).filter(|start| *start >= before) {
            eprintln!(
                "warden reaper: left {} alone: its group started at tick {start}, not before {before}",
                path.display()
            );
            continue;
        }
        if let Some(pgid) = still_ours(&text) {
            if killpg(Pid::from_raw(pgid), Signal::SIGKILL).is_ok() {
                tracing::warn!(
                    instance = %path.file_stem().unwrap_or_default().to_string_lossy(),
                    pgid,
                    "ended processes of an instance that an earlier run of this agent left running"
                );
                ended.push(pgid);
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    let count = ended.len();
    let deadline = Instant::now() + GONE_WITHIN;
    while !ended.is_empty() && Instant::now() < deadline {
        let left = members_by_group();
        ended.retain(|g| left.iter().any(|(_, pgid, _)| pgid == g));
        if !ended.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    if !ended.is_empty() {
        tracing::warn!(groups = ?ended, "processes of earlier instances did not end within {GONE_WITHIN:?}");
    }
    count
}

/// The start time a record (`pgid start boot`) gives its group's leader.
fn recorded_start(record: &str) -> Option<u64> {
    record.split_whitespace().nth(1)?.parse().ok()
}

/// Now, in clock ticks since boot, as process start times count.
fn now_ticks() -> u64 {
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::MAX);
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100);
    (uptime * hz as f64) as u64
}

/// The recorded group of `record` (`pgid start boot`) if it is still running and still the
/// one recorded.
fn still_ours(record: &str) -> Option<i32> {
    let mut parts = record.split_whitespace();
    let pgid: i32 = parts.next()?.parse().ok()?;
    let start: u64 = parts.next()?.parse().ok()?;
    let boot = parts.next()?;
    if pgid <= 1 || boot != boot_id() {
        return None;
    }
    let members: Vec<(i32, u64)> = members_by_group()
        .into_iter()
        .filter(|(_, g, _)| *g == pgid)
        .map(|(pid, _, started)| (pid, started))
        .collect();
    if members.is_empty() {
        return None;
    }
    let ours = match members.iter().find(|(pid, _)| *pid == pgid) {
        Some((_, leader_start)) => *leader_start == start,
        None => members.iter().all(|(_, started)| *started >= start),
    };
    ours.then_some(pgid)
}

/// Every live (not zombie) process: pid, process group, start time in clock ticks since boot.
fn members_by_group() -> Vec<(i32, i32, u64)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let (state, pgid, start) = stat(pid)?;
            (state != 'Z').then_some((pid, pgid, start))
        })
        .collect()
}

/// State, process group and start time of `pid`, from `/proc/<pid>/stat`.
fn stat(pid: i32) -> Option<(char, i32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    // Fields 3 (state), 5 (pgrp) and 22 (starttime) of proc(5), counted from the state.
    let state = fields.first()?.chars().next()?;
    let pgid = fields.get(2)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, pgid, start))
}

fn start_time(pid: u32) -> Option<u64> {
    stat(i32::try_from(pid).ok()?).map(|(_, _, start)| start)
}

/// This boot's id: start times count from boot, so a record of another boot names nothing.
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// Starts the reaper of the agent whose instances are recorded in `instances` (see the
/// module's documentation). The returned descriptor is the pipe's only writer, close-on-exec so
/// that no instance holds it: keep it until the process ends.
pub fn start_reaper(instances: &Path) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::unix::process::CommandExt;
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    std::process::Command::new(crate::image::own_image()?)
        .arg("reaper")
        // Absolute: what the reaper ends must not depend on a working directory.
        .arg(std::path::absolute(instances)?)
        .stdin(std::process::Stdio::from(read))
        .stdout(std::process::Stdio::null())
        // Its own group: a Ctrl-C meant for warden must not end it before warden is done.
        .process_group(0)
        .spawn()?;
    Ok(write)
}

/// The reaper's life: waits until its agent's end of the pipe on standard input closes, then
/// ends what that agent's instances left. Returns the exit status.
pub fn reaper_main(instances: &Path) -> u8 {
    use std::io::Read;
    let mut stdin = std::io::stdin().lock();
    let mut buf = [0u8; 64];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let ended = end_what_a_dead_agent_left(instances);
    if ended > 0 {
        eprintln!(
            "warden reaper: ended the processes of {ended} instance(s) that a stopped agent left running"
        );
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reaper_never_ends_a_group_that_started_after_its_agent_died() {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let inst = dir.path().join("0123456789abcdef");
        record(&inst, child.id()).unwrap();
        let start = start_time(child.id()).unwrap();
        // A warden started since, on the same data dir: its group is spared, its record kept.
        assert_eq!(end_recorded(dir.path(), start), 0);
        assert!(pid_file(&inst).exists());
        assert!(child.try_wait().unwrap().is_none());
        // One the dead agent started: ended, record gone.
        assert_eq!(end_recorded(dir.path(), start + 1), 1);
        assert!(!pid_file(&inst).exists());
        assert!(child.wait().unwrap().code().is_none(), "killed by a signal");
    }

    #[test]
    fn the_record_sits_beside_the_directory() {
        assert_eq!(
            pid_file(Path::new("/d/instances/0123456789abcdef")),
            Path::new("/d/instances/0123456789abcdef.pid")
        );
    }

    #[test]
    fn a_group_is_ours_only_with_its_recorded_start_and_boot() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = i32::try_from(child.id()).unwrap();
        let start = start_time(child.id()).unwrap();
        let boot = boot_id();
        assert_eq!(still_ours(&format!("{pgid} {start} {boot}")), Some(pgid));
        assert_eq!(still_ours(&format!("{pgid} {} {boot}", start + 1)), None);
        assert_eq!(still_ours(&format!("{pgid} {start} another-boot")), None);
        assert_eq!(still_ours("garbage"), None);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(still_ours(&format!("{pgid} {start} {boot}")), None);
    }
}
