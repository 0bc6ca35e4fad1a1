//! Memory, process-count and CPU limits of sandboxes through cgroups.
//!
//! At start the agent looks for a hierarchy it may write below its own cgroup:
//! - **cgroup v2** when the unified hierarchy offers `memory`, `pids` or `cpu` to the agent's
//!   cgroup. Children can only get controllers from a cgroup without processes of its own, so
//!   when the agent's cgroup holds the agent, the agent moves itself into a leaf
//!   (`warden-<pid>/agent`) first, as systemd asks of services with `Delegate=yes`. If other
//!   processes share the agent's cgroup that cannot work; the agent moves back and says so.
//! - **cgroup v1** otherwise, one hierarchy per controller (as on hosts and containers that
//!   still bind the controllers to v1).
//! - **none**: the sandbox falls back to rlimits (address space, processes per uid, CPU seconds),
//!   which is what an unprivileged agent without a delegated cgroup gets.
//!
//! Each instance gets `warden-<agent pid>/<instance id>` in every hierarchy used, created and
//! limited before its sandbox is built (so a slot of the slot pool has it ready), joined by the
//! sandbox's outermost namespaced process (so everything in the sandbox is counted: the app,
//! what it forks, and the files it writes to its tmpfs), and removed after the sandbox is gone.
//! A kill by the kernel's out-of-memory killer is read back at exit, so it shows in the
//! instance's log and exit status instead of passing unnoticed.
//!
//! This module only writes files under cgroup mounts; it never touches another cgroup than
//! the `warden-<pid>` ones it made (and those of dead agents, which it removes when empty).

mod detect;

use std::path::{Path, PathBuf};
use std::time::Duration;

use warden_core::Limits;

/// Why cgroups could not be used, or an instance's could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A file under a cgroup mount could not be read, made or written.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was done: "read", "mkdir", "write 0 to".
        action: String,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The controllers could not be enabled for child cgroups.
    #[error("cgroup v2 at {}: cannot enable {controllers} for child cgroups: {source}{hint}", at.display())]
    Enable {
        /// The agent's own cgroup.
        at: PathBuf,
        /// The controllers asked for.
        controllers: String,
        /// Why.
        source: std::io::Error,
        /// What the operator can do, if anything is known.
        hint: &'static str,
    },
    /// No hierarchy can be used; every reason found.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Unusable(Vec<CgroupError>),
    /// No hierarchy offers a wanted controller.
    #[error("no cgroup hierarchy offers memory, pids or cpu to warden")]
    NoController,
}

impl CgroupError {
    fn io(action: impl Into<String>, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            action: action.into(),
            path: path.to_owned(),
            source,
        }
    }
}

/// The scheduler period of the CPU limit: the kernel's default (100 ms).
const CPU_PERIOD_US: u64 = 100_000;
/// Processes of the sandbox that are not the app's: the namespaced outer process and init.
pub const SANDBOX_OVERHEAD_PROCESSES: u64 = 2;

/// Which limits the cgroups enforce, so that the sandbox knows which rlimits it still needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Enforced {
    /// `memory.max` (or v1's limit) caps the app's memory.
    pub memory: bool,
    /// `pids.max` caps its processes.
    pub pids: bool,
    /// `cpu.max` (or v1's quota) caps its CPU.
    pub cpu: bool,
}

#[derive(Debug)]
enum Kind {
    None,
    V2 {
        /// `warden-<pid>` in the unified hierarchy, with the controllers enabled for children.
        base: PathBuf,
        enforced: Enforced,
    },
    V1 {
        memory: Option<PathBuf>,
        pids: Option<PathBuf>,
        cpu: Option<PathBuf>,
    },
}

/// The node's cgroup setup, found once at agent start.
#[derive(Debug)]
pub struct Cgroups {
    kind: Kind,
    /// What is used, or why nothing is, for logs and the node record.
    summary: String,
}

