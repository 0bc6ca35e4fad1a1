//! Seed 001's experiment, side by side: warden, nginx (auth_basic + proxy_pass) and haproxy
//! (http-request auth) in front of one upstream, measured with wrk at 50..3200 connections.
//!
//! Workloads: Basic authentication with 100% valid, 100% invalid and 89%/11% mixed credentials;
//! authorisation by session cookie of an admin (200) and of a non-admin (403). The peers keep
//! the password in plain text (their fastest setting); warden keeps only an Argon2id hash.
//! A fourth server, the floor ([`crate::relay`]), relays bytes without any HTTP work: what no
//! proxy can beat in the same run.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use serde_json::json;
use warden_test_support::http::basic;
use warden_test_support::{request, Launch, Warden};

use crate::{cpu, wrk};

mod peers;

use peers::{floor, haproxy, nginx};
pub(crate) use peers::{free_port, start_nginx, upstream, wait_listening, Peer};

/// Flags of `warden-bench gateway`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The warden binary to measure
    #[arg(long, default_value = "target/release/warden")]
    warden: PathBuf,
    /// Seconds per wrk run
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Connection counts
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "50,100,200,400,800,1600,3200"
    )]
    connections: Vec<usize>,
    /// Directory for CSV and the work files of the peers
    #[arg(long, default_value = "bench/out")]
    out: PathBuf,
    /// Sweeps over every cell; each cell reports the round with its median throughput, and the
    /// order of the servers rotates between rounds. One round is about 12 minutes at 5 s a run.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    rounds: u32,
    /// Extra flags for `warden up` (for example `--warden-arg=--audit --warden-arg=off`),
    /// repeatable
    #[arg(long = "warden-arg", allow_hyphen_values = true)]
    warden_args: Vec<String>,
    /// Also measure a second warden with `--audit off` as its own server
    /// (`warden-audit-off`), in the same rotation: what the audit trail costs, in one run
    #[arg(long)]
    audit_off_too: bool,
}

/// A warden under measurement: the demo app and an admin app, and two users signed in.
struct Measured {
    w: Warden,
    password: String,
    admin_token: String,
    user_token: String,
}

/// Starts warden with `extra` flags after the bench's own and sets up what the workloads ask.
fn start_warden(args: &Args, extra: &[&str]) -> anyhow::Result<Measured> {
    // warden's own default log filter, as in production.
    let mut launch = Launch::new(&args.warden)
        .log("info")
        .arg("--max-connections")
        .arg("8000");
    for a in args
        .warden_args
        .iter()
        .map(String::as_str)
        .chain(extra.iter().copied())
    {
        launch = launch.arg(a);
    }
    let w = launch.start();
    let password = w.password("alice");
    crate::apps::demo_as_process(&w, &args.warden)?;
    let admin_spec = json!({"name": "admin", "driver": "process", "command": [warden_test_support::runnable_by_instances(&args.warden).display().to_string(), "demo-app"], "groups": ["admin"]});
    if w.api("POST", "/v1/apps", Some(admin_spec)).status != 201 {
        bail!("could not register the admin app");
    }
    let (admin_token, user_token) = (login(&w, "carol")?, login(&w, "alice")?);
    Ok(Measured {
        w,
        password,
        admin_token,
        user_token,
    })
}

/// CPU time per request of one run, in microseconds.
#[derive(Debug, Clone, Copy)]
struct Cost {
    proxy_user_us: f64,
    proxy_system_us: f64,
    upstream_us: f64,
    wrk_us: f64,
}

impl Cost {
    fn per_request(proxy: cpu::Seconds, upstream: f64, wrk: f64, requests: u64) -> Cost {
        let per = |secs: f64| secs * 1e6 / requests.max(1) as f64;
        Cost {
            proxy_user_us: per(proxy.user),
            proxy_system_us: per(proxy.system),
            upstream_us: per(upstream),
            wrk_us: per(wrk),
        }
    }
}

