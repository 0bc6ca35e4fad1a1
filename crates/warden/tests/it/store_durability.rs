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

pub(crate) fn up_fails_with(dir: &std::path::Path) -> String {
    match try_up(dir) {
        Outcome::Refused(err) => err,
        Outcome::Started => panic!("warden up must refuse to start on {}", dir.display()),
    }
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

/// A tmpfs of `mb` MiB mounted for one test, unmounted when dropped (also used by `audit`).
pub(crate) struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    pub(crate) fn mount(mb: u32) -> Option<Self> {
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

    pub(crate) fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Fills the disk; returns the filler, whose removal frees it.
    pub(crate) fn fill(&self) -> std::path::PathBuf {
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

/// What `warden up` did with a data dir: started (and answered), or stopped with an error.
pub(crate) enum Outcome {
    Started,
    Refused(String),
}

/// Runs `warden up` on `dir`, bounded: a start that neither serves nor exits within a minute
/// is a hang, and fails the test.
pub(crate) fn try_up(dir: &std::path::Path) -> Outcome {
    let _ = std::fs::remove_file(dir.join("endpoints.json"));
    let mut child = std::process::Command::new(BIN)
        .args([
            "up",
            "--listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            assert!(!status.success(), "warden up exited 0 without serving");
            assert!(!err.contains("panicked"), "{err}");
            return Outcome::Refused(err);
        }
        if let Ok(text) = std::fs::read_to_string(dir.join("endpoints.json")) {
            if let Ok(ep) = serde_json::from_str::<serde_json::Value>(&text) {
                let api = ep["api"].as_str().unwrap().to_owned();
                let token = std::fs::read_to_string(dir.join("admin-token")).unwrap();
                let auth = format!("Bearer {}", token.trim());
                for path in ["/v1/apps", "/v1/users", "/v1/status"] {
                    let r = warden_test_support::request(
                        "GET",
                        &format!("{api}{path}"),
                        &[("authorization", &auth)],
                        b"",
                    );
                    assert_eq!(r.status, 200, "{path}: {}", r.text());
                }
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(child.id() as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
                let _ = child.wait();
                return Outcome::Started;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "warden up neither served nor exited: a hang"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

#[test]
fn damaged_copies_of_a_real_store_start_sound_or_stop_clearly_and_are_never_rewritten() {
    let pristine = tempfile::tempdir().unwrap();
    {
        let mut w = Launch::new(BIN).data_dir(pristine.path()).no_demo().start();
        for i in 0..60 {
            let spec = json!({"name": format!("app{i}"), "command": ["/bin/true"], "env": {"N": i.to_string()}});
            assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
        }
        assert!(w.stop().success());
    }
    let (ok, out, err) = cli(
        BIN,
        &[
            "store",
            "check",
            "--data-dir",
            pristine.path().to_str().unwrap(),
        ],
        &[],
    );
    assert!(ok && out.contains("reads through"), "{out}{err}");
    let store = std::fs::read(pristine.path().join("store.redb")).unwrap();
    let len = store.len();
    // Where the damage lands: the header, page boundaries, and spread through the file.
    let mut spots: Vec<usize> = vec![0, 1, 7, 32, 64, 100, 4096, 4097, 8192];
    spots.extend((1..16).map(|k| k * len / 16 + 3));
    let (mut started, mut refused) = (0, 0);
    for (n, &at) in spots.iter().enumerate() {
        let case = tempfile::tempdir().unwrap();
        copy_dir(pristine.path(), case.path());
        let mut bytes = store.clone();
        for b in &mut bytes[at..(at + 8).min(len)] {
            *b ^= 0xa5;
        }
        let file = case.path().join("store.redb");
        std::fs::write(&file, &bytes).unwrap();
        match try_up(case.path()) {
            Outcome::Started => started += 1,
            Outcome::Refused(err) => {
                refused += 1;
                let (ok, _, check) = cli(
                    BIN,
                    &[
                        "store",
                        "check",
                        "--data-dir",
                        case.path().to_str().unwrap(),
                    ],
                    &[],
                );
                assert!(
                    !ok && check.contains("damaged"),
                    "case {n}: store check: {check}; up said: {err}"
                );
                assert!(err.contains("store.redb"), "case {n} (at {at}): {err}");
                assert!(
                    err.contains("restore") || err.contains("backup"),
                    "case {n}: says what to do: {err}"
                );
                assert!(
                    std::fs::read(&file).unwrap() == bytes,
                    "case {n} (at {at}): a refused file was modified"
                );
            }
        }
    }
    eprintln!("{started} damaged copies started sound, {refused} were refused");
    assert!(refused > 0, "no damage was noticed at all");
}
