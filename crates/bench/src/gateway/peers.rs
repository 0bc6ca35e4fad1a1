//! The servers beside warden: the upstream, nginx, haproxy and the floor, each run on its own
//! with a configuration written for the workloads.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use warden_test_support::wait_until;

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

pub(super) fn nginx(
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

pub(super) fn haproxy(
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
pub(super) fn floor(
    dir: &Path,
    upstream: u16,
    refusals: &[(u16, &str)],
) -> anyhow::Result<(Peer, u16)> {
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