/// How to ask one server for one workload.
struct Target {
    url: String,
    headers: Vec<String>,
    script: Option<PathBuf>,
    expect: u16,
    /// The valid Basic credentials this server knows (the probe of a scripted workload sends them).
    good: String,
}

/// The name of the second warden `--audit-off-too` measures.
const OFF: &str = "warden-audit-off";

/// What a server accepts: valid Basic credentials, an admin's and a user's session token.
struct Creds {
    good: String,
    admin: String,
    user: String,
}

fn mixed_script(
    dir: &Path,
    name: &str,
    path: &str,
    good: &str,
    bad: &str,
) -> anyhow::Result<PathBuf> {
    let script = format!(
        r#"-- 89% valid, 11% invalid credentials, chosen per request (seed 001).
local good = "{good}"
local bad = "{bad}"
request = function()
  local auth = good
  if math.random() < 0.11 then auth = bad end
  return wrk.format("GET", "{path}", {{ ["Authorization"] = auth }})
end
"#
    );
    let p = dir.join(format!("mixed-{name}.lua"));
    std::fs::write(&p, script)?;
    Ok(p)
}

pub(crate) fn login(w: &Warden, user: &str) -> anyhow::Result<String> {
    let r = request(
        "POST",
        &format!("{}/login", w.gateway),
        &[("authorization", &basic(user, &w.password(user)))],
        b"",
    );
    r.json()["token"]
        .as_str()
        .map(str::to_owned)
        .context("login failed")
}

