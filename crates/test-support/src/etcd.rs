//! A real etcd cluster for tests: Debian's `etcd-server`, members on loopback with free ports,
//! each in its own temporary directory, killed when the cluster is dropped.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::wait_until;

/// A running etcd cluster.
pub struct EtcdCluster {
    members: Vec<Member>,
    _dir: tempfile::TempDir,
}

struct Member {
    name: String,
    client: SocketAddr,
    args: Vec<String>,
    child: Option<Child>,
}

/// A free loopback port (the listener is closed before etcd binds it; members of one cluster
/// take theirs together, so two of them never get the same one).
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

fn etcd_binary() -> &'static str {
    for path in ["/usr/bin/etcd", "/usr/local/bin/etcd"] {
        if std::path::Path::new(path).exists() {
            return path;
        }
    }
    panic!("etcd is not installed: `apt-get install etcd-server` (.ci/run does it)")
}

/// Client TLS of the members: their certificate and key, and the CA their clients' certificates
/// must chain to.
pub struct MemberTls<'a> {
    pub cert: &'a std::path::Path,
    pub key: &'a std::path::Path,
    pub client_ca: &'a std::path::Path,
}

impl EtcdCluster {
    /// Starts `n` members and waits until each accepts clients.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, None)
    }

    /// Starts `n` members serving clients over TLS (and asking them for certificates) when
    /// `tls` says so.
    pub fn start_with(n: usize, tls: Option<MemberTls<'_>>) -> Self {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let dir = tempfile::Builder::new()
            .prefix("warden-etcd")
            .tempdir()
            .unwrap();
        let ports = free_ports(2 * n);
        let token = format!("warden-test-{}-{}", std::process::id(), ports[0]);
        let peers: Vec<String> = (0..n)
            .map(|i| format!("m{i}=http://127.0.0.1:{}", ports[2 * i + 1]))
            .collect();
        let mut members = Vec::new();
        for i in 0..n {
            let name = format!("m{i}");
            let client = SocketAddr::from(([127, 0, 0, 1], ports[2 * i]));
            let peer = format!("http://127.0.0.1:{}", ports[2 * i + 1]);
            let mut args = vec![
                format!("--name={name}"),
                format!("--data-dir={}", dir.path().join(&name).display()),
                format!("--listen-client-urls={scheme}://{client}"),
                format!("--advertise-client-urls={scheme}://{client}"),
                format!("--listen-peer-urls={peer}"),
                format!("--initial-advertise-peer-urls={peer}"),
                format!("--initial-cluster={}", peers.join(",")),
                format!("--initial-cluster-token={token}"),
                "--initial-cluster-state=new".into(),
                // Fast elections keep a member kill cheap in tests; the lease minimum follows
                // (1.5 election timeouts).
                "--heartbeat-interval=50".into(),
                "--election-timeout=500".into(),
                "--log-level=error".into(),
                "--logger=zap".into(),
            ];
            if let Some(t) = &tls {
                args.extend([
                    format!("--cert-file={}", t.cert.display()),
                    format!("--key-file={}", t.key.display()),
                    format!("--trusted-ca-file={}", t.client_ca.display()),
                    "--client-cert-auth".into(),
                ]);
            }
            members.push(Member {
                name,
                client,
                args,
                child: None,
            });
        }
        let mut cluster = Self { members, _dir: dir };
        for i in 0..n {
            cluster.restart(i);
        }
        for m in &cluster.members {
            wait_until(
                &format!("etcd member {} at {}", m.name, m.client),
                Duration::from_secs(30),
                || TcpStream::connect(m.client).ok(),
            );
        }
        cluster
    }

    /// `etcd://` address of every member, for `--store`.
    pub fn url(&self) -> String {
        let eps: Vec<String> = self.members.iter().map(|m| m.client.to_string()).collect();
        format!("etcd://{}", eps.join(","))
    }

    /// Client address of member `i`.
    pub fn client(&self, i: usize) -> SocketAddr {
        self.members[i].client
    }

    /// Runs `etcdctl ARGS` against member 0 (API v3) and returns what it printed; panics,
    /// with etcdctl's error, when it fails.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let out = Command::new("etcdctl")
            .args(["--endpoints", &self.client(0).to_string()])
            .args(args)
            .env("ETCDCTL_API", "3")
            .output()
            .expect("etcdctl runs (apt-get install etcd-client)");
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Kills member `i` with SIGKILL, as a crash would.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        let m = &mut self.members[i];
        assert!(m.child.is_none(), "member {} is running", m.name);
        m.child = Some(
            Command::new(etcd_binary())
                .args(&m.args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start etcd"),
        );
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
