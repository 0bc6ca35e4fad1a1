//! Seed 002's experiment: the first request of a user whose label has no instance yet, for each
//! start path (JIT, slot pool, warm pool), with warden restarted for every sample; the agent's
//! own start figures; the bare fork-exec floor of the same app binary; and what idle instances
//! cost in memory.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;
use warden_test_support::{request, wait_until, Launch, Warden};

use crate::percentile;

/// Settings of `warden-bench starts`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Samples per start path (warden is restarted for each)
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Idle instances to fill the machine with, per driver; the fill stops earlier if
    /// MemAvailable would fall below a quarter of MemTotal or tasks pass half of pid_max
    #[arg(long, default_value_t = 2000)]
    idle: u32,
    /// The warden binary to measure
    #[arg(long, default_value = "target/release/warden")]
    warden: std::path::PathBuf,
    /// Directory for the CSV files
    #[arg(long, default_value = "bench/out")]
    out: std::path::PathBuf,
}

const APP: &str = "bench";
const USER: &str = "alice";
const LABEL: &str = "SECRET";
const WAIT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, PartialEq)]
enum Start {
    Jit,
    /// JIT on a warden told not to use cgroups: what the instance's cgroups cost a JIT start.
    JitRlimits,
    Slot,
    Warm,
}

impl Start {
    /// The app's start path, as the spec and the agent's metrics name it.
    fn metric_path(self) -> &'static str {
        match self {
            Self::Jit | Self::JitRlimits => "jit",
            Self::Slot => "slot",
            Self::Warm => "warm",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Jit => "jit",
            Self::JitRlimits => "jit-rlimits",
            Self::Slot => "slot",
            Self::Warm => "warm",
        }
    }
}

/// One sample of one start path.
struct Sample {
    first_ms: f64,
    second_ms: f64,
    /// The agent's start time for this path (start_seconds).
    start_ms: f64,
    /// Mean slot preparation time in this run (slot path only).
    prepare_ms: Option<f64>,
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    if !args.warden.exists() {
        bail!(
            "{} does not exist; build it with `cargo build --release`",
            args.warden.display()
        );
    }
    // Run and named in app commands at a path that process instances (never root) can run.
    let warden = &warden_test_support::runnable_by_instances(&args.warden);
    std::fs::create_dir_all(&args.out)?;
    let runs = args.runs.clamp(1, 1000);
    let mut rows = vec!["path,run,first_ms,second_ms,start_ms,prepare_ms".to_owned()];
    let mut all = Vec::new();
    for path in [Start::Jit, Start::JitRlimits, Start::Slot, Start::Warm] {
        let mut samples = Vec::new();
        for run in 0..runs {
            let s = sample(warden, path).with_context(|| format!("{} run {run}", path.name()))?;
            rows.push(format!(
                "{},{run},{:.3},{:.3},{:.3},{}",
                path.name(),
                s.first_ms,
                s.second_ms,
                s.start_ms,
                s.prepare_ms.map(|p| format!("{p:.3}")).unwrap_or_default()
            ));
            samples.push(s);
        }
        all.push((path, samples));
    }
    let floor = fork_exec_floor(warden, runs)?;
    for (i, ms) in floor.iter().enumerate() {
        rows.push(format!("fork_exec,{i},{ms:.3},,,"));
    }
    let csv = args.out.join("starts.csv");
    std::fs::write(&csv, rows.join("\n") + "\n")
        .with_context(|| format!("writing {}", csv.display()))?;

    println!("End-to-end first request (session token, instance start, first response), {runs} samples each:\n");
    println!("| start path | seed 002 mean ms | mean ms | sd ms | median ms | p90 ms | min ms | max ms |");
    println!("|---|---|---|---|---|---|---|---|");
    for (path, samples) in &all {
        let seed = match path {
            Start::Jit | Start::JitRlimits => "63.15",
            Start::Slot => "29.35",
            Start::Warm => "4.45",
        };
        let v: Vec<f64> = samples.iter().map(|s| s.first_ms).collect();
        println!("| {} | {seed} | {} |", path.name(), stats(&v));
    }
    let second: Vec<f64> = all
        .iter()
        .flat_map(|(_, s)| s.iter().map(|s| s.second_ms))
        .collect();
    println!(
        "| second request (instance running) | ~4 | {} |",
        stats(&second)
    );

    println!("\nMicrobenchmarks (the agent's own figures, from /metrics of the same runs):\n");
    println!("| step | mean ms | sd ms | median ms | p90 ms | min ms | max ms |");
    println!("|---|---|---|---|---|---|---|");
    for (path, samples) in &all {
        let what = match path {
            Start::Jit => "JIT: create the sandbox and start the app until it accepts",
            Start::JitRlimits => "JIT without cgroups (rlimits only): the same",
            Start::Slot => "slot: start the app in a prepared sandbox until it accepts",
            Start::Warm => "warm: hand out a running spare",
        };
        let v: Vec<f64> = samples.iter().map(|s| s.start_ms).collect();
        println!("| {what} | {} |", stats(&v));
    }
    let prep: Vec<f64> = all
        .iter()
        .flat_map(|(_, s)| s.iter().filter_map(|s| s.prepare_ms))
        .collect();
    if !prep.is_empty() {
        println!(
            "| prepare one slot (namespaces, mounts, loopback) | {} |",
            stats(&prep)
        );
    }
    println!(
        "| floor: fork-exec of the same binary until it accepts and answers 200 | {} |",
        stats(&floor)
    );

