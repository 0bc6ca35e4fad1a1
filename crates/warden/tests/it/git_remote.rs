//! `git push` to warden (issue 38): `warden git-remote APP` names a remote; a real `git push`
//! over the API's HTTP builds and rolls out the pushed commit, with the build's output shown
//! by git as `remote:` lines and the commit recorded in the release; a failed build is refused
//! by git and changes nothing; wrong tokens, deployers of other apps, clones, deletions and
//! other branches are refused, each saying why.

use std::path::{Path, PathBuf};

use serde_json::json;
use warden_test_support::{request, Warden};

use crate::deploy::{answer, fixture, releases, run};
use crate::BIN;

/// A git work tree of the `plain` test app, committing as a test user, pushing with a token
/// that git gets from `GIT_ASKPASS` (git's own prompt, answered by a script), in a home of
/// its own so that no config or credential of the machine takes part.
pub(crate) struct Repo {
    tree: tempfile::TempDir,
    home: tempfile::TempDir,
}

impl Repo {
    pub(crate) fn new(answer: &str) -> Self {
        let tree = fixture("plain");
        let home = tempfile::tempdir().unwrap();
        let askpass = home.path().join("askpass");
        std::fs::write(&askpass, "#!/bin/sh\nprintf '%s\\n' \"$TEST_GIT_TOKEN\"\n").unwrap();
        std::fs::set_permissions(
            &askpass,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        let repo = Self { tree, home };
        repo.ok(&["init", "--quiet", "--initial-branch=main"]);
        repo.commit(answer);
        repo
    }

    /// Makes the app answer `text` and commits it; the commit's id.
    pub(crate) fn commit(&self, text: &str) -> String {
        let server = self.tree.path().join("server.py");
        let code = std::fs::read_to_string(&server).unwrap();
        let marker = "os.environ.get(\"ANSWER\", \"";
        let (before, after) = code.split_once(marker).unwrap();
        let rest = after.split_once('"').unwrap().1;
        let code = format!("{before}{marker}{text}\"{rest}");
        std::fs::write(&server, code).unwrap();
        self.ok(&["add", "."]);
        self.ok(&["commit", "--quiet", "--allow-empty", "-m", text]);
        self.ok(&["rev-parse", "HEAD"])
    }

    /// `git ARGS` with `token` as the password git is given; (succeeded, stdout, stderr).
    pub(crate) fn git_with(&self, token: &str, args: &[&str]) -> (bool, String, String) {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args(args)
            .current_dir(self.tree.path())
            .env("HOME", self.home.path())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_ASKPASS", self.home.path().join("askpass"))
            .env("TEST_GIT_TOKEN", token)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub(crate) fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.git_with("", args);
        assert!(ok, "git {args:?}: {err}");
        out
    }

    pub(crate) fn path(&self) -> &Path {
        self.tree.path()
    }
}

/// The remote `warden git-remote` prints for `app`.
pub(crate) fn remote(w: &Warden, app: &str) -> String {
    let (ok, out, err) = run(w, &["git-remote", app]);
    assert!(ok, "{err}");
    assert!(err.contains("git push warden main"), "{err}");
    out.trim().to_owned()
}

/// Where warden keeps `app`'s bare repository, and the commit its `main` names (None: none).
pub(crate) fn remote_main(w: &Warden, app: &str) -> Option<String> {
    let repo: PathBuf = w.dir.join("git/repos").join(format!("{app}.git"));
    let out = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(&repo)
        .args(["rev-parse", "--verify", "--quiet", "refs/heads/main"])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[test]
fn a_git_push_builds_rolls_out_and_records_the_commit_and_a_failed_build_moves_nothing() {
    let w = Warden::demo(BIN);
    let url = remote(&w, "g");
    assert_eq!(url, format!("{}/v1/apps/g/git", w.api));
    let repo = Repo::new("one");
    repo.ok(&["remote", "add", "warden", &url]);

    let (ok, _, err) = repo.git_with(&w.token, &["push", "warden", "main"]);
    assert!(ok, "{err}");
    // The build's own lines, through git.
    assert!(
        err.contains("remote: warden: building")
            && err.contains("remote: warden: release 1 of g serves"),
        "{err}"
    );
    assert_eq!(answer(&w, "alice", "g")["answer"], "one");
    let first = repo.ok(&["rev-parse", "HEAD"]);
    assert_eq!(remote_main(&w, "g").as_deref(), Some(first.as_str()));
    let (ok, list, err) = run(&w, &["releases", "g"]);
    assert!(
        ok && list.contains(&format!("git push main@{first}")),
        "{list}{err}"
    );

    // A second commit rolls out; a rollback brings the first back.
    let second = repo.commit("two");
    let (ok, _, err) = repo.git_with(&w.token, &["push", "warden", "main"]);
    assert!(ok && err.contains("release 2 of g serves"), "{err}");
    assert_eq!(answer(&w, "alice", "g")["answer"], "two");
    let (ok, _, err) = run(&w, &["rollback", "g", "1"]);
    assert!(ok, "{err}");
    assert_eq!(answer(&w, "alice", "g")["answer"], "one");

    // A build that fails: git refuses the push with the build's error, the branch stays.
    std::fs::write(
        repo.path().join("requirements.txt"),
        "-e /nonexistent-warden-package\n",
    )
    .unwrap();
    repo.commit("three");
    let (ok, _, err) = repo.git_with(&w.token, &["push", "warden", "main"]);
    assert!(!ok, "a failed build must refuse the push: {err}");
    assert!(
        err.contains("remote:")
            && err.contains("nonexistent-warden-package")
            && err.contains("pre-receive hook declined"),
        "{err}"
    );
    assert_eq!(answer(&w, "alice", "g")["answer"], "one");
    assert_eq!(remote_main(&w, "g").as_deref(), Some(second.as_str()));

    // Fixed, it serves.
    std::fs::remove_file(repo.path().join("requirements.txt")).unwrap();
    let fourth = repo.commit("four");
    let (ok, _, err) = repo.git_with(&w.token, &["push", "warden", "main"]);
    assert!(ok, "{err}");
    assert_eq!(answer(&w, "alice", "g")["answer"], "four");
    let all = releases(&w, "g");
    let newest = all.last().unwrap();
    assert_eq!(newest["source"]["from"], format!("git push main@{fourth}"));
    assert_eq!(newest["by"], "admin token");
}

#[test]
fn refused_pushes_say_why_and_change_nothing() {
    let w = Warden::demo(BIN);
    let url = remote(&w, "g");
    let repo = Repo::new("one");
    repo.ok(&["remote", "add", "warden", &url]);

    // A wrong token: 401, git says authentication failed, and no app is made.
    let (ok, _, err) = repo.git_with("not-a-token", &["push", "warden", "main"]);
    assert!(!ok && err.contains("Authentication failed"), "{err}");
    assert_eq!(w.api("GET", "/v1/apps/g", None).status, 404);
    // Without credentials git is asked for them (Basic), not told Bearer.
    let r = request(
        "GET",
        &format!("{url}/info/refs?service=git-receive-pack"),
        &[],
        b"",
    );
    assert_eq!(
        (r.status, r.header("www-authenticate")),
        (401, Some("Basic realm=\"warden\""))
    );

    // A deployer of another app: 403, saying which role it needs.
    let (dep, _) = operator(&w, "dep", "other");
    let (ok, _, err) = repo.git_with(&dep, &["push", "warden", "main"]);
    assert!(!ok && err.contains("deployer role of app \"g\""), "{err}");
    assert_eq!(w.api("GET", "/v1/apps/g", None).status, 404);

    // The owner's push serves; then a clone, a deletion and another branch are refused.
    let (ok, _, err) = repo.git_with(&w.token, &["push", "warden", "main"]);
    assert!(ok, "{err}");
    let first = repo.ok(&["rev-parse", "HEAD"]);
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("copy").display().to_string();
    let (ok, _, err) = repo.git_with(&w.token, &["clone", &url, &target]);
    assert!(!ok && err.contains("only receives pushes"), "{err}");

    let (ok, _, err) = repo.git_with(&w.token, &["push", "warden", ":main"]);
    assert!(
        !ok && err.contains("deleting refs/heads/main is refused"),
        "{err}"
    );
    assert_eq!(remote_main(&w, "g").as_deref(), Some(first.as_str()));

    repo.commit("two");
    let (ok, _, err) = repo.git_with(&w.token, &["push", "warden", "main:feature"]);
    assert!(
        !ok && err.contains("warden builds pushes to main or master, not refs/heads/feature"),
        "{err}"
    );
    assert_eq!(answer(&w, "alice", "g")["answer"], "one");
    assert_eq!(releases(&w, "g").len(), 1);

    // A deployer of g pushes with their session token, and the release names them.
    let (dep_g, _) = operator(&w, "gdep", "g");
    let (ok, _, err) = repo.git_with(&dep_g, &["push", "warden", "main"]);
    assert!(ok, "{err}");
    assert_eq!(answer(&w, "alice", "g")["answer"], "two");
    assert_eq!(releases(&w, "g").last().unwrap()["by"], "operator:gdep");
}

/// A session token of a new operator `name`, deployer of `app`, and their password.
fn operator(w: &Warden, name: &str, app: &str) -> (String, String) {
    let password = format!("{name}-password-1");
    let made = w.api(
        "POST",
        "/v1/operators",
        Some(json!({"name": name, "password": password,
                    "roles": [{"role": "deployer", "apps": [app]}]})),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    let login = request(
        "POST",
        &format!("{}/v1/login", w.api),
        &[("content-type", "application/json")],
        json!({"name": name, "password": password})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(login.status, 200, "{}", login.text());
    (login.json()["token"].as_str().unwrap().to_owned(), password)
}

#[test]
fn a_push_is_bounded_by_the_upload_limit_once_inflated() {
    use std::io::Write as _;
    let w = warden_test_support::Launch::new(BIN)
        .arg("--max-upload-mb")
        .arg("1")
        .start();
    // 3 MiB of zeros gzip to a few KiB: small on the wire, over the limit once inflated.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![0u8; 3 << 20]).unwrap();
    let body = gz.finish().unwrap();
    assert!(body.len() < 64 * 1024);
    let r = request(
        "POST",
        &format!("{}/v1/apps/g/git/git-receive-pack", w.api),
        &[
            (
                "authorization",
                &warden_test_support::http::basic("git", &w.token),
            ),
            ("content-type", "application/x-git-receive-pack-request"),
            ("content-encoding", "gzip"),
        ],
        &body,
    );
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.text().contains("--max-upload-mb"), "{}", r.text());
}

/// A repository committed once whose web instance takes seconds to be ready (well within its
/// start timeout), so that its push's release (and the push lock) lasts that long; its
/// remote `warden` is `url`.
pub(crate) fn slow_repo(url: &str) -> Repo {
    let repo = Repo::new("one");
    std::fs::write(
        repo.path().join("Procfile"),
        "web: sleep 5; exec python3 server.py\n",
    )
    .unwrap();
    repo.commit("one");
    repo.ok(&["remote", "add", "warden", url]);
    repo
}

#[test]
fn a_push_while_another_is_built_is_refused_and_the_first_goes_on() {
    let w = Warden::demo(BIN);
    let url = remote(&w, "g");
    let repo = slow_repo(&url);
    std::thread::scope(|s| {
        let first = s.spawn(|| repo.git_with(&w.token, &["push", "warden", "main"]));
        warden_test_support::wait_until(
            "the first push's release recorded",
            std::time::Duration::from_secs(60),
            || {
                let r = w.api("GET", "/v1/apps/g/releases", None);
                (r.status == 200 && !r.json().as_array()?.is_empty()).then_some(())
            },
        );
        let (ok, _, err) = repo.git_with(&w.token, &["push", "warden", "main"]);
        assert!(
            !ok && err.contains("another push of g is being built here"),
            "{err}"
        );
        let (ok, _, err) = first.join().unwrap();
        assert!(ok, "{err}");
    });
    assert_eq!(answer(&w, "alice", "g")["answer"], "one");
    assert_eq!(releases(&w, "g").len(), 1);
}
