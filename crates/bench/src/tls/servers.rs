//! The servers under test: certificates, nginx, warden, and pinning them to their CPUs.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use warden_test_support::{Launch, Warden};

use crate::gateway::{free_port, start_nginx, wait_listening, Peer};

pub(super) struct Certs {
    pub(super) dir: PathBuf,
}

impl Certs {
    fn cert(&self, kind: &str) -> PathBuf {
        self.dir.join(format!("{kind}.pem"))
    }
    fn key(&self, kind: &str) -> PathBuf {
        self.dir.join(format!("{kind}.key"))
    }
}

/// The certificates every server holds, each for its own name (`KIND.bench`).
pub(super) const CERT_KINDS: [&str; 3] = ["ecdsa", "rsa", "rsa4096"];

/// Self-signed ECDSA P-256, RSA-2048 and RSA-4096 certificates for `ecdsa.bench`, `rsa.bench`
/// and `rsa4096.bench`.
pub(super) fn make_certs(dir: &Path) -> anyhow::Result<Certs> {
    std::fs::create_dir_all(dir)?;
    for kind in CERT_KINDS {
        let keyopt = match kind {
            "ecdsa" => vec!["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"],
            "rsa" => vec!["-newkey", "rsa:2048"],
            _ => vec!["-newkey", "rsa:4096"],
        };
        let status = Command::new("openssl")
            .args(["req", "-x509", "-nodes", "-days", "30"])
            .args(&keyopt)
            .arg("-keyout")
            .arg(dir.join(format!("{kind}.key")))
            .arg("-out")
            .arg(dir.join(format!("{kind}.pem")))
            .args(["-subj", &format!("/CN={kind}.bench")])
            .args(["-addext", &format!("subjectAltName=DNS:{kind}.bench")])
            .args(["-addext", "basicConstraints=critical,CA:FALSE"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("running openssl (install it with `apt-get install openssl`)")?;
        if !status.success() {
            bail!("openssl could not make the {kind} certificate");
        }
    }
    Ok(Certs {
        dir: dir.to_owned(),
    })
}

pub(super) fn nginx(
    dir: &Path,
    runner: &Path,
    certs: &Certs,
    upstream: u16,
    password: &str,
    workers: usize,
) -> anyhow::Result<(Peer, u16)> {
    let port = free_port()?;
    std::fs::write(dir.join("htpasswd"), format!("alice:{{PLAIN}}{password}\n"))?;
    let mut servers = String::new();
    for kind in CERT_KINDS {
        let options = if kind == CERT_KINDS[0] {
            " backlog=65535"
        } else {
            ""
        };
        // Listen options may be given once per address.
        let _ = write!(
            servers,
            r#"
  server {{
    listen 127.0.0.1:{port} ssl{options};
    server_name {kind}.bench;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:SSL:64m;
    ssl_session_timeout 1h;
    ssl_session_tickets on;
    keepalive_timeout 10s;
    keepalive_requests 1000000;
    location = /healthz {{ return 200 '{{"status":"ok"}}'; }}
    location /apps/demo/ {{
      auth_basic "bench";
      auth_basic_user_file {dir}/htpasswd;
      proxy_pass http://app/;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}"#,
            cert = certs.cert(kind).display(),
            key = certs.key(kind).display(),
            dir = dir.display(),
        );
    }
    let conf = format!(
        r#"worker_processes {workers};
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log error;
worker_rlimit_nofile 20000;
events {{ worker_connections 16384; multi_accept on; }}
http {{
  access_log off;
  client_body_temp_path {dir}/nginx-body;
  proxy_temp_path {dir}/nginx-proxy;
  upstream app {{ server 127.0.0.1:{upstream}; keepalive 512; }}{servers}
}}
"#,
        dir = dir.display()
    );
    let path = dir.join("nginx-tls.conf");
    std::fs::write(&path, conf)?;
    let mut cmd = Command::new(runner);
    cmd.arg("nginx");
    start_nginx(cmd, &path, port)
}

/// The floor of refusing ([`super::refuser`]): this binary's `tls-refuser`, on the servers' CPUs.
pub(super) fn refuse_all(runner: &Path) -> anyhow::Result<(Peer, u16)> {
    let port = free_port()?;
    let child = Command::new(runner)
        .arg(std::env::current_exe().context("finding warden-bench itself")?)
        .args(["tls-refuser", "--listen", &port.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .context("starting the refusal floor")?;
    wait_listening(port, "the refusal floor");
    Ok((
        Peer {
            name: "refuse-all",
            child,
        },
        port,
    ))
}

/// CPUs for the servers and for the load generator: on a machine of n CPUs the servers get
/// the first n-1 and this process the last, so the client's own TLS work never competes with
/// the server it measures. `None` on a single CPU.
pub(super) struct Pinning {
    pub(super) servers: String,
    pub(super) count: usize,
    /// Which cores the servers and the generator run on, to read how busy each side was.
    pub(super) cpus: Cpus,
}

/// The servers' cores and the generator's.
#[derive(Clone, Debug)]
pub(super) struct Cpus {
    pub(super) servers: Vec<usize>,
    pub(super) generator: Vec<usize>,
}

pub(super) fn pin() -> anyhow::Result<Option<Pinning>> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n < 2 {
        return Ok(None);
    }
    let mut mine = nix::sched::CpuSet::new();
    mine.set(n - 1)?;
    // Before any thread exists, so every later thread of this process inherits it.
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &mine)
        .context("pinning the load generator to its CPU")?;
    Ok(Some(Pinning {
        servers: if n == 2 {
            "0".into()
        } else {
            format!("0-{}", n - 2)
        },
        count: n - 1,
        cpus: Cpus {
            servers: (0..n - 1).collect(),
            generator: vec![n - 1],
        },
    }))
}

/// A script that runs `program` (or its arguments, when `program` is empty) on the servers'
/// CPUs; `Launch` and `Peer` take a program path, and exec keeps the pid theirs.
pub(super) fn pinned(
    dir: &Path,
    name: &str,
    program: &str,
    pinning: &Option<Pinning>,
) -> anyhow::Result<PathBuf> {
    let prefix = match pinning {
        Some(p) => format!("taskset -c {} ", p.servers),
        None => String::new(),
    };
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\nexec {prefix}{program} \"$@\"\n"))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

pub(super) fn start_warden(bin: &Path, certs: &Certs, admission: bool, extra: &[String]) -> Warden {
    let mut l = Launch::new(bin)
        .log("info")
        .arg("--max-connections")
        .arg("16000");
    for a in extra {
        l = l.arg(a);
    }
    for kind in CERT_KINDS {
        l = l
            .arg("--tls-cert")
            .arg(&certs.cert(kind).display().to_string())
            .arg("--tls-key")
            .arg(&certs.key(kind).display().to_string());
    }
    if !admission {
        l = l.arg("--no-tls-admission");
    }
    let w = l.start();
    if let Err(e) = crate::apps::demo_as_process(&w, bin) {
        panic!("{e:#}");
    }
    w
}

pub(super) fn tls_port(w: &Warden) -> anyhow::Result<u16> {
    let url = w.tls.as_deref().context("warden opened no TLS listener")?;
    let port = url
        .trim_start_matches("https://")
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .with_context(|| format!("no port in {url}"))?;
    Ok(port)
}