    println!(
        "\nIdle instances (up to {} per driver, spares of a warm pool, all running at once):\n",
        args.idle
    );
    println!("| driver | instances held (measured) | fill ended because | PSS per instance MiB | MemAvailable drop per instance MiB | tasks per instance | fit in memory | fit under pid_max/threads-max | limit of this machine (extrapolated) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for driver in ["process", "sandbox"] {
        let i = idle_memory(warden, driver, args.idle)?;
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
    }
    println!("\nsamples in {}", csv.display());
    Ok(())
}

fn stats(v: &[f64]) -> String {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len() as f64;
    let mean = s.iter().sum::<f64>() / n;
    let sd = (s.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
    format!(
        "{mean:.2} | {sd:.2} | {:.2} | {:.2} | {:.2} | {:.2}",
        percentile(&s, 0.5),
        percentile(&s, 0.9),
        s[0],
        s[s.len() - 1]
    )
}

/// One fresh warden, one app with `path`, one timed first request and one second request.
fn sample(warden: &Path, path: Start) -> anyhow::Result<Sample> {
    let mut launch = Launch::new(warden).log("info");
    if path == Start::JitRlimits {
        launch = launch.arg("--cgroups").arg("off");
    }
    let w = launch.start();
    let mut spec = json!({
        "name": APP,
        "command": [warden, "demo-app"],
        "driver": "sandbox",
        "start": path.metric_path(),
    });
    match path {
        Start::Jit | Start::JitRlimits => {}
        Start::Slot => spec["slots"] = json!(1),
        Start::Warm => spec["warm"] = json!({ LABEL: 1 }),
    }
    let r = w.api("POST", "/v1/apps", Some(spec));
    if r.status != 201 {
        bail!("creating the app: {}", r.text());
    }
    let token = crate::gateway::login(&w, USER)?;
    let pool = match path {
        Start::Jit | Start::JitRlimits => None,
        Start::Slot => Some(format!(
            "warden_agent_pool_ready{{app=\"{APP}\",kind=\"slot\",label=\"\"}}"
        )),
        Start::Warm => Some(format!(
            "warden_agent_pool_ready{{app=\"{APP}\",kind=\"spare\",label=\"{LABEL}\"}}"
        )),
    };
    if let Some(gauge) = pool {
        wait_until("the pool to fill", WAIT, || {
            (metric(&w, &gauge) >= Some(1.0)).then_some(())
        });
    }
    let url = format!("{}/apps/{APP}/", w.gateway);
    let auth = format!("Bearer {token}");
    let headers = [("authorization", auth.as_str())];
    let t = Instant::now();
    let first = request("GET", &url, &headers, b"");
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let second = request("GET", &url, &headers, b"");
    let second_ms = t.elapsed().as_secs_f64() * 1e3;
    if first.status != 200 || second.status != 200 {
        bail!(
            "answers {} / {}: {}",
            first.status,
            second.status,
            first.text()
        );
    }
    let start = |p: &str| {
        let sum = metric(
            &w,
            &format!("warden_agent_start_seconds_sum{{path=\"{p}\"}}"),
        );
        let n = metric(
            &w,
            &format!("warden_agent_start_seconds_count{{path=\"{p}\"}}"),
        );
        sum.zip(n).map(|(s, n)| s / n * 1e3)
    };
    let start_ms = start(path.metric_path()).context("the agent reported no start")?;
    let prepare_ms = (path == Start::Slot)
        .then(|| {
            let sum = metric(&w, "warden_agent_slot_prepare_seconds_sum")?;
            let n = metric(&w, "warden_agent_slot_prepare_seconds_count")?;
            Some(sum / n * 1e3)
        })
        .flatten();
    Ok(Sample {
        first_ms,
        second_ms,
        start_ms,
        prepare_ms,
    })
}

fn metric(w: &Warden, name_and_labels: &str) -> Option<f64> {
    let text = request("GET", &format!("{}/metrics", w.api), &[], b"").text();
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
}

/// The same app binary started by hand: fork, exec, bind, accept, first 200.
fn fork_exec_floor(warden: &Path, runs: usize) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::new();
    for _ in 0..runs {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let t = Instant::now();
        let mut child = Command::new(warden)
            .arg("demo-app")
            .env_clear()
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("the demo app did not accept within 10 s");
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let r = request("GET", &format!("http://127.0.0.1:{port}/"), &[], b"");
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let _ = child.kill();
        let _ = child.wait();
        if r.status != 200 {
            bail!("the demo app answered {}", r.status);
        }
        out.push(ms);
    }
    Ok(out)
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
            "command": [warden, "demo-app"],
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
