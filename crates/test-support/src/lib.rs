//! Launchers for integration tests: the real `warden` binary on ephemeral ports, and a plain
//! HTTP/1.1 client over a real socket.
//!
//! Owns nothing of the product; tests use it to drive warden from outside, as a user would.
//! Waits are conditions with deadlines, never fixed sleeps.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

pub mod browser;
pub mod etcd;
pub mod http;
pub mod oidc;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use http::{request, Response};

/// `program` at a path that the unprivileged uids of `process` instances can run: itself, or,
/// when warden runs as root and a directory above it is closed to other users (a checkout
/// under /root), a hard link (else a copy) in a root-owned directory under the system temp dir,
/// with the instance image (`warden-instance`) beside it if it has one, as `warden up` needs.
/// Operators meet the same rule with a clear error; tests should not depend on where the
/// checkout is.
pub fn runnable_by_instances(program: &Path) -> PathBuf {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let program = std::fs::canonicalize(program).unwrap();
    let open_to_others = program
        .ancestors()
        .all(|p| std::fs::metadata(p).is_ok_and(|m| m.mode() & 0o001 != 0));
    if !nix::unistd::geteuid().is_root() || open_to_others {
        return program;
    }
    let dir = std::env::temp_dir().join("warden-test-programs");
    let _ = std::fs::create_dir(&dir);
    let m = std::fs::metadata(&dir).unwrap();
    assert!(
        m.uid() == 0 && m.mode() & 0o022 == 0,
        "{} must be root's and not writable by others",
        dir.display()
    );
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let name = program.file_name().unwrap();
    let beside = program.with_file_name("warden-instance");
    let files: Vec<&Path> = [program.as_path(), beside.as_path()]
        .into_iter()
        .filter(|f| f.exists())
        .collect();
    let files = if beside == program {
        &files[..1]
    } else {
        &files[..]
    };
    // One directory per version of the files it holds, named by their identities.
    let version: Vec<String> = files
        .iter()
        .map(|f| {
            let m = std::fs::metadata(f).unwrap();
            format!("{}-{}-{}", m.dev(), m.ino(), m.mtime())
        })
        .collect();
    let target = dir.join(format!(
        "{}-{}.d",
        name.to_string_lossy(),
        version.join("-")
    ));
    if !target.exists() {
        // Tests run side by side: build under a unique name, then rename into place.
        let tmp = dir.join(format!(".{}-{}", std::process::id(), nanos()));
        std::fs::create_dir(&tmp).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        for f in files {
            let to = tmp.join(f.file_name().unwrap());
            if std::fs::hard_link(f, &to).is_err() {
                std::fs::copy(f, &to).unwrap();
            }
        }
        // Another test may have put the same files in place first.
        if std::fs::rename(&tmp, &target).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
    target.join(name)
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Polls `f` until it yields `Some`, panicking with `what` after `limit`.
pub fn wait_until<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// True while a process with this pid exists (and is not a zombie).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// A running `warden up`.
pub struct Warden {
    child: Option<Child>,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    pub gateway: String,
    pub api: String,
    /// `https://ADDR` of the TLS listener, if one is open.
    pub tls: Option<String>,
    pub token: String,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

/// Options for starting warden.
pub struct Launch {
    bin: PathBuf,
    dir: Option<PathBuf>,
    demo: bool,
    data: bool,
    extra: Vec<String>,
    wrapper: Vec<String>,
    log: String,
    listen: String,
    api_listen: String,
}

impl Launch {
    /// `warden up` from `bin` (pass `env!("CARGO_BIN_EXE_warden")`).
    pub fn new(bin: impl AsRef<Path>) -> Self {
        Self {
            bin: bin.as_ref().to_owned(),
            dir: None,
            demo: true,
            data: false,
            extra: vec![],
            wrapper: vec![],
            log: "info,warden=debug".into(),
            listen: "127.0.0.1:0".into(),
            api_listen: "127.0.0.1:0".into(),
        }
    }

    /// The API's address, instead of a free port picked at bind (for a redirect URL to the
    /// dashboard that an OpenID provider must know before warden starts).
    pub fn api_listen(mut self, addr: &str) -> Self {
        addr.clone_into(&mut self.api_listen);
        self
    }

    /// The gateway's address, instead of a free port picked at bind (for a test that must
    /// know it before warden starts, such as an OpenID provider's redirect URL).
    pub fn listen(mut self, addr: &str) -> Self {
        addr.clone_into(&mut self.listen);
        self
    }

    /// The log filter (`WARDEN_LOG`), instead of `info,warden=debug`.
    pub fn log(mut self, filter: &str) -> Self {
        filter.clone_into(&mut self.log);
        self
    }

    /// Runs warden through `wrapper` (such as `setpriv --reuid=...`), which execs the rest.
    pub fn wrapped(mut self, wrapper: &[&str]) -> Self {
        self.wrapper = wrapper.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Extra flags for `warden up`.
    pub fn arg(mut self, a: &str) -> Self {
        self.extra.push(a.to_owned());
        self
    }

    /// Several extra flags for `warden up`.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.extra.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// Uses `dir` as data dir instead of a fresh temporary one.
    pub fn data_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.dir = Some(dir.as_ref().to_owned());
        self
    }

    /// With the data server warden picks by default (a private PostgreSQL where it is
    /// installed). Without this, `--data none`: most tests need no database, and a PostgreSQL
    /// per warden would slow every one of them.
    pub fn with_data(mut self) -> Self {
        self.data = true;
        self
    }

    /// Without `--demo`.
    pub fn no_demo(mut self) -> Self {
        self.demo = false;
        self
    }

    /// Runs `warden up`, which must refuse to start; its stderr.
    pub fn start_refused(self) -> String {
        let tmp = tempfile::tempdir().unwrap();
        let dir = self.dir.clone().unwrap_or_else(|| tmp.path().join("data"));
        let out = self
            .command(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("warden binary starts");
        assert!(!out.status.success(), "warden up was expected to refuse");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn command(&self, dir: &Path) -> Command {
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        cmd.args([
            "up",
            "--listen",
            &self.listen,
            "--api-listen",
            &self.api_listen,
            "--data-dir",
        ])
        .arg(dir)
        .args(&self.extra)
        .env("WARDEN_LOG", &self.log)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        if !self.data && !self.extra.iter().any(|a| a == "--data") {
            cmd.args(["--data", "none"]);
        }
        if self.demo {
            // Never the fixed demo TLS port: tests run side by side.
            cmd.args(["--demo", "--tls-listen", "127.0.0.1:0"]);
        }
        cmd
    }

    /// Runs `warden up` and waits until it has written its endpoints.
    pub fn start(self) -> Warden {
        let (dir, tmp) = match self.dir.clone() {
            Some(d) => (d, None),
            None => {
                let t = tempfile::Builder::new()
                    .prefix("warden-it")
                    .tempdir()
                    .unwrap();
                // Passable, as /var/lib is: `process` instances under uids of their own must
                // reach their directory in the data dir, which warden itself guards.
                std::fs::set_permissions(
                    t.path(),
                    std::os::unix::fs::PermissionsExt::from_mode(0o711),
                )
                .unwrap();
                (t.path().join("data"), Some(t))
            }
        };
        let mut cmd = self.command(&dir);
        // A warden killed with SIGKILL leaves its endpoints behind; never read a stale one.
        let _ = std::fs::remove_file(dir.join("endpoints.json"));
        let mut child = cmd.spawn().expect("warden binary starts");
        let stdout = capture(child.stdout.take().unwrap());
        let stderr = capture(child.stderr.take().unwrap());
        let endpoints = dir.join("endpoints.json");
        let ep: serde_json::Value = wait_until(
            "warden to write endpoints.json",
            Duration::from_secs(60),
            || {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "warden up exited early ({status}); stderr:\n{}",
                        stderr.lock().unwrap()
                    );
                }
                std::fs::read_to_string(&endpoints)
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok())
            },
        );
        // The welcome text is printed right after the endpoints are written.
        wait_until("the welcome text", Duration::from_secs(30), || {
            stdout
                .lock()
                .unwrap()
                .contains("stop with Ctrl-C")
                .then_some(())
        });
        // Empty when the break-glass admin token is off (`--admin-token off`).
        let token = std::fs::read_to_string(dir.join("admin-token"))
            .map(|t| t.trim().to_owned())
            .unwrap_or_default();
        Warden {
            child: Some(child),
            dir,
            _tmp: tmp,
            // Empty where the node does not run the role.
            gateway: ep["gateway"].as_str().unwrap_or_default().to_owned(),
            api: ep["api"].as_str().unwrap_or_default().to_owned(),
            tls: ep["tls"].as_str().map(str::to_owned),
            token,
            stdout,
            stderr,
        }
    }
}

pub(crate) fn capture(r: impl std::io::Read + Send + 'static) -> Arc<Mutex<String>> {
    let buf = Arc::new(Mutex::new(String::new()));
    let b = buf.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            let mut b = b.lock().unwrap();
            b.push_str(&line);
            b.push('\n');
        }
    });
    buf
}

