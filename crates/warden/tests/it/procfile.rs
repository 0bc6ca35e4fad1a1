//! A Procfile's `web:` line runs as Heroku runs it, with `/bin/sh -c`: several commands, a
//! `cd` first, an `exec` of its own. Each is pushed through the CLI and must serve.

use std::path::Path;

use warden_test_support::{cli, Warden};

use crate::BIN;

/// A dependency-free app under `app/` that answers what `answer.txt` in its working directory
/// says, with `Procfile` as its Procfile.
fn tree(procfile: &str) -> tempfile::TempDir {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/apps/plain/server.py");
    let server = std::fs::read_to_string(src).unwrap().replace(
        r#"os.environ.get("ANSWER", "hello from plain")"#,
        r#"open("answer.txt").read().strip()"#,
    );
    assert!(server.contains("answer.txt"), "the fixture changed");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("app")).unwrap();
    std::fs::write(dir.path().join("app/server.py"), server).unwrap();
    std::fs::write(dir.path().join("app/answer.txt"), "from app/").unwrap();
    std::fs::write(dir.path().join("answer.txt"), "from the top").unwrap();
    std::fs::write(dir.path().join("Procfile"), format!("web: {procfile}\n")).unwrap();
    dir
}

#[test]
fn web_lines_with_several_commands_run_as_the_shell_runs_them() {
    let w = Warden::demo(BIN);
    let data = w.dir.display().to_string();
    for (app, line, want) in [
        ("cd-exec", "cd app && exec python3 server.py", "from app/"),
        ("several", "sleep 1; cd app; python3 server.py", "from app/"),
        ("own-exec", "exec python3 app/server.py", "from the top"),
    ] {
        let src = tree(line);
        let d = src.path().display().to_string();
        let (ok, out, err) = cli(BIN, &["push", app, &d, "--data-dir", &data], &[]);
        assert!(ok, "{line}: the push failed:\n{out}\n{err}");
        let r = w.get_as("alice", &w.password("alice"), &format!("/apps/{app}/"));
        assert_eq!(r.status, 200, "{line}: {}", r.text());
        assert_eq!(r.json()["answer"], want, "{line}");
    }
}
