//! Finding the cgroup hierarchy this agent may write: the mounts, the agent's own cgroup in
//! each, and the setup of the `warden-<pid>` base below it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{remove_tree, CgroupError, Cgroups, Enforced, Kind};

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

pub(super) fn detect() -> Result<Cgroups, CgroupError> {
    let read = |path: &str| {
        std::fs::read_to_string(path).map_err(|e| CgroupError::io("read", Path::new(path), e))
    };
    let mountinfo = read("/proc/self/mountinfo")?;
    let own = read("/proc/self/cgroup")?;
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
            Err(e) => v1_errors.push(CgroupError::io(format!("{controller}: mkdir"), &base, e)),
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
        let mut why: Vec<CgroupError> = v2_reason.into_iter().collect();
        why.extend(v1_errors);
        if why.is_empty() {
            return Err(CgroupError::NoController);
        }
        return Err(CgroupError::Unusable(why));
    }
    Ok(Cgroups {
        summary: format!("cgroup v1 ({})", used.join(", ")),
        kind: Kind::V1 { memory, pids, cpu },
    })
}

/// Sets up `own/<name>` with the controllers enabled for instance cgroups. `Ok(None)` when the
/// unified hierarchy offers none of the wanted controllers.
fn setup_v2(own: &Path, name: &str) -> Result<Option<Cgroups>, CgroupError> {
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
    std::fs::create_dir_all(&base).map_err(|e| CgroupError::io("mkdir", &base, e))?;
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
                    Err(CgroupError::Enable {
                        at: own.to_owned(),
                        controllers: controllers.join(", "),
                        source: e,
                        hint,
                    })
                }
            }
        }
        Err(e) => Err(CgroupError::Enable {
            at: own.to_owned(),
            controllers: controllers.join(", "),
            source: e,
            hint: "",
        }),
    };
    let enabled = enabled.and_then(|()| {
        std::fs::write(base.join("cgroup.subtree_control"), &enable).map_err(|e| {
            CgroupError::io(
                format!("write {enable} to"),
                &base.join("cgroup.subtree_control"),
                e,
            )
        })
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
}