impl Warden {
    /// `warden up --demo` in a fresh data dir.
    pub fn demo(bin: impl AsRef<Path>) -> Self {
        Launch::new(bin).start()
    }

    /// The warden process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Everything warden printed to stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Everything warden logged so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// A demo user's password, from `demo-users.json`.
    pub fn password(&self, user: &str) -> String {
        let users: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(self.dir.join("demo-users.json")).unwrap(),
        )
        .unwrap();
        users
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["name"] == user)
            .expect("demo user")["password"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// GET on the gateway with Basic credentials.
    pub fn get_as(&self, user: &str, password: &str, path: &str) -> Response {
        request(
            "GET",
            &format!("{}{path}", self.gateway),
            &[("authorization", &http::basic(user, password))],
            b"",
        )
    }

    /// An API call with the admin token.
    pub fn api(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> Response {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        request(
            method,
            &format!("{}{path}", self.api),
            &[
                ("authorization", &format!("Bearer {}", self.token)),
                ("content-type", "application/json"),
            ],
            body.as_bytes(),
        )
    }

    /// The instance records the API lists.
    pub fn instances(&self) -> Vec<serde_json::Value> {
        self.api("GET", "/v1/instances", None)
            .json()
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Registers app `name` running `bin demo-app`, with `extra` spec fields added or
    /// replacing the defaults; the API must accept it.
    pub fn create_demo_app(&self, bin: &str, name: &str, extra: serde_json::Value) {
        let mut spec = serde_json::json!({ "name": name, "command": [bin, "demo-app"] });
        for (k, v) in extra.as_object().expect("extra spec fields as an object") {
            spec[k] = v.clone();
        }
        let r = self.api("POST", "/v1/apps", Some(spec));
        assert_eq!(r.status, 201, "{}", r.text());
    }

    /// Waits until `GET /v1/status` reports a crash loop of `app` and returns its report.
    pub fn wait_crash_loop(&self, app: &str) -> serde_json::Value {
        wait_until(
            &format!("a crash loop of {app} in the status"),
            Duration::from_secs(60),
            || {
                let status = self.api("GET", "/v1/status", None).json();
                let entry = status["apps"]
                    .as_array()?
                    .iter()
                    .find(|a| a["name"] == app)?
                    .clone();
                let c = entry["crash_loops"].as_array()?.first()?.clone();
                (c["crash_loop"] == true).then_some(c)
            },
        )
    }

    /// Sends `signal` and waits for warden to exit.
    pub fn signal_and_wait(&mut self, signal: nix::sys::signal::Signal) -> ExitStatus {
        let mut child = self.child.take().expect("warden is running");
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal);
        wait_until("warden to exit", Duration::from_secs(60), || {
            child.try_wait().unwrap()
        })
    }

    /// SIGTERM, the polite stop.
    pub fn stop(&mut self) -> ExitStatus {
        self.signal_and_wait(nix::sys::signal::Signal::SIGTERM)
    }
}

impl Drop for Warden {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.stop();
        }
    }
}

/// Runs the warden CLI with `args`, returning (exit success, stdout, stderr).
pub fn cli(bin: impl AsRef<Path>, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(bin.as_ref())
        .args(args)
        .env_remove("WARDEN_API")
        .env_remove("WARDEN_TOKEN")
        .env_remove("WARDEN_CONFIG")
        .env_remove("WARDEN_DATA_DIR")
        .env("XDG_CONFIG_HOME", "/nonexistent-warden-test")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("warden cli runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A loopback port free now (the OS's pick, released at once): for a listener whose address a
/// test must name before the process that binds it starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