/// One instance's cgroups: limits set, waiting for the sandbox to join.
#[derive(Debug)]
pub struct InstanceCgroup {
    /// Every directory made for the instance (one in v2, one per controller in v1).
    dirs: Vec<PathBuf>,
    /// The file whose `oom_kill` line counts out-of-memory kills.
    oom_file: Option<PathBuf>,
    memory_mb: u64,
    /// Which of the instance's limits these cgroups enforce.
    pub enforced: Enforced,
}

impl Cgroups {
    /// Finds the hierarchy this agent may use; never fails, falls back to none with a reason.
    pub fn detect() -> Self {
        detect::detect().unwrap_or_else(|reason| Self::off(&reason.to_string()))
    }

    /// No cgroups: limits are rlimits, for the reason given.
    pub fn off(reason: &str) -> Self {
        Self {
            kind: Kind::None,
            summary: format!("rlimits only ({reason})"),
        }
    }

    /// A line saying what enforces limits, e.g. `cgroup v1 (memory, pids, cpu)`.
    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// Creates and limits the cgroups of instance `id`; `None` when no hierarchy is used.
    pub fn create(&self, id: &str, limits: &Limits) -> Result<Option<InstanceCgroup>, CgroupError> {
        let memory = limits.memory_mb.saturating_mul(1024 * 1024).to_string();
        let pids = limits
            .processes
            .saturating_add(SANDBOX_OVERHEAD_PROCESSES)
            .to_string();
        let quota =
            (limits.millicpus > 0).then(|| (limits.millicpus * CPU_PERIOD_US / 1000).max(1000));
        let mut made = InstanceCgroup {
            dirs: Vec::new(),
            oom_file: None,
            memory_mb: limits.memory_mb,
            enforced: Enforced::default(),
        };
        let result: Result<(), CgroupError> = match &self.kind {
            Kind::None => return Ok(None),
            Kind::V2 { base, enforced } => (|| {
                let dir = made.mkdir(base, id)?;
                if enforced.memory {
                    write(&dir, "memory.max", &memory)?;
                    // Swap would let an instance hold more than its limit.
                    if dir.join("memory.swap.max").exists() {
                        write(&dir, "memory.swap.max", "0")?;
                    }
                    made.oom_file = Some(dir.join("memory.events"));
                }
                if enforced.pids {
                    write(&dir, "pids.max", &pids)?;
                }
                if enforced.cpu {
                    let max = quota.map_or("max".to_owned(), |q| q.to_string());
                    write(&dir, "cpu.max", &format!("{max} {CPU_PERIOD_US}"))?;
                }
                made.enforced = *enforced;
                Ok(())
            })(),
            Kind::V1 {
                memory: m,
                pids: p,
                cpu: c,
            } => (|| {
                if let Some(base) = m {
                    let dir = made.mkdir(base, id)?;
                    write(&dir, "memory.limit_in_bytes", &memory)?;
                    // Raised after the plain limit, which must never exceed it.
                    if dir.join("memory.memsw.limit_in_bytes").exists() {
                        write(&dir, "memory.memsw.limit_in_bytes", &memory)?;
                    }
                    made.oom_file = Some(dir.join("memory.oom_control"));
                    made.enforced.memory = true;
                }
                if let Some(base) = p {
                    let dir = made.mkdir(base, id)?;
                    write(&dir, "pids.max", &pids)?;
                    made.enforced.pids = true;
                }
                if let Some(base) = c {
                    let dir = made.mkdir(base, id)?;
                    write(&dir, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
                    let q = quota.map_or("-1".to_owned(), |q| q.to_string());
                    match std::fs::write(dir.join("cpu.cfs_quota_us"), &q) {
                        Ok(()) => {}
                        // v1 refuses a quota above an ancestor's (docker --cpus, systemd
                        // CPUQuota=); the ancestor's cap still holds the instance.
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) && quota.is_some() => {
                            tracing::warn!(cgroup = %dir.display(), quota_us = %q, "the CPU cap is above what a parent cgroup allows; the parent's cap applies instead");
                        }
                        Err(e) => {
                            return Err(CgroupError::io(
                                format!("write {q} to"),
                                &dir.join("cpu.cfs_quota_us"),
                                e,
                            ))
                        }
                    }
                    made.enforced.cpu = true;
                }
                Ok(())
            })(),
        };
        match result {
            Ok(()) => Ok(Some(made)),
            Err(e) => {
                made.remove(Duration::ZERO);
                Err(e)
            }
        }
    }

