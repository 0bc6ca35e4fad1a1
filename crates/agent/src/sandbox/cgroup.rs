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

use std::path::{Path, PathBuf};
use std::time::Duration;

use warden_core::Limits;

/// The scheduler period of the CPU limit: the kernel's default (100 ms).
const CPU_PERIOD_US: u64 = 100_000;
/// Processes of the sandbox that are not the app's: the namespaced outer process and init.
pub(crate) const SANDBOX_OVERHEAD_PROCESSES: u64 = 2;

/// Which limits the cgroups enforce, so that the sandbox knows which rlimits it still needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Enforced {
    pub memory: bool,
    pub pids: bool,
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
pub(crate) struct InstanceCgroup {
    /// Every directory made for the instance (one in v2, one per controller in v1).
    dirs: Vec<PathBuf>,
    /// The file whose `oom_kill` line counts out-of-memory kills.
    oom_file: Option<PathBuf>,
    memory_mb: u64,
    pub enforced: Enforced,
}

impl Cgroups {
    /// Finds the hierarchy this agent may use; never fails, falls back to none with a reason.
    pub fn detect() -> Self {
        detect().unwrap_or_else(|reason| Self::off(&reason))
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
    pub(crate) fn create(
        &self,
        id: &str,
        limits: &Limits,
    ) -> Result<Option<InstanceCgroup>, String> {
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
        let result: Result<(), String> = match &self.kind {
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
                            return Err(format!(
                                "cannot write {q} to {}: {e}",
                                dir.join("cpu.cfs_quota_us").display()
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
                Err(format!("cannot set up the instance's cgroup: {e}"))
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
    fn mkdir(&mut self, base: &Path, id: &str) -> Result<PathBuf, String> {
        // Another agent sharing this cgroup may have removed an empty base of ours (it cannot
        // tell a live agent in another pid namespace from a dead one): make it again. On v2
        // the base holds the agent itself, so it is never empty.
        std::fs::create_dir_all(base).map_err(|e| format!("mkdir {}: {e}", base.display()))?;
        let dir = base.join(id);
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        self.dirs.push(dir.clone());
        Ok(dir)
    }

    /// The `cgroup.procs` files the sandbox's outer process is written to.
    pub(crate) fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// How many processes the out-of-memory killer has killed in the instance.
    pub(crate) fn oom_kills(&self) -> u64 {
        self.oom_file
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .map(|s| oom_kill_count(&s))
            .unwrap_or(0)
    }

    /// What the out-of-memory killer did in the instance, in words for its log; none if
    /// nothing.
    pub(crate) fn oom_note(&self) -> Option<String> {
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
    pub(crate) fn release(mut self, wait: Duration) {
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

fn write(dir: &Path, file: &str, value: &str) -> Result<(), String> {
    std::fs::write(dir.join(file), value)
        .map_err(|e| format!("cannot write {value} to {}: {e}", dir.join(file).display()))
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

/// A cgroup mount: where it is, the path inside the hierarchy it shows, and its controllers
/// (v1) or `None` (v2).
#[derive(Debug, PartialEq)]
struct Mount {
    point: PathBuf,
    root: String,
    controllers: Option<Vec<String>>,
}

/// The cgroup mounts of `/proc/self/mountinfo`.
fn mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let _source = right.next()?;
            let options = right.next().unwrap_or("");
            let root = unescape(left.get(3)?);
            let point = PathBuf::from(unescape(left.get(4)?));
            match fstype {
                "cgroup2" => Some(Mount {
                    point,
                    root,
                    controllers: None,
                }),
                "cgroup" => Some(Mount {
                    point,
                    root,
                    controllers: Some(options.split(',').map(str::to_owned).collect()),
                }),
                _ => None,
            }
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.clone().take(3).collect();
            if let Ok(v) = u8::from_str_radix(&code, 8) {
                out.push(char::from(v));
                for _ in 0..3 {
                    chars.next();
                }
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// The agent's own cgroup path per hierarchy, from `/proc/self/cgroup`: (controllers, path),
/// with empty controllers for v2.
fn own_cgroups(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            let controllers = controllers
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            Some((controllers, path.to_owned()))
        })
        .collect()
}

/// Where the agent's cgroup `own` (a path in the hierarchy) is in the file system, given the
/// mount that shows the hierarchy from `root`.
fn own_dir(mount: &Mount, own: &str) -> Option<PathBuf> {
    let rel = if mount.root == "/" {
        own
    } else {
        own.strip_prefix(mount.root.as_str())?
    };
    Some(mount.point.join(rel.trim_start_matches('/')))
}

const WANTED: [&str; 3] = ["memory", "pids", "cpu"];

fn detect() -> Result<Cgroups, String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let mounts = mounts(&mountinfo);
    let own = own_cgroups(&own);
    let name = format!("warden-{}", std::process::id());
    let mut v2_reason = None;
    if let (Some(m), Some((_, path))) = (
        mounts.iter().find(|m| m.controllers.is_none()),
        own.iter().find(|(c, _)| c.is_empty()),
    ) {
        if let Some(dir) = own_dir(m, path) {
            match setup_v2(&dir, &name) {
                Ok(Some(c)) => return Ok(c),
                Ok(None) => {}
                Err(e) => v2_reason = Some(e),
            }
        }
    }
    let mut v1: [Option<PathBuf>; 3] = [None, None, None];
    let mut v1_errors = Vec::new();
    for (i, controller) in WANTED.iter().enumerate() {
        let mount = mounts.iter().find(|m| {
            m.controllers
                .as_ref()
                .is_some_and(|c| c.iter().any(|x| x == controller))
        });
        let path = own
            .iter()
            .find(|(c, _)| c.iter().any(|x| x == controller))
            .map(|(_, p)| p);
        let (Some(mount), Some(path)) = (mount, path) else {
            continue;
        };
        let Some(dir) = own_dir(mount, path) else {
            continue;
        };
        remove_dead(&dir);
        let base = dir.join(&name);
        match std::fs::create_dir_all(&base) {
            Ok(()) => v1[i] = Some(base),
            Err(e) => v1_errors.push(format!("{controller}: mkdir {}: {e}", base.display())),
        }
    }
    let [memory, pids, cpu] = v1;
    let used: Vec<&str> = WANTED
        .iter()
        .zip([&memory, &pids, &cpu])
        .filter(|(_, p)| p.is_some())
        .map(|(c, _)| *c)
        .collect();
    if used.is_empty() {
        let mut why: Vec<String> = v2_reason.into_iter().collect();
        why.extend(v1_errors);
        if why.is_empty() {
            why.push("no cgroup hierarchy offers memory, pids or cpu to warden".into());
        }
        return Err(why.join("; "));
    }
    Ok(Cgroups {
        summary: format!("cgroup v1 ({})", used.join(", ")),
        kind: Kind::V1 { memory, pids, cpu },
    })
}

/// Sets up `own/<name>` with the controllers enabled for instance cgroups. `Ok(None)` when the
/// unified hierarchy offers none of the wanted controllers.
fn setup_v2(own: &Path, name: &str) -> Result<Option<Cgroups>, String> {
    let offered = std::fs::read_to_string(own.join("cgroup.controllers")).unwrap_or_default();
    let controllers: Vec<&str> = WANTED
        .into_iter()
        .filter(|c| offered.split_whitespace().any(|o| o == *c))
        .collect();
    if controllers.is_empty() {
        return Ok(None);
    }
    remove_dead(own);
    let enable: String = controllers
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    let base = own.join(name);
    std::fs::create_dir_all(&base).map_err(|e| format!("mkdir {}: {e}", base.display()))?;
    let enabled = match std::fs::write(own.join("cgroup.subtree_control"), &enable) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            // The agent's own cgroup has processes (the agent): move the agent into a leaf.
            let leaf = base.join("agent");
            let moved = std::fs::create_dir_all(&leaf)
                .and_then(|()| std::fs::write(leaf.join("cgroup.procs"), "0"));
            match moved.and_then(|()| std::fs::write(own.join("cgroup.subtree_control"), &enable)) {
                Ok(()) => Ok(()),
                Err(e) => {
                    let hint = if e.raw_os_error() == Some(libc::EBUSY) {
                        "; other processes share warden's cgroup: run warden in a cgroup of its own (systemd: Delegate=yes)"
                    } else {
                        ""
                    };
                    Err(format!(
                        "cgroup v2 at {}: cannot enable {} for child cgroups: {e}{hint}",
                        own.display(),
                        controllers.join(", ")
                    ))
                }
            }
        }
        Err(e) => Err(format!(
            "cgroup v2 at {}: cannot enable {} for child cgroups: {e}",
            own.display(),
            controllers.join(", ")
        )),
    };
    let enabled = enabled.and_then(|()| {
        std::fs::write(base.join("cgroup.subtree_control"), &enable)
            .map_err(|e| format!("cgroup v2 at {}: {e}", base.display()))
    });
    if let Err(e) = enabled {
        // Back where it started, if it moved, so that its base can go.
        let _ = std::fs::write(own.join("cgroup.procs"), "0");
        remove_tree(&base);
        return Err(e);
    }
    let enforced = Enforced {
        memory: controllers.contains(&"memory"),
        pids: controllers.contains(&"pids"),
        cpu: controllers.contains(&"cpu"),
    };
    Ok(Some(Cgroups {
        summary: format!("cgroup v2 ({})", controllers.join(", ")),
        kind: Kind::V2 { base, enforced },
    }))
}

/// Removes the empty `warden-<pid>` cgroups of agents that are no longer running.
fn remove_dead(own: &Path) {
    let Ok(entries) = std::fs::read_dir(own) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("warden-"))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // An agent in another pid namespace looks dead from here too; such an agent's empty
        // cgroups are only removed once nothing in them changed for a while, and an agent
        // recreates its own base when it needs it again (see `InstanceCgroup::mkdir`).
        let dead = pid != std::process::id() as i32
            && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                == Err(nix::errno::Errno::ESRCH);
        if dead && untouched_for(&e.path(), STALE_AFTER) {
            remove_tree(&e.path());
        }
    }
}

/// How long a dead agent's cgroups must have been left alone before they are removed.
const STALE_AFTER: Duration = Duration::from_secs(60);

/// Whether nothing in `dir` or its child cgroups was created or changed within `age`.
fn untouched_for(dir: &Path, age: Duration) -> bool {
    let recent = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_none_or(|e| e < age)
    };
    if recent(dir) {
        return false;
    }
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                .all(|e| !recent(&e.path()))
        })
        .unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_give_cgroup_mounts() {
        let text = "\
35 24 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 24 0:31 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
37 24 0:32 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw shared:9 - cgroup cgroup rw,cpu,cpuacct
40 24 8:1 / / rw - ext4 /dev/sda1 rw
41 24 0:33 / /mnt/with\\040space rw - cgroup2 none rw";
        let m = mounts(text);
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].point, PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(
            m[0].controllers.as_deref(),
            Some(&["rw".to_owned(), "memory".to_owned()][..])
        );
        assert!(m[1].controllers.is_none());
        assert_eq!(m[2].root, "/docker/abc");
        assert_eq!(m[3].point, PathBuf::from("/mnt/with space"));
    }

    #[test]
    fn own_cgroup_paths_resolve_under_their_mount() {
        let own = own_cgroups("4:memory:/process_api/x\n1:cpu,cpuacct:/docker/abc/y\n0::/\n");
        assert_eq!(own[0], (vec!["memory".to_owned()], "/process_api/x".into()));
        assert_eq!(own[2], (vec![], "/".into()));
        let m = Mount {
            point: "/sys/fs/cgroup/cpu".into(),
            root: "/docker/abc".into(),
            controllers: Some(vec!["cpu".into()]),
        };
        assert_eq!(
            own_dir(&m, &own[1].1),
            Some(PathBuf::from("/sys/fs/cgroup/cpu/y"))
        );
        assert_eq!(own_dir(&m, "/elsewhere"), None);
    }

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
