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
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::json;
use warden_test_support::http::basic;
use warden_test_support::{request, wait_until, Launch, Warden};

use crate::{cpu, wrk};

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
}

pub(crate) struct Peer {
    pub name: &'static str,
    pub child: Child,
}

impl Drop for Peer {
    fn drop(&mut self) {
        // SIGTERM, not SIGKILL: nginx's master stops its workers only when asked politely.
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = self.child.wait();
    }
}

pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(crate) fn wait_listening(port: u16, what: &str) {
    wait_until(what, Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .map(|_| ())
    });
}

/// The upstream all three proxies forward to: the demo app binary, run on its own.
pub(crate) fn upstream(warden: &Path) -> anyhow::Result<(Peer, u16)> {
    let port = free_port()?;
    let child = Command::new(warden)
        .arg("demo-app")
        .env("PORT", port.to_string())
        .env("WARDEN_LABEL", "SECRET")
        .env("WARDEN_INSTANCE", "upstream")
        .stdout(Stdio::null())
        .spawn()
        .context("starting the upstream")?;
    wait_listening(port, "the upstream");
    Ok((
        Peer {
            name: "upstream",
            child,
        },
        port,
    ))
}

fn nginx(
    dir: &Path,
    upstream: u16,
    password: &str,
    admin_token: &str,
) -> anyhow::Result<(Peer, u16)> {
    let port = free_port()?;
    std::fs::write(dir.join("htpasswd"), format!("alice:{{PLAIN}}{password}\n"))?;
    let conf = format!(
        r#"worker_processes 2;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log error;
worker_rlimit_nofile 20000;
events {{ worker_connections 16384; multi_accept on; }}
http {{
  access_log off;
  map_hash_bucket_size 128;
  client_body_temp_path {dir}/nginx-body;
  proxy_temp_path {dir}/nginx-proxy;
  upstream app {{ server 127.0.0.1:{upstream}; keepalive 512; }}
  map $cookie_warden_session $is_admin {{ "{admin_token}" 1; default 0; }}
  server {{
    listen 127.0.0.1:{port} backlog=65535;
    keepalive_requests 1000000;
    location /auth/ {{
      auth_basic "bench";
      auth_basic_user_file {dir}/htpasswd;
      proxy_pass http://app/;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
    location /authz/ {{
      if ($is_admin = 0) {{ return 403; }}
      proxy_pass http://app/;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"#,
        dir = dir.display()
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf)?;
    start_nginx(Command::new("nginx"), &path, port)
}

/// Runs nginx in the foreground with `conf` (through `cmd`, which may be a CPU-pinning
/// wrapper) and waits until it listens on `port`.
pub(crate) fn start_nginx(mut cmd: Command, conf: &Path, port: u16) -> anyhow::Result<(Peer, u16)> {
    let child = cmd
        .args([
            "-e",
            "stderr",
            "-g",
            "daemon off; master_process on; user root;",
            "-c",
        ])
        .arg(conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting nginx (install it with `apt-get install nginx`)")?;
    wait_listening(port, "nginx");
    Ok((
        Peer {
            name: "nginx",
            child,
        },
        port,
    ))
}

fn haproxy(
    dir: &Path,
    upstream: u16,
    password: &str,
    admin_token: &str,
) -> anyhow::Result<(Peer, u16)> {
    let port = free_port()?;
    let conf = format!(
        r#"global
  maxconn 8000
  nbthread 2
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
  http-reuse always
userlist users
  user alice insecure-password {password}
frontend fe
  bind 127.0.0.1:{port}
  maxconn 8000
  acl is_auth path_beg /auth/
  acl is_authz path_beg /authz/
  http-request auth realm bench if is_auth !{{ http_auth(users) }}
  http-request deny deny_status 403 if is_authz !{{ req.cook(warden_session) -m str {admin_token} }}
  default_backend be
backend be
  server app 127.0.0.1:{upstream} maxconn 10000
"#
    );
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, conf)?;
    let child = Command::new("haproxy")
        .arg("-f")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting haproxy (install it with `apt-get install haproxy`)")?;
    wait_listening(port, "haproxy");
    Ok((
        Peer {
            name: "haproxy",
            child,
        },
        port,
    ))
}

/// The floor: `warden-bench relay` (this binary) in front of the same upstream, refusing the
/// reads that hold one of `refusals` (status, needle) without forwarding them.
fn floor(dir: &Path, upstream: u16, refusals: &[(u16, &str)]) -> anyhow::Result<(Peer, u16)> {
    let port = free_port()?;
    let file = dir.join("floor-refusals");
    let lines: String = refusals
        .iter()
        .map(|(status, needle)| format!("{status} {needle}\n"))
        .collect();
    std::fs::write(&file, lines)?;
    let child = Command::new(std::env::current_exe().context("finding warden-bench itself")?)
        .args(["relay", "--listen", &port.to_string()])
        .args(["--upstream", &upstream.to_string()])
        .arg("--refusals")
        .arg(&file)
        .stdout(Stdio::null())
        .spawn()
        .context("starting the floor relay")?;
    wait_listening(port, "the floor relay");
    Ok((
        Peer {
            name: "floor",
            child,
        },
        port,
    ))
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

    // warden's own default log filter, as in production.
    let mut launch = Launch::new(&args.warden)
        .log("info")
        .arg("--max-connections")
        .arg("8000");
    for a in &args.warden_args {
        launch = launch.arg(a);
    }
    let w = launch.start();
    let pw = w.password("alice");
    crate::apps::demo_as_process(&w, &args.warden)?;
    let admin_spec = json!({"name": "admin", "driver": "process", "command": [warden_test_support::runnable_by_instances(&args.warden).display().to_string(), "demo-app"], "groups": ["admin"]});
    if w.api("POST", "/v1/apps", Some(admin_spec)).status != 201 {
        bail!("could not register the admin app");
    }
    let (admin_token, user_token) = (login(&w, "carol")?, login(&w, "alice")?);
    // The peers compare the cookie with the admin's token; warden looks the session up.
    let (up, up_port) = upstream(&args.warden)?;
    let (ngx, ngx_port) = nginx(&work, up_port, &pw, &admin_token)?;
    let (hap, hap_port) = haproxy(&work, up_port, &pw, &admin_token)?;
    let peers = [ngx.name, hap.name];

    let good = basic("alice", &pw);
    let bad = basic("alice", "not-the-password");
    let user_cookie = format!("warden_session={user_token}");
    let (flo, flo_port) = floor(&work, up_port, &[(401, &bad), (403, &user_cookie)])?;
    let wg = w.gateway.clone();
    let cookie = |t: &str| format!("Cookie: warden_session={t}");
    let mut targets: Vec<(&str, &str, Target)> = Vec::new();
    for (server, base, auth_path, authz_path) in [
        ("warden", wg.clone(), "/apps/demo/", "/apps/admin/"),
        (
            "nginx",
            format!("http://127.0.0.1:{ngx_port}"),
            "/auth/",
            "/authz/",
        ),
        (
            "haproxy",
            format!("http://127.0.0.1:{hap_port}"),
            "/auth/",
            "/authz/",
        ),
        (
            "floor",
            format!("http://127.0.0.1:{flo_port}"),
            "/auth/",
            "/authz/",
        ),
    ] {
        let t = |path: &str, headers: Vec<String>, expect| Target {
            url: format!("{base}{path}"),
            headers,
            script: None,
            expect,
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
            t(authz_path, vec![cookie(&admin_token)], 200),
        ));
        targets.push((
            server,
            "authz-user",
            t(authz_path, vec![cookie(&user_token)], 403),
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
            vec![("authorization", good.as_str())]
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
    let servers = ["warden", "nginx", "haproxy", "floor"];
    // The servers of a cell run back to back, so they meet the same machine; the order
    // rotates between rounds so none is always first.
    // Outcomes by (workload, server, connections), in the order first measured.
    type Cell<'a> = ((&'a str, &'a str, usize), Vec<(wrk::Outcome, Cost)>);
    let mut seen: Vec<Cell> = Vec::new();
    let mut raw = format!("round,{HEADER}\n");
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
    drop((ngx, hap, flo));
    Ok(())
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
