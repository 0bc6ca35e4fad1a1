//! Seed 002's experiment: the first request of a user whose label has no instance yet, for each
//! start path (JIT, slot pool, warm pool), with warden restarted for every sample; the agent's
//! own start figures; the bare fork-exec floor of the same app binary; and what idle instances
//! cost in memory (see `idle.rs`).

use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;
use warden_test_support::{request, wait_until, Launch, Warden};

use crate::apps::{instance_image, APP};
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
    /// Measure only the idle instances: no start paths, no floor
    #[arg(long)]
    idle_only: bool,
    /// The start paths to measure (any of jit, jit-rlimits, slot, warm); `--idle 0` skips the
    /// idle instances, for a quick look at one path
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "jit,jit-rlimits,slot,warm"
    )]
    paths: Vec<String>,
    /// Fail if an idle instance of either driver holds more memory (PSS) than
    /// docs/BENCHMARKS.md records
    #[arg(long)]
    check: bool,
    /// Before each measured request, start an instance of another app the same way through
    /// the same warden: the measured request then finds warden's own code and data warm, as
    /// on a warden that has served before, instead of a process started a moment ago
    #[arg(long)]
    warm_up: bool,
}

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
    /// The gateway's own phases of the first request: waiting for the instance (`start`) and
    /// from then until the app's response head (`upstream`: the connection and the answer).
    gateway_start_ms: f64,
    gateway_upstream_ms: f64,
    /// The instance was seen ready by its sandbox init's word (not by the agent's polls).
    told: bool,
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    if !args.warden.exists() {
        bail!(
            "{} does not exist; build it with `cargo build --release`",
            args.warden.display()
        );
    }
    if !instance_image(&args.warden).exists() {
        bail!(
            "{} does not exist; `cargo build --release -p warden` builds it beside warden",
            instance_image(&args.warden).display()
        );
    }
    // Run and named in app commands at a path that process instances (never root) can run.
    let warden = &warden_test_support::runnable_by_instances(&args.warden);
    if args.idle_only {
        return crate::idle::report(warden, args.idle, args.check);
    }
    std::fs::create_dir_all(&args.out)?;
    let runs = args.runs.clamp(1, 1000);
    let mut rows = vec![
        "path,run,first_ms,second_ms,start_ms,prepare_ms,gateway_start_ms,gateway_upstream_ms"
            .to_owned(),
    ];
    let mut all = Vec::new();
    let paths = [Start::Jit, Start::JitRlimits, Start::Slot, Start::Warm];
    for name in &args.paths {
        if !paths.iter().any(|p| p.name() == name) {
            bail!("no start path {name:?}: the paths are jit, jit-rlimits, slot and warm");
        }
    }
    for path in paths
        .into_iter()
        .filter(|p| args.paths.iter().any(|n| n == p.name()))
    {
        let mut samples = Vec::new();
        for run in 0..runs {
            let s = sample(warden, path, args.warm_up)
                .with_context(|| format!("{} run {run}", path.name()))?;
            rows.push(format!(
                "{},{run},{:.3},{:.3},{:.3},{},{:.3},{:.3}",
                path.name(),
                s.first_ms,
                s.second_ms,
                s.start_ms,
                s.prepare_ms.map(|p| format!("{p:.3}")).unwrap_or_default(),
                s.gateway_start_ms,
                s.gateway_upstream_ms,
            ));
            samples.push(s);
        }
        all.push((path, samples));
    }
    let floor = fork_exec_floor(warden, runs)?;
    for (i, f) in floor.iter().enumerate() {
        // As for the paths: the whole first request, the second, and (as `upstream`) the
        // first request by itself.
        rows.push(format!(
            "fork_exec,{i},{:.3},{:.3},,,,{:.3}",
            f.ms, f.second_ms, f.first_ms
        ));
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
    for (path, samples) in &all {
        let v: Vec<f64> = samples.iter().map(|s| s.gateway_start_ms).collect();
        println!(
            "| {}: the gateway waits for the instance (phase start) | {} |",
            path.name(),
            stats(&v)
        );
        let v: Vec<f64> = samples.iter().map(|s| s.gateway_upstream_ms).collect();
        println!(
            "| {}: then connects and has the app's answer (phase upstream) | {} |",
            path.name(),
            stats(&v)
        );
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
    let v: Vec<f64> = floor.iter().map(|f| f.ms).collect();
    println!(
        "| floor: fork-exec of the same binary until it accepts and answers 200 | {} |",
        stats(&v)
    );
    let v: Vec<f64> = floor.iter().map(|f| f.first_ms).collect();
    println!(
        "| floor: its first request by itself (a new connection, the app's code cold) | {} |",
        stats(&v)
    );
    let v: Vec<f64> = floor.iter().map(|f| f.second_ms).collect();
    println!(
        "| floor: its second request (a new connection) | {} |",
        stats(&v)
    );

    for (path, samples) in &all {
        if matches!(path, Start::Warm) {
            continue;
        }
        let told = samples.iter().filter(|s| s.told).count();
        println!(
            "\n{}: {told} of {} starts seen ready by init's word, the rest by the agent's polls",
            path.name(),
            samples.len()
        );
    }
    if args.idle > 0 {
        crate::idle::report(warden, args.idle, args.check)?;
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

/// One fresh warden, one app with `path`, one timed first request and one second request;
/// with `warm_up`, a first request to another app of the same spec before them.
fn sample(warden: &Path, path: Start, warm_up: bool) -> anyhow::Result<Sample> {
    let mut launch = Launch::new(warden).log("info");
    if path == Start::JitRlimits {
        launch = launch.arg("--cgroups").arg("off");
    }
    let w = launch.start();
    let apps: &[&str] = if warm_up { &[WARM_UP, APP] } else { &[APP] };
    for app in apps {
        create_app(&w, path, app, warden)?;
    }
    let token = crate::gateway::login(&w, USER)?;
    let auth = format!("Bearer {token}");
    let headers = [("authorization", auth.as_str())];
    pools_full(&w, path, apps);
    if warm_up {
        let r = request(
            "GET",
            &format!("{}/apps/{WARM_UP}/", w.gateway),
            &headers,
            b"",
        );
        if r.status != 200 {
            bail!("the warm-up request answered {}: {}", r.status, r.text());
        }
        // The warm-up app's pool fills again first: that work must not share the machine
        // with the measured request.
        pools_full(&w, path, apps);
    }
    let url = format!("{}/apps/{APP}/", w.gateway);
    let before = Counters::read(&w, path);
    let t = Instant::now();
    let first = request("GET", &url, &headers, b"");
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    // Read before the second request adds to them.
    let after = Counters::read(&w, path);
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
    let d = after.since(&before);
    if d.starts < 1.0 {
        bail!("the agent reported no start for the measured request");
    }
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
        start_ms: d.start_s / d.starts * 1e3,
        prepare_ms,
        gateway_start_ms: d.phase_start_s * 1e3,
        gateway_upstream_ms: d.phase_upstream_s * 1e3,
        told: d.told >= 1.0,
    })
}

/// Creates `app`, the bench's demo app on `path`'s start path.
fn create_app(w: &Warden, path: Start, app: &str, warden: &Path) -> anyhow::Result<()> {
    let mut spec = json!({
        "name": app,
        "command": [instance_image(warden), "demo-app"],
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
    Ok(())
}

/// Waits until the pool of each of `apps` on `path` holds its slot or spare.
fn pools_full(w: &Warden, path: Start, apps: &[&str]) {
    for app in apps {
        let gauge = match path {
            Start::Jit | Start::JitRlimits => continue,
            Start::Slot => {
                format!("warden_agent_pool_ready{{app=\"{app}\",kind=\"slot\",label=\"\"}}")
            }
            Start::Warm => {
                format!("warden_agent_pool_ready{{app=\"{app}\",kind=\"spare\",label=\"{LABEL}\"}}")
            }
        };
        wait_until("the pool to fill", WAIT, || {
            (metric(w, &gauge) >= Some(1.0)).then_some(())
        });
    }
}

/// The app started first with `--warm-up`.
const WARM_UP: &str = "bench-warm-up";

/// The counters a sample reads around its measured request; absent ones count as 0.
struct Counters {
    phase_start_s: f64,
    phase_upstream_s: f64,
    start_s: f64,
    starts: f64,
    told: f64,
}

impl Counters {
    fn read(w: &Warden, path: Start) -> Self {
        let m = |name: &str| metric(w, name).unwrap_or(0.0);
        let p = path.metric_path();
        Self {
            phase_start_s: m("warden_gateway_phase_seconds_sum{phase=\"start\"}"),
            phase_upstream_s: m("warden_gateway_phase_seconds_sum{phase=\"upstream\"}"),
            start_s: m(&format!("warden_agent_start_seconds_sum{{path=\"{p}\"}}")),
            starts: m(&format!("warden_agent_start_seconds_count{{path=\"{p}\"}}")),
            told: m("warden_agent_ready_seen_total{how=\"told\"}"),
        }
    }

    fn since(&self, before: &Self) -> Self {
        Self {
            phase_start_s: self.phase_start_s - before.phase_start_s,
            phase_upstream_s: self.phase_upstream_s - before.phase_upstream_s,
            start_s: self.start_s - before.start_s,
            starts: self.starts - before.starts,
            told: self.told - before.told,
        }
    }
}

fn metric(w: &Warden, name_and_labels: &str) -> Option<f64> {
    let text = request("GET", &format!("{}/metrics", w.api), &[], b"").text();
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
}

/// The same app binary started by hand: fork, exec, bind, accept, first 200.
fn fork_exec_floor(warden: &Path, runs: usize) -> anyhow::Result<Vec<Floor>> {
    let mut out = Vec::new();
    for _ in 0..runs {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let t = Instant::now();
        let mut child = Command::new(instance_image(warden))
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
        let url = format!("http://127.0.0.1:{port}/");
        let asked = Instant::now();
        let r = request("GET", &url, &[], b"");
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let first_ms = asked.elapsed().as_secs_f64() * 1e3;
        let asked = Instant::now();
        let again = request("GET", &url, &[], b"");
        let second_ms = asked.elapsed().as_secs_f64() * 1e3;
        let _ = child.kill();
        let _ = child.wait();
        if r.status != 200 || again.status != 200 {
            bail!("the demo app answered {} / {}", r.status, again.status);
        }
        out.push(Floor {
            ms,
            first_ms,
            second_ms,
        });
    }
    Ok(out)
}

/// One start of the bare app, and its first two requests (each on a new connection) by
/// themselves: the first pays for the app's own code and data touched for the first time,
/// which no platform can hand out warm without asking the app something first.
struct Floor {
    ms: f64,
    first_ms: f64,
    second_ms: f64,
}