/// Checks that the binary to measure exists and makes an empty work directory `out/name`.
pub(crate) fn prepare(warden: &Path, out: &Path, name: &str) -> anyhow::Result<PathBuf> {
    if !warden.exists() {
        bail!(
            "{} does not exist; build it with `cargo build --release`",
            warden.display()
        );
    }
    let work = out.join(name);
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    Ok(std::fs::canonicalize(&work)?)
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let work = prepare(&args.warden, &args.out, "gateway-work")?;

    let m = start_warden(args, &[])?;
    let off = match args.audit_off_too {
        true => Some(start_warden(args, &["--audit", "off"])?),
        false => None,
    };
    let (w, pw, admin_token, user_token) = (&m.w, &m.password, &m.admin_token, &m.user_token);
    // The peers compare the cookie with the admin's token; warden looks the session up.
    let (up, up_port) = upstream(&args.warden)?;
    let (ngx, ngx_port) = nginx(&work, up_port, pw, admin_token)?;
    let (hap, hap_port) = haproxy(&work, up_port, pw, admin_token)?;
    let peers = [ngx.name, hap.name];

    let bad = basic("alice", "not-the-password");
    let user_cookie = format!("warden_session={user_token}");
    let (flo, flo_port) = floor(&work, up_port, &[(401, &bad), (403, &user_cookie)])?;
    let cookie = |t: &str| format!("Cookie: warden_session={t}");
    let mut targets: Vec<(&str, &str, Target)> = Vec::new();
    // Each server with the credentials it knows: the peers and the floor were given the first
    // warden's; a second warden has its own.
    let creds = |m: &Measured| Creds {
        good: basic("alice", &m.password),
        admin: m.admin_token.clone(),
        user: m.user_token.clone(),
    };
    let mut servers = vec![
        (
            "warden",
            w.gateway.clone(),
            "/apps/demo/",
            "/apps/admin/",
            creds(&m),
        ),
        (
            "nginx",
            format!("http://127.0.0.1:{ngx_port}"),
            "/auth/",
            "/authz/",
            creds(&m),
        ),
        (
            "haproxy",
            format!("http://127.0.0.1:{hap_port}"),
            "/auth/",
            "/authz/",
            creds(&m),
        ),
        (
            "floor",
            format!("http://127.0.0.1:{flo_port}"),
            "/auth/",
            "/authz/",
            creds(&m),
        ),
    ];
    if let Some(o) = &off {
        servers.push((
            OFF,
            o.w.gateway.clone(),
            "/apps/demo/",
            "/apps/admin/",
            creds(o),
        ));
    }
    let server_names: Vec<&str> = servers.iter().map(|s| s.0).collect();
    for (server, base, auth_path, authz_path, Creds { good, admin, user }) in servers {
        let t = |path: &str, headers: Vec<String>, expect| Target {
            url: format!("{base}{path}"),
            headers,
            script: None,
            expect,
            good: good.clone(),
        };
        targets.push((
            server,
            "auth-valid",
            t(auth_path, vec![format!("Authorization: {good}")], 200),
        ));
        targets.push((
            server,
            "auth-invalid",
            t(auth_path, vec![format!("Authorization: {bad}")], 401),
        ));
        let mut mixed = t(auth_path, vec![], 200);
        mixed.script = Some(mixed_script(&work, server, auth_path, &good, &bad)?);
        targets.push((server, "auth-mixed", mixed));
        targets.push((
            server,
            "authz-admin",
            t(authz_path, vec![cookie(&admin)], 200),
        ));
        targets.push((
            server,
            "authz-user",
            t(authz_path, vec![cookie(&user)], 403),
        ));
    }
    // One probe per target: each server must answer each workload as intended before it is timed.
    for (server, workload, t) in &targets {
        let headers: Vec<(String, String)> = t
            .headers
            .iter()
            .filter_map(|h| {
                h.split_once(": ")
                    .map(|(n, v)| (n.to_owned(), v.to_owned()))
            })
            .collect();
        let hv: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let hv = if t.script.is_some() {
            vec![("authorization", t.good.as_str())]
        } else {
            hv
        };
        let status = request("GET", &t.url, &hv, b"").status;
        if status != t.expect {
            bail!(
                "{server} answered {status} to the {workload} probe, expected {}",
                t.expect
            );
        }
    }

    let versions = format!(
        "{} / {} / {}",
        tool_version("nginx", &["-v"]),
        tool_version("haproxy", &["-v"]),
        tool_version("wrk", &["-v"])
    );
    let csv_path = args.out.join("gateway.csv");
    let rounds_path = args.out.join("gateway-rounds.csv");
    const HEADER: &str = "workload,server,connections,requests_per_sec,mean_latency_ms,requests,non_2xx,socket_errors,proxy_user_us,proxy_system_us,upstream_us,wrk_us";
    let row = |workload: &str, server: &str, c: usize, (o, cost): &(wrk::Outcome, Cost)| {
        format!(
            "{workload},{server},{c},{:.1},{:.3},{},{},{},{:.2},{:.2},{:.2},{:.2}",
            o.requests_per_sec,
            o.mean_latency_ms,
            o.requests,
            o.non_2xx,
            o.socket_errors,
            cost.proxy_user_us,
            cost.proxy_system_us,
            cost.upstream_us,
            cost.wrk_us
        )
    };
    // Whose CPU time is the proxy's and whose the upstream's, looked up before every run:
    // warden's instances are its descendants and may be replaced.
    let sides = |server: &str| -> (Vec<u32>, Vec<u32>) {
        let with_children = |pid: u32| {
            let mut v = vec![pid];
            v.extend(cpu::descendants(pid));
            v
        };
        match server {
            "warden" => (vec![w.pid()], cpu::descendants(w.pid())),
            OFF => {
                let pid = off.as_ref().map_or(0, |o| o.w.pid());
                (vec![pid], cpu::descendants(pid))
            }
            "nginx" => (with_children(ngx.child.id()), vec![up.child.id()]),
            "haproxy" => (with_children(hap.child.id()), vec![up.child.id()]),
            _ => (vec![flo.child.id()], vec![up.child.id()]),
        }
    };
    let workloads: Vec<&str> = targets
        .iter()
        .map(|(_, w, _)| *w)
        .fold(Vec::new(), |mut v, w| {
            if !v.contains(&w) {
                v.push(w);
            }
            v
        });
    let servers = server_names;
    // The servers of a cell run back to back, so they meet the same machine; the order
    // rotates between rounds so none is always first.
    // Outcomes by (workload, server, connections), in the order first measured.
    type Cell<'a> = ((&'a str, &'a str, usize), Vec<(wrk::Outcome, Cost)>);
    let mut seen: Vec<Cell> = Vec::new();
    let mut raw = format!("round,{HEADER}\n");
    // Requests the first warden answered in all runs: its audit log's size is per these.
    let mut served: u64 = 0;
    for round in 0..args.rounds as usize {
        for &c in &args.connections {
            for workload in &workloads {
                for k in 0..servers.len() {
                    let server = servers[(k + round) % servers.len()];
                    let Some((_, _, t)) = targets
                        .iter()
                        .find(|(s, w, _)| *s == server && w == workload)
                    else {
                        continue;
                    };
                    let (proxy, upstream) = sides(server);
                    let before = (cpu::of(&proxy), cpu::of(&upstream), cpu::reaped_children());
                    let o = wrk::run(&t.url, c, args.seconds, &t.headers, t.script.as_deref())?;
                    let cost = Cost::per_request(
                        cpu::of(&proxy).since(before.0),
                        cpu::of(&upstream).since(before.1).total(),
                        cpu::reaped_children().since(before.2).total(),
                        o.requests,
                    );
                    eprintln!("round {round} {workload:<13} {server:<8} c={c:<5} {:>10.0} req/s  {:>8.2} ms  non-2xx {:>8}  errors {}  proxy {:>5.1} us/req", o.requests_per_sec, o.mean_latency_ms, o.non_2xx, o.socket_errors, cost.proxy_user_us + cost.proxy_system_us);
                    if server == "warden" {
                        served += o.requests;
                    }
                    let o = (o, cost);
                    let _ = writeln!(raw, "{round},{}", row(workload, server, c, &o));
                    std::fs::write(&rounds_path, &raw)?;
                    let key = (*workload, server, c);
                    match seen.iter_mut().find(|(k, _)| *k == key) {
                        Some((_, v)) => v.push(o),
                        None => seen.push((key, vec![o])),
                    }
                }
            }
        }
    }
    let mut csv = format!("{HEADER}\n");
    for ((workload, server, c), mut outcomes) in seen {
        outcomes.sort_by(|a, b| a.0.requests_per_sec.total_cmp(&b.0.requests_per_sec));
        let median = &outcomes[outcomes.len() / 2];
        let _ = writeln!(csv, "{}", row(workload, server, c, median));
    }
    std::fs::write(&csv_path, &csv)?;
    let metrics = request("GET", &format!("{}/metrics", w.api), &[], b"").text();
    // One queue observation per Argon2id run: requests that wait for a run under way do not add.
    let runs: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("warden_gateway_phase_seconds_count{phase=\"queue\"}"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    println!(
        "wrote {} ({versions}); peers: {}; Argon2id runs in warden during the run: {runs}",
        csv_path.display(),
        peers.join(", ")
    );
    drop((ngx, hap, flo, off));
    // Stopped, warden flushes its last sums: the log then holds every record of the run.
    let mut m = m;
    m.w.stop();
    let bytes = dir_bytes(&m.w.dir.join("audit"));
    println!(
        "audit log: {bytes} bytes after {served} timed requests (and the set-up's): {:.0} bytes per million requests",
        bytes as f64 * 1e6 / served.max(1) as f64
    );
    Ok(())
}

/// The bytes of the files directly in `dir` (0 if it is missing).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

pub(crate) fn tool_version(tool: &str, args: &[&str]) -> String {
    Command::new(tool)
        .args(args)
        .output()
        .map(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned()
                + &String::from_utf8_lossy(&o.stderr);
            text.lines().next().unwrap_or("").trim().to_owned()
        })
        .unwrap_or_else(|_| format!("{tool}: not found"))
}
