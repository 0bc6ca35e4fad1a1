//! The embedded store through the real binary: acknowledged writes survive `kill -9`, damaged
//! files stop warden with a message naming the file, two wardens cannot share one store.

use serde_json::json;
use warden_test_support::{cli, Launch};

use crate::BIN;

#[test]
fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Launch::new(BIN).data_dir(dir.path()).no_demo().start();
    for i in 0..20 {
        let spec = json!({"name": format!("app{i}"), "command": ["/bin/true"]});
        assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
    }
    w.signal_and_wait(nix::sys::signal::Signal::SIGKILL);
    let w = Launch::new(BIN).data_dir(dir.path()).no_demo().start();
    let apps = w.api("GET", "/v1/apps", None).json();
    assert_eq!(
        apps.as_array().unwrap().len(),
        20,
        "every acknowledged app is back: {apps}"
    );
}

#[test]
fn a_restarted_node_drops_the_records_of_instances_that_died_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Launch::new(BIN).data_dir(dir.path()).start();
    assert_eq!(
        w.get_as("alice", &w.password("alice"), "/apps/demo/")
            .status,
        200
    );
    w.signal_and_wait(nix::sys::signal::Signal::SIGKILL);
    let w = Launch::new(BIN).data_dir(dir.path()).start();
    // The agent removes what its previous life left behind before serving, so nobody is routed
    // to an instance that died with it.
    assert_eq!(w.instances().len(), 0);
    let nodes = w.api("GET", "/v1/nodes", None).json();
    assert_eq!(
        nodes.as_array().unwrap().len(),
        1,
        "only the live node remains: {nodes}"
    );
    let again = w.get_as("alice", &w.password("alice"), "/apps/demo/");
    assert_eq!(again.status, 200, "{}", again.text());
}

fn up_fails_with(dir: &std::path::Path) -> String {
    let (ok, _, stderr) = cli(
        BIN,
        &[
            "up",
            "--listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!ok, "warden up must refuse to start");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn a_corrupt_store_file_is_a_clear_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("store.redb"), vec![0xA5; 100_000]).unwrap();
    let err = up_fails_with(dir.path());
    assert!(
        err.contains(&dir.path().join("store.redb").display().to_string()),
        "{err}"
    );
    assert!(
        err.contains("backup") || err.contains("move it away"),
        "{err}"
    );
}

#[test]
fn a_truncated_store_file_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut w = Launch::new(BIN).data_dir(dir.path()).start();
        w.stop();
    }
    let path = dir.path().join("store.redb");
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 4)
        .unwrap();
    let err = up_fails_with(dir.path());
    assert!(err.contains("store.redb"), "{err}");
}

#[test]
fn a_set_up_data_dir_whose_store_is_missing_or_empty_never_starts_afresh() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut w = Launch::new(BIN).data_dir(dir.path()).start();
        w.stop();
    }
    let path = dir.path().join("store.redb");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    let err = up_fails_with(dir.path());
    assert!(
        err.contains("store.redb is empty") && err.contains("restore"),
        "{err}"
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        0,
        "the file is left as it was"
    );
    std::fs::remove_file(&path).unwrap();
    let err = up_fails_with(dir.path());
    assert!(err.contains("store.redb is missing"), "{err}");
    assert!(!path.exists(), "no fresh store was made");
}

#[test]
fn two_wardens_cannot_share_a_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Launch::new(BIN).data_dir(dir.path()).no_demo().start();
    let err = up_fails_with(dir.path());
    assert!(err.contains("another warden process has it open"), "{err}");
}

