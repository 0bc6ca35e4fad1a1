//! `git push` to warden, the holes a review found (issue 38): the push lock outlives a push
//! cut off mid-build, a branch moved since the push began or set to a non-commit is refused
//! before anything builds, a removed app's repository goes with it, a tree that unpacks past
//! the unpacker's cap is refused before it is uploaded, and quarantines a killed git left are
//! swept, and a push builds when warden was given a relative data directory.

use warden_test_support::{request, Warden};

use crate::deploy::{answer, releases};
use crate::git_remote::{remote, remote_main, slow_repo, Repo};
use crate::BIN;

/// A pkt-line of git's protocol.
fn pkt(line: &str) -> Vec<u8> {
    format!("{:04x}{line}", line.len() + 4).into_bytes()
}

/// A pack of `revs` (`git rev-list` arguments, one a line) from `repo`.
fn pack(repo: &Repo, revs: &str) -> Vec<u8> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("git")
        .args(["pack-objects", "--stdout", "--revs", "--quiet"])
        .current_dir(repo.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(revs.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    out.stdout
}

/// A push, as git sends it, of one update of `main` from `old` to `new` with `pack`; what
/// warden answers (git's report, the hook's lines in it).
fn raw_push(w: &Warden, app: &str, old: &str, new: &str, pack: &[u8]) -> String {
    let mut body = pkt(&format!(
        "{old} {new} refs/heads/main\0report-status side-band-64k\n"
    ));
    body.extend_from_slice(b"0000");
    body.extend_from_slice(pack);
    let r = request(
        "POST",
        &format!("{}/v1/apps/{app}/git/git-receive-pack", w.api),
        &[
            (
                "authorization",
                &warden_test_support::http::basic("git", &w.token),
            ),
            ("content-type", "application/x-git-receive-pack-request"),
        ],
        &body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

/// The refs warden advertises for `app`'s repository.
fn advertised(w: &Warden, app: &str) -> String {
    let r = request(
        "GET",
        &format!(
            "{}/v1/apps/{app}/git/info/refs?service=git-receive-pack",
            w.api
        ),
        &[(
            "authorization",
            &warden_test_support::http::basic("git", &w.token),
        )],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

/// The processes running warden's hook for the warden in `data`.
fn hooks_running(data: &std::path::Path) -> Vec<u32> {
    let hook = data.join("git/hooks/pre-receive");
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
        if hook == std::path::Path::new(String::from_utf8_lossy(argv0).as_ref()) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn a_push_whose_hook_dies_mid_build_holds_the_lock_until_its_release_ends() {
    let w = Warden::demo(BIN);
    let url = remote(&w, "g");
    let repo = slow_repo(&url);
    std::thread::scope(|s| {
        let first = s.spawn(|| repo.git_with(&w.token, &["push", "warden", "main"]));
        let hook = warden_test_support::wait_until(
            "the first push's release recorded, its hook running",
            std::time::Duration::from_secs(60),
            || {
                let r = w.api("GET", "/v1/apps/g/releases", None);
                let recorded = r.status == 200 && !r.json().as_array()?.is_empty();
                let hooks = hooks_running(&w.dir);
                (recorded && hooks.len() == 1).then(|| hooks[0])
            },
        );
        let killed = std::process::Command::new("kill")
            .args(["-KILL", &hook.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let (ok, _, err) = first.join().unwrap();
        assert!(!ok && err.contains("pre-receive hook declined"), "{err}");
    });
    // git has ended, the release has not: a push meanwhile is refused.
    let (ok, _, err) = repo.git_with(&w.token, &["push", "warden", "main"]);
    assert!(
        !ok && err.contains("another push of g is being built here"),
        "{err}"
    );
    // Nor may the app be removed (its repository with it) under the release.
    let rm = w.api("DELETE", "/v1/apps/g", None);
    assert_eq!(rm.status, 409, "{}", rm.text());
    // Once the release has ended, the lock is given back and a push builds.
    warden_test_support::wait_until(
        "a push once the cut-off release ended",
        std::time::Duration::from_secs(120),
        || {
            let (ok, _, err) = repo.git_with(&w.token, &["push", "warden", "main"]);
            assert!(ok || err.contains("being built here"), "{err}");
            ok.then_some(())
        },
    );
    assert_eq!(answer(&w, "alice", "g")["answer"], "one");
    assert_eq!(releases(&w, "g").len(), 2);
}

#[test]
fn a_moved_branch_or_a_non_commit_is_refused_before_it_builds_and_dead_quarantines_go() {
    let w = Warden::demo(BIN);
    let url = remote(&w, "g");
    let repo = Repo::new("one");
    repo.ok(&["remote", "add", "warden", &url]);
    let first = repo.ok(&["rev-parse", "HEAD"]);
    let (ok, _, err) = repo.git_with(&w.token, &["push", "warden", "main"]);
    assert!(ok, "{err}");
    let second = repo.commit("two");
    let (ok, _, err) = repo.git_with(&w.token, &["push", "warden", "main"]);
    assert!(ok, "{err}");

    // A quarantine a SIGKILLed git left, an hour and more ago.
    let repo_dir = w.dir.join("git/repos/g.git");
    let dead = repo_dir.join("objects/tmp_objdir-incoming-dead01");
    std::fs::create_dir_all(dead.join("pack")).unwrap();
    let touched = std::process::Command::new("touch")
        .args(["-d", "2 hours ago"])
        .arg(&dead)
        .status()
        .unwrap();
    assert!(touched.success());

    // A push that saw main at the first commit (another push moved it since).
    let third = repo.commit("three");
    let sent = pack(&repo, &format!("{third}\n^{second}\n"));
    let said = raw_push(&w, "g", &first, &third, &sent);
    assert!(
        said.contains("another push moved main of g since this push began"),
        "{said}"
    );
    assert_eq!(releases(&w, "g").len(), 2);
    assert_eq!(remote_main(&w, "g").as_deref(), Some(second.as_str()));
    assert!(!dead.exists(), "the dead push's quarantine is swept");

    // main set to a tree: no commit to build.
    let tree = repo.ok(&["rev-parse", &format!("{second}^{{tree}}")]);
    let said = raw_push(&w, "g", &second, &tree, &pack(&repo, ""));
    assert!(said.contains("must name a commit"), "{said}");
    assert_eq!(releases(&w, "g").len(), 2);
    assert_eq!(remote_main(&w, "g").as_deref(), Some(second.as_str()));
    assert_eq!(answer(&w, "alice", "g")["answer"], "two");
}

#[test]
fn a_removed_apps_repository_goes_with_it() {
    let w = Warden::demo(BIN);
    let url = remote(&w, "g");
    let repo = Repo::new("one");
    repo.ok(&["remote", "add", "warden", &url]);
    let first = repo.ok(&["rev-parse", "HEAD"]);
    let (ok, _, err) = repo.git_with(&w.token, &["push", "warden", "main"]);
    assert!(ok, "{err}");
    assert!(advertised(&w, "g").contains(&first));

    assert_eq!(w.api("DELETE", "/v1/apps/g", None).status, 204);
    // A new app of the name is shown none of the old one's commits, and cannot deploy them
    // by naming one in a push without its objects.
    assert!(!advertised(&w, "g").contains(&first));
    let zero = "0".repeat(40);
    let said = raw_push(&w, "g", &zero, &first, &pack(&repo, ""));
    assert!(!said.contains("serves"), "{said}");
    assert_eq!(remote_main(&w, "g"), None);
    let r = w.api("GET", "/v1/apps/g/releases", None);
    assert!(
        r.status == 404 || r.json().as_array().is_some_and(Vec::is_empty),
        "{}",
        r.text()
    );
}

#[test]
fn a_tree_that_unpacks_past_the_cap_is_refused_before_it_is_uploaded() {
    let w = warden_test_support::Launch::new(BIN)
        .args(&["--max-upload-mb", "1"])
        .start();
    let url = remote(&w, "g");
    let repo = Repo::new("one");
    // One MiB of zeros, listed five times: a pack of a few KiB, a tar past 4 MiB (what
    // warden unpacks for --max-upload-mb 1) whose gzip is far under 1 MiB.
    for i in 0..5 {
        std::fs::write(repo.path().join(format!("zeros{i}")), vec![0u8; 1 << 20]).unwrap();
    }
    repo.commit("big");
    repo.ok(&["remote", "add", "warden", &url]);
    let (ok, _, err) = repo.git_with(&w.token, &["push", "warden", "main"]);
    assert!(
        !ok && err.contains("the pushed tree unpacks to more than 4 MiB"),
        "{err}"
    );
    assert_eq!(remote_main(&w, "g"), None);
}

#[test]
fn a_push_builds_when_warden_was_given_a_relative_data_dir() {
    let cwd = tempfile::Builder::new()
        .prefix("warden-it")
        .tempdir()
        .unwrap();
    // Passable, as the launcher makes its data dirs, for instances under uids of their own.
    std::fs::set_permissions(
        cwd.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .unwrap();
    let mut warden = std::process::Command::new(BIN)
        .args([
            "up",
            "--listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
        ])
        .args(["--data-dir", "warden-data", "--data", "none"])
        .args(["--demo", "--tls-listen", "127.0.0.1:0"])
        .current_dir(cwd.path())
        .env("WARDEN_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let data = cwd.path().join("warden-data");
    let api = warden_test_support::wait_until(
        "warden to write endpoints.json",
        std::time::Duration::from_secs(60),
        || {
            let text = std::fs::read_to_string(data.join("endpoints.json")).ok()?;
            let ep: serde_json::Value = serde_json::from_str(&text).ok()?;
            Some(ep["api"].as_str()?.to_owned())
        },
    );
    let token = std::fs::read_to_string(data.join("admin-token")).unwrap();
    let repo = Repo::new("one");
    repo.ok(&["remote", "add", "warden", &format!("{api}/v1/apps/g/git")]);
    let (ok, _, err) = repo.git_with(token.trim(), &["push", "warden", "main"]);
    let _ = warden.kill();
    let _ = warden.wait();
    assert!(ok && err.contains("release 1 of g serves"), "{err}");
}
