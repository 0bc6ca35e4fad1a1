//! What an app run by the `process` driver can reach on the node: never root's rights, never
//! warden's files, never another instance's directory.

use std::path::Path;
use std::time::Duration;

use serde_json::json;
use warden_test_support::{wait_until, Warden};

use crate::{app_bin, BIN};

/// A shell script that records, in `$OUT/$WARDEN_LABEL`, who it runs as and what it can reach,
/// then serves as the demo app.
const REPORT: &str = r#"
r="$OUT/$WARDEN_LABEL"
try() { if sh -c "$2" >/dev/null 2>&1; then echo "$1=yes"; else echo "$1=no"; fi; }
{
  echo "uid=$(id -u)"
  echo "gid=$(id -g)"
  echo "groups=$(id -G)"
  echo "dir=$WARDEN_DATA_DIR"
  try own-dir "touch '$WARDEN_DATA_DIR/mine'"
  try list-data "ls '$DATA'"
  for f in admin-token demo-users.json store.redb tls/demo-key.pem identity-key; do
    try "read-$f" "cat '$DATA/$f'"
  done
  try list-logs "ls '$DATA/logs'"
  try list-instances "ls '$DATA/instances'"
  other=$(cat "$OUT/other-dir" 2>/dev/null)
  if [ -n "$other" ]; then
    try list-other "ls '$other'"
    try write-other "touch '$other/planted'"
  fi
} > "$r.tmp"
mv "$r.tmp" "$r"
exec "$APP" demo-app
"#;

fn report(out: &Path, label: &str) -> std::collections::BTreeMap<String, String> {
    let text = wait_until(
        &format!("the {label} instance's report"),
        Duration::from_secs(30),
        || std::fs::read_to_string(out.join(label)).ok(),
    );
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[test]
fn a_process_instance_never_runs_as_root_and_reaches_nothing_of_warden_or_other_instances() {
    let w = Warden::demo(BIN);
    let out = crate::open_dir();
    let spec = json!({
        "name": "nosy",
        "driver": "process",
        "command": ["/bin/sh", "-c", REPORT],
        "env": {
            "OUT": out.path().display().to_string(),
            "DATA": w.dir.display().to_string(),
            "APP": app_bin(),
        },
    });
    assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
    let first = w.get_as("alice", &w.password("alice"), "/apps/nosy/");
    assert_eq!(first.status, 200, "{}", first.text());
    let a = report(out.path(), "SECRET");
    // The second instance, of another label, is told where the first one's directory is.
    std::fs::write(out.path().join("other-dir"), &a["dir"]).unwrap();
    let second = w.get_as("dave", &w.password("dave"), "/apps/nosy/");
    assert_eq!(second.status, 200, "{}", second.text());
    let b = report(out.path(), "UNCLASSIFIED");

    let me = nix::unistd::geteuid().as_raw().to_string();
    if me != "0" {
        // Run by a user, instances run as that user: never more.
        assert_eq!(a["uid"], me);
        return;
    }
    for r in [&a, &b] {
        assert_ne!(r["uid"], "0", "{r:?}");
        assert_ne!(r["gid"], "0", "{r:?}");
        assert_eq!(r["groups"], r["gid"], "no supplementary groups: {r:?}");
        assert_eq!(r["own-dir"], "yes", "its own directory is writable: {r:?}");
        for denied in [
            "list-data",
            "read-admin-token",
            "read-demo-users.json",
            "read-store.redb",
            "read-tls/demo-key.pem",
            "read-identity-key",
            "list-logs",
            "list-instances",
        ] {
            assert_eq!(r[denied], "no", "{denied}: {r:?}");
        }
    }
    assert_ne!(a["uid"], b["uid"], "two live instances share no uid");
    assert_eq!(b["list-other"], "no", "{b:?}");
    assert_eq!(b["write-other"], "no", "{b:?}");
    assert!(!Path::new(&a["dir"]).join("planted").exists());
}

#[test]
fn an_app_can_tell_the_gateways_requests_from_forged_ones() {
    let w = Warden::demo(BIN);
    // Instances on host loopback, which any local process can reach.
    w.create_demo_app(&app_bin(), "plain", json!({ "driver": "process" }));
    let alice = w.password("alice");
    for app in ["demo", "plain"] {
        // The client's own signature is never passed on; the gateway's is.
        let r = warden_test_support::request(
            "GET",
            &format!("{}/apps/{app}/", w.gateway),
            &[
                (
                    "authorization",
                    &warden_test_support::http::basic("alice", &alice),
                ),
                ("x-warden-signature", "v1=forged"),
            ],
            b"",
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["verified"], true, "{app}: {}", r.text());
        assert_eq!(r.json()["user"], "alice");
    }
    // Over HTTP/2 too.
    let (version, r) = warden_test_support::http::h2c_get(
        &format!("{}/apps/plain/", w.gateway),
        &[(
            "authorization",
            &warden_test_support::http::basic("alice", &alice),
        )],
    );
    assert_eq!(version, http::Version::HTTP_2);
    assert_eq!(r.json()["verified"], true, "{}", r.text());
    // Straight to the instance's port, past the gateway, claiming to be carol.
    let instance = w
        .instances()
        .into_iter()
        .find(|i| i["app"] == "plain")
        .expect("the plain instance");
    let addr = instance["addr"].as_str().unwrap();
    let forged = warden_test_support::request(
        "GET",
        &format!("http://{addr}/"),
        &[
            ("x-warden-user", "carol"),
            ("x-warden-label", "TOP SECRET"),
            ("x-warden-signature", &format!("v1={}", "0".repeat(64))),
        ],
        b"",
    );
    assert_eq!(forged.status, 200);
    assert_eq!(forged.json()["user"], "carol");
    assert_eq!(forged.json()["verified"], false, "{}", forged.text());
    // The secret is the instance's alone: nowhere in what the API shows.
    let listed = w.api("GET", "/v1/instances", None).text();
    let key = std::fs::read_to_string(w.dir.join("identity-key")).unwrap();
    assert!(!listed.contains(key.trim()));
    assert!(!listed.to_lowercase().contains("secret\":"), "{listed}");
}

/// An app that, like gunicorn, retries a port that is taken: it writes the port it was told
/// to `$OUT/port`, waits for `$OUT/go`, then binds until the port is free and answers `OWN`.
const RETRIES_ITS_PORT: &str = r#"
import os, socket, time
port = int(os.environ["PORT"])
out = os.environ["OUT"]
with open(os.path.join(out, "port.tmp"), "w") as f:
    f.write(str(port))
os.rename(os.path.join(out, "port.tmp"), os.path.join(out, "port"))
while not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.02)
while True:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        s.listen(16)
        break
    except OSError:
        s.close()
        time.sleep(0.05)