#[test]
fn records_and_routing_stay_put_for_many_node_lease_lifetimes() {
    let w = warden_test_support::Launch::new(BIN)
        .arg("--node-lease-ttl")
        .arg("1s")
        .start();
    let alice = w.password("alice");
    let first = w.get_as("alice", &alice, "/apps/demo/").json();
    let id = first["instance"].as_str().unwrap().to_owned();
    // Four lease lifetimes: the agent's keep-alives must carry the lease, or the store drops
    // the node's records when it ends.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(4);
    let mut looks = 0;
    while std::time::Instant::now() < until {
        let listed = w.instances();
        assert!(
            listed.iter().any(|i| i["id"] == id.as_str()),
            "instance {id} vanished from the store after {looks} looks: {listed:?}"
        );
        let nodes = w.api("GET", "/v1/nodes", None).json();
        assert_eq!(nodes.as_array().map(Vec::len), Some(1), "{nodes}");
        looks += 1;
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let again = w.get_as("alice", &alice, "/apps/demo/").json();
    assert_eq!(again["instance"], id.as_str());
    assert!(!w.stderr().contains("lease was lost"), "{}", w.stderr());
}

/// A tmpfs of `mb` MiB mounted for one test, unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(mb: u32) -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mb}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount a tmpfs");
        Some(Self { dir })
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Fills the disk; returns the filler, whose removal frees it.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let filler = self.path().join("filler");
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

#[test]
fn a_full_disk_fails_writes_clearly_and_they_resume_by_themselves_when_space_is_back() {
    let Some(disk) = SmallDisk::mount(16) else {
        eprintln!("needs root to mount a small tmpfs; the store's behaviour on a full disk is not exercised");
        return;
    };
    let w = Launch::new(BIN).data_dir(disk.path().join("data")).start();
    let spec = |name: &str| json!({"name": name, "command": ["/bin/true"]});
    assert_eq!(w.api("POST", "/v1/apps", Some(spec("before"))).status, 201);
    let alice = w.password("alice");
    assert_eq!(w.get_as("alice", &alice, "/apps/demo/").status, 200);
    let ready = |url: &str| warden_test_support::request("GET", &format!("{url}/readyz"), &[], b"");
    assert_eq!(ready(&w.api).status, 200);

    let filler = disk.fill();
    // The file has some room of its own: write until it is gone.
    let big = |name: &str| json!({"name": name, "command": ["/bin/true"], "env": {"PAD": "x".repeat(16 * 1024)}});
    let mut acknowledged = Vec::new();
    let full = loop {
        let name = format!("during{}", acknowledged.len());
        let r = w.api("POST", "/v1/apps", Some(big(&name)));
        if r.status != 201 || acknowledged.len() >= 2000 {
            break r;
        }
        acknowledged.push(name);
    };
    assert_eq!(full.status, 507, "{}", full.text());
    assert!(
        full.text().contains("disk holding it is full"),
        "{}",
        full.text()
    );
    // The next write says the same (the engine refuses everything after a failed commit
    // until the file is reopened): never "the store is closed".
    let again = w.api("POST", "/v1/apps", Some(spec("during")));
    assert!(
        again.status == 507 || again.status == 503,
        "{}",
        again.text()
    );
    assert!(!again.text().contains("closed"), "{}", again.text());
    for url in [&w.api, &w.gateway] {
        let r = ready(url);
        assert_eq!(r.status, 503, "{url}: {}", r.text());
        assert!(r.text().contains("full"), "{}", r.text());
    }
    // Running instances keep serving; a sign-in says why it cannot be recorded.
    assert_eq!(w.get_as("alice", &alice, "/apps/demo/").status, 200);
    let login = warden_test_support::request(
        "POST",
        &format!("{}/login", w.gateway),
        &[(
            "authorization",
            &warden_test_support::http::basic("alice", &alice),
        )],
        b"",
    );
    assert_eq!(login.status, 503, "{}", login.text());
    assert!(
        login.text().contains("cannot start a session now"),
        "{}",
        login.text()
    );

    std::fs::remove_file(filler).unwrap();
    wait_until_ready(&w.api);
    assert_eq!(ready(&w.gateway).status, 200);
    assert_eq!(w.api("POST", "/v1/apps", Some(spec("after"))).status, 201);
    assert_eq!(w.api("GET", "/v1/apps/before", None).status, 200);
    for name in &acknowledged {
        assert_eq!(
            w.api("GET", &format!("/v1/apps/{name}"), None).status,
            200,
            "{name} was acknowledged"
        );
    }
    assert_eq!(w.api("GET", "/v1/apps/during", None).status, 404);
}

fn wait_until_ready(api: &str) {
    warden_test_support::wait_until(
        "the store to accept writes again",
        std::time::Duration::from_secs(60),
        || {
            (warden_test_support::request("GET", &format!("{api}/readyz"), &[], b"").status == 200)
                .then_some(())
        },
    );
}

#[test]
fn a_backup_of_a_running_warden_restores_its_apps_and_users_after_the_store_is_lost() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let backup = dir.path().join("warden.backup");
    let mut w = Launch::new(BIN).data_dir(&data).start();
    let spec = json!({"name": "keep", "command": ["/bin/true"]});
    assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
    let alice = w.password("alice");
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let (ok, out, err) = cli(BIN, &["store", "backup", backup.to_str().unwrap()], &env);
    assert!(ok, "{err}");
    assert!(out.contains("backed up"), "{out}");
    let mode = std::fs::metadata(&backup).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a backup holds password hashes");
    // Not while it runs.
    let restore = [
        "store",
        "restore",
        backup.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ];
    let (ok, _, err) = cli(BIN, &restore, &[]);
    assert!(!ok && err.contains("stop it first"), "{err}");
    assert!(w.stop().success());

    // The store is lost; warden says so and does not start afresh.
    std::fs::write(data.join("store.redb"), b"").unwrap();
    let err = up_fails_with(&data);
    assert!(err.contains("warden store restore"), "{err}");
    let (ok, out, err) = cli(BIN, &restore, &[]);
    assert!(ok, "{err}");
    assert!(out.contains("restored"), "{out}");
    let w = Launch::new(BIN).data_dir(&data).start();
    assert_eq!(w.api("GET", "/v1/apps/keep", None).status, 200);
    assert_eq!(
        w.get_as("alice", &alice, "/apps/demo/").status,
        200,
        "alice's password came back"
    );
}

