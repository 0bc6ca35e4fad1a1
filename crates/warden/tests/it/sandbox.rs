//! The sandbox driver through the real binary: instances that try to escape and fail, the
//! gateway reaching an app whose network namespace has only loopback, and clear errors.

use serde_json::json;
use std::time::Duration;

use warden_test_support::{Launch, Warden};

use crate::{probe, BIN, INSTANCE_BIN};

fn create(w: &Warden, spec: serde_json::Value) {
    let r = w.api("POST", "/v1/apps", Some(spec));
    assert_eq!(r.status, 201, "{}", r.text());
}

fn logs(w: &Warden, id: &str) -> String {
    let r = w.api("GET", &format!("/v1/instances/{id}/logs?lines=200"), None);
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

#[test]
fn a_sandboxed_instance_cannot_escape() {
    let w = Warden::demo(BIN);
    // Another sandboxed instance with a secret in its private directory.
    create(
        &w,
        json!({ "name": "other", "command": [BIN, "demo-app"], "driver": "sandbox" }),
    );
    let other = w.get_as("alice", &w.password("alice"), "/apps/other/");
    assert_eq!(other.status, 200, "{}", other.text());
    let other_id = other.json()["instance"].as_str().unwrap().to_owned();
    let other_data = w.dir.join("instances").join(&other_id).join("data");
    std::fs::write(other_data.join("secret.txt"), b"alice's data").unwrap();

    // A listener on the host's loopback that the sandbox must not reach.
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let port = host.local_addr().unwrap().port().to_string();
    let me = std::process::id().to_string();
    // With a memory cgroup the probe's filler touches past a small limit and must be killed;
    // with rlimits only, the address-space limit must refuse the reservation, and the probe
    // (a full async server) needs a larger address space to run at all.
    let host_name = nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let limits = node_limits(&w);
    let memory_cgroup = limits.starts_with("cgroup") && limits.contains("memory");
    let (memory_mb, alloc_mb) = if memory_cgroup {
        (128, "512")
    } else {
        (1024, "4096")
    };
    create(
        &w,
        json!({
            "name": "jail",
            "driver": "sandbox",
            "limits": { "memory_mb": memory_mb, "processes": 16, "millicpus": 500 },
            "command": [
                probe().to_str().unwrap(),
                "--host-port", port,
                "--forbidden", w.dir.to_str().unwrap(),
                "--forbidden", other_data.to_str().unwrap(),
                "--host-pid", me,
                "--alloc-mb", alloc_mb,
                "--processes", "64",
                "--only-loopback",
                "--host-name", &host_name,
            ],
        }),
    );
    let r = w.get_as("bob", &w.password("bob"), "/apps/jail/");
    assert_eq!(
        r.status,
        200,
        "the gateway reaches the isolated app: {}",
        r.text()
    );
    let id = r.json()["instance"].as_str().unwrap().to_owned();
    let out = logs(&w, &id);
    assert!(!out.contains("ESCAPED") && !out.contains("FAILED"), "{out}");
    for line in [
        "probe host-listener: blocked",
        &format!("probe read {}: blocked", w.dir.display()),
        &format!("probe read {}: blocked", other_data.display()),
        "probe write /probe-was-here: blocked",
        "probe write /etc/probe-was-here: blocked",
        "probe write data dir: ok",
        "probe host-processes: blocked",
        "probe sethostname: blocked",
        "probe new-user-namespace: blocked",
        "probe mount: blocked",
        "probe memory-limit: blocked",
        "probe process-limit: blocked",
        "probe inherited-fds: blocked",
        "probe interfaces: blocked (only lo)",
        "probe hostname: blocked",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
    assert!(!out.contains("probe io_uring: allowed"), "{out}");
    // Where the kernel refuses a fresh /proc (masked /proc in some containers), the app runs
    // without one and the capability probe cannot read its own status.
    if !out.contains("no /proc inside") {
        assert!(out.contains("probe capabilities: blocked"), "{out}");
        assert!(out.contains("probe pid1-cmdline: blocked"), "{out}");
    }
    assert!(
        host.accept().is_err(),
        "the host listener saw no connection"
    );
    assert_eq!(
        nix::unistd::gethostname().unwrap().to_string_lossy(),
        host_name,
        "the host's name is unchanged"
    );
    assert_eq!(
        std::fs::read(other_data.join("secret.txt")).unwrap(),
        b"alice's data"
    );
    let cgroups = cgroup_dirs(w.pid(), &id);
    if limits.starts_with("cgroup") {
        // Every limit is written where the kernel enforces it: 128 MiB, the app's 16 processes
        // plus the sandbox's own 2, half a core.
        assert!(!cgroups.is_empty(), "{limits}: no cgroup of instance {id}");
        let mut seen = Vec::new();
        for dir in &cgroups {
            for (file, want) in [
                ("memory.limit_in_bytes", "134217728"),
                ("memory.max", "134217728"),
                ("pids.max", "18"),
                ("cpu.cfs_quota_us", "50000"),
                ("cpu.max", "50000 100000"),
            ] {
                if let Ok(v) = std::fs::read_to_string(dir.join(file)) {
                    assert_eq!(v.trim(), want, "{}", dir.join(file).display());
                    seen.push(file);
                }
            }
        }
        for controller in ["memory", "pids", "cpu"] {
            if limits.contains(controller) {
                assert!(
                    seen.iter().any(|f| f.starts_with(controller)),
                    "{limits}: no {controller} limit in {cgroups:?}"
                );
            }
        }
    }
    if memory_cgroup {
        assert!(
            out.contains("probe memory-limit: blocked (killed by the kernel at the limit)"),
            "{limits}: {out}"
        );
        // The kill is not left unnoticed: once the instance ends, its log and the agent's
        // metrics say the out-of-memory killer stopped a process of it.
        let r = w.api("DELETE", &format!("/v1/instances/{id}"), None);
        assert!(r.status < 300, "{}", r.text());
        let out = logs(&w, &id);
        assert!(
            out.contains("warden: out of memory: the kernel killed 1 process of this instance at its memory limit of 128 MiB"),
            "{out}"
        );
        assert!(
            cgroup_dirs(w.pid(), &id).is_empty(),
            "the instance's cgroups are removed after it"
        );
        let metrics = w.api("GET", "/metrics", None).text();
        assert!(
            metrics.contains("warden_agent_oom_killed_instances_total{app=\"jail\"} 1"),
            "{metrics}"
        );
    }
}

/// The cgroup directories of instance `id` of the warden with process id `warden`
/// (`warden-<pid>/<id>` below some cgroup mount).
fn cgroup_dirs(warden: u32, id: &str) -> Vec<std::path::PathBuf> {
    fn walk(dir: &std::path::Path, depth: u32, want: &str, found: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            if path.ends_with(want) {
                found.push(path);
            } else if depth > 0 {
                walk(&path, depth - 1, want, found);
            }
        }
    }
    let mut found = Vec::new();
    walk(
        std::path::Path::new("/sys/fs/cgroup"),
        4,
        &format!("warden-{warden}/{id}"),
        &mut found,
    );
    found
}

/// What enforces sandbox limits on the demo warden's node, from `GET /v1/nodes`.
fn node_limits(w: &Warden) -> String {
    let r = w.api("GET", "/v1/nodes", None);
    assert_eq!(r.status, 200, "{}", r.text());
    let limits = r.json()[0]["limits"].as_str().unwrap().to_owned();
    assert!(!limits.is_empty(), "{}", r.text());
    limits
}

#[test]
fn a_sandboxed_app_that_cannot_start_gets_a_clear_error() {
    let w = Warden::demo(BIN);
    create(
        &w,
        json!({ "name": "ghost", "command": ["/nonexistent/server"], "driver": "sandbox" }),
    );
    let r = w.get_as("alice", &w.password("alice"), "/apps/ghost/");
    assert_eq!(r.status, 503, "{}", r.text());
    let started = w.api(
        "POST",
        "/v1/instances",
        Some(json!({ "app": "ghost", "label": "SECRET" })),
    );
    assert_eq!(started.status, 502, "{}", started.text());
    assert!(started.text().contains("not found"), "{}", started.text());
}

/// The sandbox driver without root: a warden running as an ordinary user (nobody, when the tests
/// run as root) builds the same sandbox where the kernel lets that user create user namespaces,
/// and says how to allow them where it does not.
#[test]
fn an_unprivileged_warden_runs_sandboxes_or_says_why_not() {
    use std::os::unix::fs::PermissionsExt;
    const NOBODY: u32 = 65534;
    let tmp = tempfile::Builder::new()
        .prefix("warden-unprivileged")
        .tempdir()
        .unwrap();
    // The binary and the data dir must be reachable for the unprivileged user.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = tmp.path().join("warden");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::copy(INSTANCE_BIN, tmp.path().join("warden-instance")).unwrap();
    let probe_copy = tmp.path().join("sandbox-probe");
    std::fs::copy(probe(), &probe_copy).unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let root = nix::unistd::geteuid().is_root();
    let wrapper: Vec<&str> = if root {
        std::os::unix::fs::chown(&data, Some(NOBODY), Some(NOBODY)).unwrap();
        vec![
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]
    } else {
        vec![]
    };
    // Whether the kernel lets this user create a user namespace, asked independently of warden.
    let mut probe: Vec<&str> = wrapper.clone();
    probe.extend(["unshare", "--user", "true"]);
    let allowed = std::process::Command::new(probe[0])
        .args(&probe[1..])
        .status()
        .unwrap()
        .success();

    let w = warden_test_support::Launch::new(&bin)
        .data_dir(&data)
        .wrapped(&wrapper)
        .start();
    let status = std::fs::read_to_string(format!("/proc/{}/status", w.pid())).unwrap();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse::<u32>()
        .unwrap();
    assert_ne!(uid, 0, "warden runs unprivileged");

    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let port = host.local_addr().unwrap().port().to_string();
    let me = std::process::id().to_string();
    create(
        &w,
        json!({
            "name": "jail",
            "driver": "sandbox",
            "command": [
                probe_copy.to_str().unwrap(),
                "--host-port", port,
                "--forbidden", data.to_str().unwrap(),
                "--host-pid", me,
                "--alloc-mb", "4096",
            ],
        }),
    );
    let started = w.api(
        "POST",
        "/v1/instances",
        Some(json!({ "app": "jail", "label": "SECRET" })),
    );
    if !allowed {
        assert_eq!(started.status, 502, "{}", started.text());
        assert!(
            started
                .text()
                .contains("user namespaces are not allowed here"),
            "{}",
            started.text()
        );
        return;
    }
    assert_eq!(started.status, 201, "{}", started.text());
    let id = started.json()["id"].as_str().unwrap().to_owned();
    // alice is SECRET: the gateway reaches the same isolated instance.
    let r = w.get_as("alice", &w.password("alice"), "/apps/jail/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["instance"], id.as_str());
    let out = logs(&w, &id);
    assert!(!out.contains("ESCAPED") && !out.contains("FAILED"), "{out}");
    for line in [
        "probe host-listener: blocked",
        &format!("probe read {}: blocked", data.display()),
        "probe write /etc/probe-was-here: blocked",
        "probe write data dir: ok",
        "probe host-processes: blocked",
        "probe new-user-namespace: blocked",
        "probe mount: blocked",
        "probe memory-limit: blocked",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
    assert!(
        host.accept().is_err(),
        "the host listener saw no connection"
    );
}

/// The probe's own bridge address, from its log.
fn probe_address(out: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix("probe address: "))
        .unwrap_or_else(|| panic!("no probe address in:\n{out}"))
        .trim()
        .to_owned()
}

#[test]
fn a_bridged_sandbox_reaches_the_host_but_not_another_instance() {
    // A bridge and subnet of this test's own, removed by warden when it stops.
    let bridge = format!("wdt{:x}", std::process::id() % 0xffff);
    let mut w = warden_test_support::Launch::new(BIN)
        .arg("--bridge")
        .arg(&bridge)
        .arg("--bridge-cidr")
        .arg("10.213.77.0/24")
        .start();
    let probe_bin = probe();
    let probe = |name: &str, extra: &[&str]| {
        let mut command = vec![probe_bin.to_str().unwrap()];
        command.extend_from_slice(extra);
        create(
            &w,
            json!({
                "name": name,
                "driver": "sandbox",
                "network": "bridged",
                // The egress app starts in a slot, whose network is wired before the request.
                "start": if name == "egress" { "slot" } else { "jit" },
                "command": command,
            }),
        );
        w.get_as("alice", &w.password("alice"), &format!("/apps/{name}/"))
    };
    let r = probe("peer", &["--listen-any", "9000"]);
    if !nix::unistd::geteuid().is_root() {
        assert_eq!(r.status, 503, "{}", r.text());
        let r = w.api(
            "POST",
            "/v1/instances",
            Some(json!({ "app": "peer", "label": "SECRET" })),
        );
        assert!(
            r.text().contains("needs warden to run as root"),
            "{}",
            r.text()
        );
        return;
    }
    assert_eq!(
        r.status,
        200,
        "the gateway reaches a bridged app: {}",
        r.text()
    );
    let peer_out = logs(&w, r.json()["instance"].as_str().unwrap());
    assert!(peer_out.contains("probe listen-any 9000: ok"), "{peer_out}");
    let peer = format!("{}:9000", probe_address(&peer_out));
    // The host is on the bridge: it reaches the peer, so the peer really listens there.
    std::net::TcpStream::connect_timeout(&peer.parse().unwrap(), Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("the host cannot reach {peer}: {e}"));

    let host = std::net::TcpListener::bind("10.213.77.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let host_addr = host.local_addr().unwrap().to_string();
    let r = probe("egress", &["--reach", &host_addr, "--unreachable", &peer]);
    assert_eq!(r.status, 200, "{}", r.text());
    let out = logs(&w, r.json()["instance"].as_str().unwrap());
    assert!(!out.contains("ESCAPED") && !out.contains("FAILED"), "{out}");
    assert!(
        out.contains(&format!("probe reach {host_addr}: ok")),
        "{out}"
    );
    assert!(
        out.contains(&format!("probe unreachable {peer}: blocked")),
        "{out}"
    );
    assert_ne!(probe_address(&out), probe_address(&peer_out));
    assert!(
        host.accept().is_ok(),
        "the host listener saw the sandbox connect"
    );

    assert!(std::path::Path::new("/sys/class/net")
        .join(&bridge)
        .exists());
    w.stop();
    assert!(
        !std::path::Path::new("/sys/class/net")
            .join(&bridge)
            .exists(),
        "warden removes the bridge it created"
    );
}

#[test]
fn without_cgroups_the_limits_are_rlimits_and_still_hold() {
    let w = Launch::new(BIN).arg("--cgroups").arg("off").start();
    let limits = node_limits(&w);
    assert!(
        limits.starts_with("rlimits only (turned off with warden up --cgroups off)"),
        "{limits}"
    );
    create(
        &w,
        json!({
            "name": "jail",
            "driver": "sandbox",
            "limits": { "memory_mb": 1024, "processes": 16 },
            "command": [probe().to_str().unwrap(), "--alloc-mb", "4096", "--processes", "64"],
        }),
    );
    let r = w.get_as("alice", &w.password("alice"), "/apps/jail/");
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["instance"].as_str().unwrap().to_owned();
    let out = logs(&w, &id);
    assert!(
        out.contains("probe memory-limit: blocked (the reservation was refused)"),
        "{out}"
    );
    // RLIMIT_NPROC counts per host uid: it holds where each instance has its own, as root.
    if nix::unistd::geteuid().is_root() {
        assert!(out.contains("probe process-limit: blocked"), "{out}");
    }
    assert!(
        cgroup_dirs(w.pid(), &id).is_empty(),
        "no cgroup was made: {limits}"
    );
}

#[test]
fn descriptors_left_open_by_whoever_started_warden_reach_no_instance() {
    // A directory (the host's root) and a file open on descriptors 7 and 8, as a careless
    // shell or service manager might leave them.
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), b"host secret").unwrap();
    let script = format!(
        "exec 7< / 8< {}; exec \"$0\" \"$@\"",
        secret.path().display()
    );
    let w = Launch::new(BIN).wrapped(&["sh", "-c", &script]).start();
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", w.pid()))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        fds.contains(&"7".to_owned()),
        "warden itself got them: {fds:?}"
    );
    // Where an unprivileged process instance can run it too.
    let probe = warden_test_support::runnable_by_instances(&probe());
    for (name, driver) in [("jail", "sandbox"), ("plain", "process")] {
        create(
            &w,
            json!({ "name": name, "driver": driver, "command": [probe.to_str().unwrap()] }),
        );
        let r = w.get_as("alice", &w.password("alice"), &format!("/apps/{name}/"));
        assert_eq!(r.status, 200, "{}", r.text());
        let out = logs(&w, r.json()["instance"].as_str().unwrap());
        assert!(
            out.contains("probe inherited-fds: blocked"),
            "{driver} instance:\n{out}"
        );
    }
}

