//! CPU time of the processes in a run, read from /proc, to tell what each request cost each side.
//!
//! On a two-core machine the load generator, the upstream and the proxy share the cores, so a
//! proxy's throughput also depends on what the others cost. CPU time per request separates the
//! proxy's own cost from theirs.

use std::fs;

use nix::sys::resource::{getrusage, UsageWho};
use nix::unistd::{sysconf, SysconfVar};

/// CPU seconds spent in user space and in the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Seconds {
    pub user: f64,
    pub system: f64,
}

impl Seconds {
    pub(crate) fn total(self) -> f64 {
        self.user + self.system
    }

    pub(crate) fn since(self, earlier: Seconds) -> Seconds {
        Seconds {
            user: self.user - earlier.user,
            system: self.system - earlier.system,
        }
    }
}

fn ticks_per_second() -> f64 {
    match sysconf(SysconfVar::CLK_TCK) {
        Ok(Some(n)) if n > 0 => n as f64,
        // USER_HZ is 100 on every architecture Linux reports /proc times for.
        _ => 100.0,
    }
}

/// The user and system time of one task from its `stat` line (fields 14 and 15), in ticks.
fn stat_ticks(stat: &str) -> Option<(u64, u64)> {
    // The command name may hold spaces and parentheses; the fields start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace().skip(11);
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

/// CPU time of every thread of `pids` so far. Processes that have gone count as nothing.
pub(crate) fn of(pids: &[u32]) -> Seconds {
    let (mut user, mut system) = (0u64, 0u64);
    for pid in pids {
        let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Ok(stat) = fs::read_to_string(task.path().join("stat")) else {
                continue;
            };
            if let Some((u, s)) = stat_ticks(&stat) {
                user += u;
                system += s;
            }
        }
    }
    let hz = ticks_per_second();
    Seconds {
        user: user as f64 / hz,
        system: system as f64 / hz,
    }
}

/// Every process below `root`, not `root` itself.
pub(crate) fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent_of.push((pid, ppid));
        }
    }
    let mut found = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for &(child, parent) in &parent_of {
            if parent == p {
                found.push(child);
                todo.push(child);
            }
        }
    }
    found
}

/// CPU time of this process's waited-for children (wrk, once each run has ended).
pub(crate) fn reaped_children() -> Seconds {
    match getrusage(UsageWho::RUSAGE_CHILDREN) {
        Ok(u) => {
            let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            Seconds {
                user: secs(u.user_time()),
                system: secs(u.system_time()),
            }
        }
        Err(_) => Seconds::default(),
    }
}

/// Busy and total time of each CPU so far, in ticks, from /proc/stat: where a process's own
/// times miss the kernel's network work done on its core for others (softirq), a core's busy
/// time counts everything that ran there.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cores(Vec<(u64, u64)>);

impl Cores {
    pub(crate) fn now() -> Cores {
        Cores(fs::read_to_string("/proc/stat").map_or_else(|_| Vec::new(), |s| cores_of(&s)))
    }

    /// Busy seconds and the busy fraction of the CPUs in `cpus` since `earlier`.
    pub(crate) fn busy_since(&self, earlier: &Cores, cpus: &[usize]) -> (f64, f64) {
        let (mut busy, mut total) = (0u64, 0u64);
        for &c in cpus {
            if let (Some(a), Some(b)) = (earlier.0.get(c), self.0.get(c)) {
                busy += b.0.saturating_sub(a.0);
                total += b.1.saturating_sub(a.1);
            }
        }
        (
            busy as f64 / ticks_per_second(),
            busy as f64 / total.max(1) as f64,
        )
    }
}

/// Per CPU (`cpuN` lines, in order): busy = user, nice, system, irq and softirq; total adds
/// idle and iowait. Steal (time the hypervisor gave elsewhere) is in neither.
fn cores_of(stat: &str) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for line in stat.lines() {
        let Some(rest) = line.strip_prefix("cpu") else {
            continue;
        };
        if !rest.starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        let f: Vec<u64> = rest
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        let busy = at(0) + at(1) + at(2) + at(5) + at(6);
        out.push((busy, busy + at(3) + at(4)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_times_after_a_name_with_parentheses() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 3 0";
        assert_eq!(stat_ticks(stat), Some((1234, 567)));
        assert_eq!(stat_ticks("42 (x) S 1"), None);
    }

    #[test]
    fn reads_busy_and_total_time_per_core() {
        let stat = "cpu  10 0 5 100 2 0 1 7 0 0\ncpu0 4 1 2 50 1 3 1 5 0 0\ncpu1 6 0 3 50 1 0 0 2 0 0\nintr 1 2\n";
        assert_eq!(cores_of(stat), vec![(11, 62), (9, 60)]);
        let (a, b) = (
            Cores(vec![(0, 0), (10, 20)]),
            Cores(vec![(50, 100), (15, 40)]),
        );
        let (secs, fraction) = b.busy_since(&a, &[1]);
        assert!((fraction - 0.25).abs() < 1e-9);
        assert!((secs - 5.0 / ticks_per_second()).abs() < 1e-9);
        assert_eq!(b.busy_since(&a, &[0, 1]).1, 55.0 / 120.0);
    }

    #[test]
    fn this_process_is_counted_as_it_burns_cpu() {
        let me = std::process::id();
        let before = of(&[me]);
        let mut acc = 0u64;
        // Bounded: a tick is at most 10 ms, far fewer rounds than this.
        for round in 0..2_000u64 {
            for i in 0..1_000_000u64 {
                acc = std::hint::black_box(acc.wrapping_add(i * round));
            }
            if of(&[me]).total() > before.total() {
                break;
            }
        }
        assert!(of(&[me]).since(before).total() > 0.0, "{acc}");
        assert_eq!(of(&[u32::MAX]), Seconds::default());
        assert!(!descendants(me).contains(&me));
    }
}