    /// Removes this agent's `warden-<pid>` directories at shutdown, as far as they are empty
    /// (on v2 the agent's own leaf stays until it exits; the next agent removes it).
    pub fn remove(&self) {
        let bases: Vec<&PathBuf> = match &self.kind {
            Kind::None => Vec::new(),
            Kind::V2 { base, .. } => vec![base],
            Kind::V1 { memory, pids, cpu } => [memory, pids, cpu].into_iter().flatten().collect(),
        };
        for base in bases {
            remove_tree(base);
        }
    }
}

impl InstanceCgroup {
    fn mkdir(&mut self, base: &Path, id: &str) -> Result<PathBuf, CgroupError> {
        // Another agent sharing this cgroup may have removed an empty base of ours (it cannot
        // tell a live agent in another pid namespace from a dead one): make it again. On v2
        // the base holds the agent itself, so it is never empty.
        std::fs::create_dir_all(base).map_err(|e| CgroupError::io("mkdir", base, e))?;
        let dir = base.join(id);
        std::fs::create_dir(&dir).map_err(|e| CgroupError::io("mkdir", &dir, e))?;
        self.dirs.push(dir.clone());
        Ok(dir)
    }

    /// The `cgroup.procs` files the sandbox's outer process is written to.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// How many processes the out-of-memory killer has killed in the instance.
    pub fn oom_kills(&self) -> u64 {
        self.oom_file
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .map(|s| oom_kill_count(&s))
            .unwrap_or(0)
    }

    /// What the out-of-memory killer did in the instance, in words for its log; none if
    /// nothing.
    pub fn oom_note(&self) -> Option<String> {
        let kills = self.oom_kills();
        (kills > 0).then(|| {
            format!(
                "out of memory: the kernel killed {kills} process{} of this instance at its memory limit of {} MiB",
                if kills == 1 { "" } else { "es" },
                self.memory_mb
            )
        })
    }

    /// Removes the cgroups once the sandbox is gone, waiting up to `wait` while the kernel
    /// finishes releasing them.
    pub fn release(mut self, wait: Duration) {
        self.remove(wait);
        self.dirs.clear();
    }

    fn remove(&self, wait: Duration) {
        let deadline = std::time::Instant::now() + wait;
        for dir in self.dirs.iter().rev() {
            loop {
                match std::fs::remove_dir(dir) {
                    Err(e)
                        if e.raw_os_error() == Some(libc::EBUSY)
                            && std::time::Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        tracing::warn!(cgroup = %dir.display(), error = %e, "could not remove an instance's cgroup");
                        break;
                    }
                    _ => break,
                }
            }
        }
    }
}

impl Drop for InstanceCgroup {
    /// A sandbox dropped without [`InstanceCgroup::release`] (a failed start, a discarded
    /// slot at shutdown): its cgroups go if they are empty already; the next agent on this
    /// host removes what is left.
    fn drop(&mut self) {
        self.remove(Duration::ZERO);
    }
}

/// The `oom_kill N` line of `memory.events` (v2) or `memory.oom_control` (v1).
fn oom_kill_count(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), CgroupError> {
    std::fs::write(dir.join(file), value)
        .map_err(|e| CgroupError::io(format!("write {value} to"), &dir.join(file), e))
}

/// Removes `dir`'s empty child cgroups, then `dir` (cgroups are removed with rmdir, never
/// recursively: their control files cannot be deleted).
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_kill_lines_are_read_from_v1_and_v2_files() {
        assert_eq!(
            oom_kill_count("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"),
            3
        );
        assert_eq!(
            oom_kill_count("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n"),
            2
        );
        assert_eq!(oom_kill_count(""), 0);
    }
}