/// Whether this machine lets a process set up an io_uring at all.
#[allow(unsafe_code)]
fn host_allows_io_uring() -> bool {
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup(2) reads and writes the 120-byte params we own; a descriptor it
    // returns is closed at once.
    let fd =
        unsafe { nix::libc::syscall(nix::libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd >= 0 {
        // SAFETY: the kernel just returned this descriptor to us.
        unsafe { nix::libc::close(fd as i32) };
    }
    fd >= 0
}

#[test]
fn io_uring_is_denied_in_the_sandbox_unless_the_app_asks_for_it() {
    let w = Warden::demo(BIN);
    let probe = probe();
    let out_of = |name: &str, io_uring: bool| {
        create(
            &w,
            json!({ "name": name, "driver": "sandbox", "io_uring": io_uring, "command": [probe.to_str().unwrap()] }),
        );
        let r = w.get_as("alice", &w.password("alice"), &format!("/apps/{name}/"));
        assert_eq!(r.status, 200, "{}", r.text());
        logs(&w, r.json()["instance"].as_str().unwrap())
    };
    let denied = out_of("plain", false);
    assert!(
        denied.contains("probe io_uring: denied") || denied.contains("probe io_uring: unavailable"),
        "{denied}"
    );
    let asked = out_of("uring", true);
    if host_allows_io_uring() {
        assert!(asked.contains("probe io_uring: allowed"), "{asked}");
        assert!(denied.contains("probe io_uring: denied"), "{denied}");
    } else {
        assert!(!asked.contains("probe io_uring: allowed"), "{asked}");
    }
}