while True:
    c, _ = s.accept()
    c.recv(65536)
    c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nOWN")
    c.close()
"#;

/// Another user's process on the node: listens on the port given, prints `listening`, and
/// `GOT <line>` for every request that reaches it, which it answers `HIJACKED`.
const TAKES_A_PORT: &str = r#"
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    data = c.recv(65536)
    if data:
        print("GOT " + data.split(b"\r\n")[0].decode(errors="replace"), flush=True)
        c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\nconnection: close\r\n\r\nHIJACKED")
    c.close()
"#;

/// Registers `name`, a `process` app running the Python `script` with `$OUT` set to `out`,
/// at most `max_instances` at once (0: no limit of its own).
fn python_app(w: &Warden, name: &str, script: &str, out: &Path, max_instances: u32) {
    let spec = json!({
        "name": name,
        "driver": "process",
        "command": ["python3", "-c", script],
        "env": { "OUT": out.display().to_string() },
        "max_instances": max_instances,
    });
    let r = w.api("POST", "/v1/apps", Some(spec));
    assert_eq!(r.status, 201, "{}", r.text());
}

/// [`TAKES_A_PORT`] run as `nobody`, killed however the test ends.
struct Taker(Option<std::process::Child>);

impl Taker {
    /// Listening on `port` once this returns.
    fn listen(port: &str) -> Self {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("python3")
            .args(["-c", TAKES_A_PORT, port])
            .uid(65534)
            .gid(65534)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "listening");
        Self(Some(child))
    }

    /// Stops it; the requests that reached it, one `GOT` line each.
    fn requests(mut self) -> String {
        let mut child = self.0.take().unwrap();
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Taker {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A `process` instance is told a free loopback port and binds it itself, so any process of the
/// node may bind it first; an app that retries a taken port (gunicorn does) then waits beside
/// it while the agent's readiness connection reaches the other listener. The agent asks the
/// kernel whose listener took its connection: another uid's is no instance of the app, so the
/// start is stopped and no request, with its user's identity, goes to it; the next start, on
/// another port, serves.
#[test]
fn a_process_instances_port_taken_by_another_user_before_the_app_gets_no_request() {
    if !nix::unistd::geteuid().is_root() {
        // Instances run as the tester's own uid then, as would the other listener.
        return;
    }
    let w = Warden::demo(BIN);
    let out = crate::open_dir();
    python_app(&w, "ported", RETRIES_ITS_PORT, out.path(), 0);
    let (gateway, alice) = (w.gateway.clone(), w.password("alice"));
    let get = move || {
        warden_test_support::request(
            "GET",
            &format!("{gateway}/apps/ported/"),
            &[(
                "authorization",
                &warden_test_support::http::basic("alice", &alice),
            )],
            b"",
        )
    };
    let first = std::thread::spawn(get.clone());
    let port = wait_until("the app to say its port", Duration::from_secs(30), || {
        std::fs::read_to_string(out.path().join("port")).ok()
    });
    let taker = Taker::listen(port.trim());
    std::fs::write(out.path().join("go"), "").unwrap();
    let first = first.join().unwrap();
    // The start is stopped with why (503), unless the gateway's retry already served it.
    assert!(
        first.status == 503
            && first
                .text()
                .contains("another user's process listens on its port")
            || (first.status, first.text().as_str()) == (200, "OWN"),
        "{} {}",
        first.status,
        first.text()
    );
    // Whether the gateway's retry answered or the start's failure did, the app served next.
    let next = get();
    assert_eq!((next.status, next.text()), (200, "OWN".to_owned()));
    assert_eq!(taker.requests(), "", "a request reached the other listener");
    // Whose listener it was is the operator's to read, not the client's.
    assert!(w.stderr().contains("other_uid=65534"), "{}", w.stderr());
    assert!(!first.text().contains("65534"), "{}", first.text());
}

/// An app that answers one request `OWN`, then closes its listener and keeps running, saying
/// its port in `$OUT/left`.
const LEAVES_ITS_PORT: &str = r#"
import os, socket, time
port = int(os.environ["PORT"])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
s.bind(("127.0.0.1", port))
s.listen(16)
while True:
    c, _ = s.accept()
    if c.recv(65536):  # the agent's readiness connections send nothing
        break
    c.close()
c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nOWN")
c.close()
s.close()
out = os.environ["OUT"]
with open(os.path.join(out, "left.tmp"), "w") as f:
    f.write(str(port))
os.rename(os.path.join(out, "left.tmp"), os.path.join(out, "left"))
time.sleep(600)
"#;

/// The check is made again for every connection, not only at the start: a port the app left
/// while it still runs (or crashed, before its exit is seen) and another user's process took
/// gets no request.
#[test]
fn a_port_a_running_instance_left_and_another_user_took_gets_no_request() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let w = Warden::demo(BIN);
    let out = crate::open_dir();
    // One instance: no second one is started beside the one that left its port.
    python_app(&w, "leaver", LEAVES_ITS_PORT, out.path(), 1);
    let alice = w.password("alice");
    let get = || w.get_as("alice", &alice, "/apps/leaver/");
    let first = get();
    assert_eq!((first.status, first.text()), (200, "OWN".to_owned()));
    let port = wait_until("the app to leave its port", Duration::from_secs(30), || {
        std::fs::read_to_string(out.path().join("left")).ok()
    });
    let taker = Taker::listen(port.trim());
    // The instance whose port is another's is stopped; a new one, on another port, serves.
    let second = get();
    assert_eq!((second.status, second.text()), (200, "OWN".to_owned()));
    assert_eq!(taker.requests(), "", "a request reached the other listener");
    assert!(w.stderr().contains("other_uid=65534"), "{}", w.stderr());
}
