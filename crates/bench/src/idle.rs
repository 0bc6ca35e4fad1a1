//! What idle instances cost: spares of a warm pool, filled up to a count per driver and all
//! running at once, measured by their proportional set size and the drop of MemAvailable; and
//! the check that fails when an idle instance grows past what docs/BENCHMARKS.md records.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;
use warden_test_support::{Launch, Warden};

use crate::apps::{instance_image, APP};

/// The most PSS an idle demo app instance may hold per driver, in MiB: the figures recorded in
/// docs/BENCHMARKS.md ("Idle instances: the allocator per role", with the instance image) with
/// a tenth for noise. `--check` fails above them.
const PSS_BOUND_MIB: [(&str, f64); 2] = [("process", 0.37), ("sandbox", 0.72)];

/// Fills up to `n` idle instances per driver, prints the table and, with `check`, fails if an
/// idle instance holds more than [`PSS_BOUND_MIB`].
pub(crate) fn report(warden: &Path, n: u32, check: bool) -> anyhow::Result<()> {
    println!(
        "\nIdle instances (up to {n} per driver, spares of a warm pool, all running at once):\n"
    );
    println!("| driver | instances held (measured) | fill ended because | PSS per instance MiB | MemAvailable drop per instance MiB | tasks per instance | fit in memory | fit under pid_max/threads-max | limit of this machine (extrapolated) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut over = Vec::new();
    for (driver, bound) in PSS_BOUND_MIB {
        let i = idle_memory(warden, driver, n)?;
        println!(
            "| {driver} | {} | {} | {:.2} | {:.2} | {:.1} | {:.0} | {:.0} | {:.0} |",
            i.held,
            i.ended,
            i.pss_mib,
            i.available_drop_mib,
            i.tasks,
            i.by_memory,
            i.by_tasks,
            i.by_memory.min(i.by_tasks)
        );
        if i.held == 0 {
            // Nothing to measure, and a check of nothing would pass.
            bail!(
                "no idle {driver} instance started during the fill ({})",
                i.ended
            );
        }
        if i.pss_mib > bound {
            over.push(format!(
                "an idle {driver} instance holds {:.2} MiB PSS, more than its bound of \
                 {bound:.2} MiB (docs/BENCHMARKS.md)",
                i.pss_mib
            ));
        }
    }
    if check && !over.is_empty() {
        bail!(
            "{}; find what grew with /proc/<pid>/smaps of an idle instance",
            over.join("; ")
        );
    }
    if check {
        println!(
            "\ncheck passed: no idle instance holds more than its bound {PSS_BOUND_MIB:?} (MiB)"
        );
    }
    Ok(())
}

fn mem_available_mib() -> anyhow::Result<f64> {
    read_meminfo_mib("MemAvailable:")
}

fn read_meminfo_mib(field: &str) -> anyhow::Result<f64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
        .with_context(|| format!("no {field} in /proc/meminfo"))
}

/// Tasks (threads) on the machine, as `/proc/loadavg`'s fourth field counts them.
fn count_tasks() -> u64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| {
            let field = s.split_whitespace().nth(3)?;
            field.split_once('/')?.1.parse().ok()
        })
        .unwrap_or(0)
}

/// Proportional set size (MiB) and tasks (threads) of every process in the process groups led
/// by `pids`.
fn usage_of_groups(pids: &[i32]) -> (f64, u64) {
    let (mut kib, mut tasks) = (0.0, 0);
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(pgid) = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid))) else {
            continue;
        };
        if !pids.contains(&pgid.as_raw()) {
            continue;
        }
        tasks += std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.count() as u64)
            .unwrap_or(1);
        let Ok(rollup) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
            continue;
        };
        kib += rollup
            .lines()
            .find_map(|l| l.strip_prefix("Pss:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0);
    }
    (kib / 1024.0, tasks)
}