#[test]
fn one_undecodable_record_is_skipped_and_reported_and_breaks_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut w = Launch::new(BIN).data_dir(dir.path()).start();
        let spec = json!({"name": "good", "command": ["/bin/true"]});
        assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
        assert!(w.stop().success());
    }
    // A record damaged behind warden's back, as a bit flip or a bad restore would leave it.
    {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let s = warden_store::EmbeddedStore::open(&dir.path().join("store.redb")).unwrap();
            use warden_store::Store;
            s.put("apps/bad/spec", b"{\"name\": 17".to_vec(), None)
                .await
                .unwrap();
            s.put("users/mallory", b"\xff\xfe".to_vec(), None)
                .await
                .unwrap();
        });
    }
    let w = Launch::new(BIN).data_dir(dir.path()).start();
    let apps = w.api("GET", "/v1/apps", None);
    assert_eq!(apps.status, 200, "{}", apps.text());
    let names: Vec<String> = apps
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        names.contains(&"good".to_owned()) && names.contains(&"demo".to_owned()),
        "{names:?}"
    );
    assert_eq!(w.api("GET", "/v1/users", None).status, 200);
    let status = w.api("GET", "/v1/status", None).json();
    let damaged: Vec<&str> = status["damaged"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["key"].as_str().unwrap())
        .collect();
    assert_eq!(damaged, ["users/mallory", "apps/bad/spec"], "{status}");
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let (ok, out, err) = cli(BIN, &["status"], &env);
    assert!(ok, "{err}");
    assert!(out.contains("DAMAGED record apps/bad/spec"), "{out}");
    assert_eq!(
        w.get_as("alice", &w.password("alice"), "/apps/demo/")
            .status,
        200
    );
}