fn read_number(path: &str) -> Option<f64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// What idle instances of one driver cost.
struct Idle {
    /// Idle instances running at once at the end of the fill.
    held: usize,
    /// Why the fill stopped.
    ended: String,
    pss_mib: f64,
    available_drop_mib: f64,
    tasks: f64,
    /// Instances that fit in the memory available before they started.
    by_memory: f64,
    /// Instances that fit under the kernel's pid and thread limits.
    by_tasks: f64,
}

/// Starts up to `n` idle spares with `driver`, stopping early at the safety floors, and
/// measures what is running at the end.
fn idle_memory(warden: &Path, driver: &str, n: u32) -> anyhow::Result<Idle> {
    let max = (n + 16).to_string();
    let w = Launch::new(warden)
        .log("info")
        .no_demo()
        .arg("--max-instances")
        .arg(&max)
        .start();
    // Let warden's own start settle before the baseline.
    std::thread::sleep(Duration::from_secs(1));
    let before = mem_available_mib()?;
    let total = read_meminfo_mib("MemTotal:")?;
    let task_limit = read_number("/proc/sys/kernel/pid_max")
        .unwrap_or(32768.0)
        .min(read_number("/proc/sys/kernel/threads-max").unwrap_or(f64::MAX));
    // A pool holds at most 256 spares per label per node (warden_core::MAX_POOL): spread the
    // fill over labels.
    let per_label = 256;
    let warm: serde_json::Map<String, serde_json::Value> = (0..n.div_ceil(per_label))
        .map(|k| {
            let count = (n - k * per_label).min(per_label);
            (format!("fill-{k}"), json!(count))
        })
        .collect();
    // The fill's labels are the levels of a lattice of its own (this warden has no users).
    let levels: Vec<&String> = warm.keys().collect();
    let r = w.api(
        "PUT",
        "/v1/lattice",
        Some(json!({ "levels": levels, "categories": [] })),
    );
    if r.status >= 300 {
        bail!("setting the fill's lattice: {}", r.text());
    }
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({
            "name": APP,
            "command": [instance_image(warden), "demo-app"],
            "driver": driver,
            "start": "warm",
            "warm": warm,
            "max_instances": n,
            // Thousands of starts at once on two cores: readiness may take a while.
            "start_timeout_ms": 120_000,
        })),
    );
    if r.status != 201 {
        bail!("creating the app: {}", r.text());
    }
    let spares = |w: &Warden| -> Vec<i32> {
        w.instances()
            .iter()
            .filter(|i| i["state"] == "spare")
            .filter_map(|i| i["pid"].as_i64().map(|p| p as i32))
            .collect()
    };
    let (mut best, mut best_at) = (0, Instant::now());
    let ended = loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = spares(&w).len();
        if now >= n as usize {
            break "target reached".to_owned();
        }
        if now > best {
            (best, best_at) = (now, Instant::now());
        }
        let available = mem_available_mib()?;
        if available < total / 4.0 {
            break format!("memory floor: MemAvailable {available:.0} of {total:.0} MiB");
        }
        let tasks = count_tasks() as f64;
        if tasks > task_limit / 2.0 {
            break format!("task floor: {tasks:.0} tasks of {task_limit:.0}");
        }
        if best_at.elapsed() > Duration::from_secs(60) {
            break format!("no new spare for 60 s at {best}");
        }
    };
    // Measured as it stands; a pool stopped at a floor may still grow a little meanwhile.
    let pids = spares(&w);
    std::thread::sleep(Duration::from_secs(1));
    let after = mem_available_mib()?;
    let (pss, tasks) = usage_of_groups(&pids);
    let held = pids.len();
    let n = held.max(1) as f64;
    let tasks = tasks as f64 / n;
    let pss_mib = pss / n;
    Ok(Idle {
        held,
        ended,
        pss_mib,
        available_drop_mib: (before - after) / n,
        tasks,
        by_memory: before / pss_mib.max(0.001),
        by_tasks: task_limit / tasks.max(1.0),
    })
}
