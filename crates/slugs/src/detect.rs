//! How to build and run a pushed tree, told from its files the way buildpacks do: a `Procfile`
//! names the start command; `requirements.txt` or `pyproject.toml` make a Python app,
//! `package.json` a Node app, an `index.html` without a Procfile a static site. The pusher may
//! name the kind instead.

use std::collections::BTreeMap;
use std::path::Path;

use warden_core::builds::BuildError;
use warden_core::BuildKind;

use super::beneath::{BeneathError, Root};

/// The Python that builds and runs virtual environments: the system's, which the sandbox shows
/// (a Python under /root or /opt is invisible there).
pub(crate) const PYTHON: &str = "/usr/bin/python3";

/// What to run to build a tree and then to start it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    /// The kind of app.
    pub kind: BuildKind,
    /// Shell script run in the tree to build it; `None` when there is nothing to build.
    pub script: Option<String>,
    /// What instances run; empty for a static site.
    pub command: Vec<String>,
    /// What the release phase runs once per push before its trial (the Procfile's `release:`
    /// line, through `/bin/sh -c`); empty when the Procfile has none.
    pub release: Vec<String>,
    /// What each other process type of the Procfile runs (`worker`, `clock`: every line but
    /// `web` and `release`), through `/bin/sh -c`; empty for a static site.
    pub processes: BTreeMap<String, Vec<String>>,
}

/// Most bytes of a Procfile or package.json that detection reads.
const MAX_RECIPE_FILE: u64 = 1 << 20;

/// Most process types (besides `web` and `release`) a Procfile may name: each becomes a
/// derived spec every gateway and agent decodes and every view rebuilds, so a huge Procfile
/// must not turn into thousands of them.
pub const MAX_PROCESS_TYPES: usize = 16;

fn detect_error(msg: impl Into<String>) -> BuildError {
    BuildError::Detect(msg.into())
}

/// The text of `name` in the tree, if it is there; bounded, and opened beneath the root.
fn read_text(root: &Root, name: &str) -> Result<Option<String>, BuildError> {
    let bytes = root
        .read(name, MAX_RECIPE_FILE)
        .map_err(|e: BeneathError| detect_error(e.to_string()))?;
    bytes
        .map(|b| {
            String::from_utf8(b).map_err(|_| detect_error(format!("{name} is not UTF-8 text")))
        })
        .transpose()
}

/// The lines of a Procfile warden runs.
#[derive(Default)]
struct Procfile {
    /// `web:`, what instances run.
    web: Option<String>,
    /// `release:`, what the release phase runs.
    release: Option<String>,
    /// Every other line: process types kept running by their counts (`worker:`, `clock:`).
    others: BTreeMap<String, String>,
}

/// The process types of a slug built before its mark kept them, read again from the
/// Procfile in its tree (beneath it, as a build reads it): none for a static site, or where
/// the Procfile cannot be read or would be refused now (it was built without them then).
pub(crate) fn process_types(
    tree: &std::path::Path,
    kind: BuildKind,
) -> BTreeMap<String, Vec<String>> {
    if kind == BuildKind::Static {
        return BTreeMap::new();
    }
    let Ok(root) = Root::open(tree) else {
        return BTreeMap::new();
    };
    match procfile(&root) {
        Ok(p) => p
            .others
            .into_iter()
            .map(|(k, c)| {
                (
                    k,
                    vec!["/bin/sh".to_owned(), "-c".to_owned(), start_script(&c)],
                )
            })
            .collect(),
        Err(_) => BTreeMap::new(),
    }
}

/// The lines of the tree's Procfile, if it has one: `web`, `release` and the other process
/// types. Refuses a Procfile without a `web` line, a type named twice or a name a process
/// type cannot have.
fn procfile(root: &Root) -> Result<Procfile, BuildError> {
    let Some(text) = read_text(root, "Procfile")? else {
        return Ok(Procfile::default());
    };
    let mut found = Procfile::default();
    let mut seen = std::collections::BTreeSet::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let Some((name, cmd)) = line.split_once(':') else {
            continue;
        };
        let (name, cmd) = (name.trim(), cmd.trim());
        warden_core::validate_process_type(name)
            .map_err(|e| detect_error(format!("Procfile line {}: {e}", n + 1)))?;
        if !seen.insert(name.to_owned()) {
            return Err(detect_error(format!(
                "Procfile line {}: process type {name:?} is named twice; keep one line per type",
                n + 1
            )));
        }
        if cmd.is_empty() {
            return Err(detect_error(format!(
                "Procfile line {}: process type {name:?} has no command; write `{name}: COMMAND`",
                n + 1
            )));
        }
        match name {
            "web" => found.web = Some(cmd.to_owned()),
            "release" => found.release = Some(cmd.to_owned()),
            _ => {
                if found.others.len() >= MAX_PROCESS_TYPES {
                    return Err(detect_error(format!(
                        "Procfile line {}: more than {MAX_PROCESS_TYPES} process types besides `web` and `release`; merge or remove some",
                        n + 1
                    )));
                }
                found.others.insert(name.to_owned(), cmd.to_owned());
            }
        }
    }
    if found.web.is_none() {
        return Err(detect_error(
            "the Procfile has no `web:` line; add one with the command that serves the app, e.g. `web: gunicorn app:app --bind 127.0.0.1:$PORT`",
        ));
    }
    Ok(found)
}

/// The command that starts a Node app without a Procfile: `npm start` when package.json has a
/// start script, else `node` on its `main` or on server.js or index.js.
fn node_start(root: &Root) -> Result<String, BuildError> {
    let text = read_text(root, "package.json")?
        .ok_or_else(|| detect_error("a Node app needs a package.json"))?;
    let pkg: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| detect_error(format!("package.json is not JSON: {e}")))?;
    if pkg["scripts"]["start"].is_string() {
        return Ok("npm start".into());
    }
    let main = pkg["main"].as_str().map(str::to_owned);
    for candidate in main
        .iter()
        .map(String::as_str)
        .chain(["server.js", "index.js"])
    {
        if root.is_file(candidate) {
            return Ok(format!("node {}", shell_quote(candidate)));
        }
    }
    Err(detect_error(
        "cannot tell how to start this Node app: add a `start` script to package.json or a Procfile with a `web:` line",
    ))
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// What `/bin/sh -c` runs for the `web:` command `cmd`: the line itself, as Heroku runs it.
/// A lone simple command is `exec`'d, so that the app is the instance's process; a line that
/// is more (`cd x && exec y`, `sleep 4; y`, `exec y`, `A=1 y`) runs as written, its last
/// command a child of the shell unless it says `exec` (signals reach it either way: they go to
/// the instance's process group).
fn start_script(cmd: &str) -> String {
    let first = cmd.split_whitespace().next().unwrap_or_default();
    let compound = cmd.contains([';', '&', '|', '\n', '(', ')', '`', '{', '}'])
        || first.contains('=')
        || matches!(
            first,
            "exec" | "if" | "while" | "until" | "for" | "case" | "!" | "cd" | "export" | "set"
        );
    if compound {
        cmd.to_owned()
    } else {
        format!("exec {cmd}")
    }
}

/// Decides how to build and run the tree at `dir`, as `kind` when the pusher named one.
pub(crate) fn detect(dir: &Path, kind: Option<BuildKind>) -> Result<Recipe, BuildError> {
    let root = Root::open(dir)
        .map_err(|e| BuildError::Node(format!("cannot open the unpacked tree: {e}")))?;
    let has = |f: &str| root.is_file(f);
    let Procfile {
        web,
        release,
        others,
    } = procfile(&root)?;
    let python = has("requirements.txt") || has("pyproject.toml");
    let kind = match kind {
        Some(k) => k,
        None if python => BuildKind::Python,
        None if has("package.json") => BuildKind::Node,
        None if web.is_some() => BuildKind::Procfile,
        None if has("index.html") => BuildKind::Static,
        None => {
            return Err(detect_error(
                "cannot tell how to build or run this tree: add a Procfile with a `web:` line, a requirements.txt or pyproject.toml (Python), a package.json (Node) or an index.html (a static site), or name it with --kind",
            ))
        }
    };
    let run = |cmd: String| vec!["/bin/sh".to_owned(), "-c".to_owned(), start_script(&cmd)];
    // A static site runs nothing, so it has no release phase or other process either.
    let release = match (kind, release) {
        (BuildKind::Static, _) | (_, None) => Vec::new(),
        (_, Some(r)) => run(r),
    };
    let processes = match kind {
        BuildKind::Static => BTreeMap::new(),
        _ => others.into_iter().map(|(k, c)| (k, run(c))).collect(),
    };
    let mut recipe = match kind {
        BuildKind::Python => {
            let Some(web) = web else {
                return Err(detect_error(
                    "a Python app needs a Procfile with a `web:` line, e.g. `web: gunicorn app:app --bind 127.0.0.1:$PORT`",
                ));
            };
            if !Path::new(PYTHON).is_file() {
                return Err(BuildError::Node(format!(
                    "this node has no {PYTHON} to build Python apps with; install it with its venv module (Debian: apt-get install python3-venv)"
                )));
            }
            let install = if has("requirements.txt") {
                "-r requirements.txt"
            } else if has("pyproject.toml") {
                "."
            } else {
                return Err(detect_error(
                    "a Python app needs a requirements.txt or a pyproject.toml",
                ));
            };
            Recipe {
                kind,
                script: Some(format!(
                    // A venv copied from the serving release (`reuse`) is installed into,
                    // through its own Python: its scripts' shebangs were made to find
                    // `python3` on the PATH, which in a build is the system's.
                    "set -e\n[ -x .venv/bin/python ] || {PYTHON} -m venv .venv\n.venv/bin/python -m pip install --disable-pip-version-check --no-input --no-cache-dir {install}\n"
                )),
                command: run(web),
                release: Vec::new(),
                processes: BTreeMap::new(),
            }
        }
        BuildKind::Node => {
            if !has("package.json") {
                return Err(detect_error("a Node app needs a package.json"));
            }
            let web = match web {
                Some(w) => w,
                None => node_start(&root)?,
            };
            // `npm ci` empties node_modules first; with a lock file and the serving release's
            // node_modules copied in (`reuse`), `npm install` keeps to the lock, installs what
            // changed and removes what is no longer in it.
            let install = if has("package-lock.json") {
                "if [ -d node_modules ]; then npm install --no-save --prefer-offline {flags}; else npm ci {flags}; fi"
            } else {
                "npm install {flags}"
            }
            .replace("{flags}", "--omit=dev --no-audit --no-fund --no-update-notifier");
            Recipe {
                kind,
                script: Some(format!("set -e\n{install}\n")),
                command: run(web),
                release: Vec::new(),
                processes: BTreeMap::new(),
            }
        }
        BuildKind::Procfile => {
            let Some(web) = web else {
                return Err(detect_error(
                    "kind procfile needs a Procfile with a `web:` line",
                ));
            };
            Recipe {
                kind,
                script: None,
                command: run(web),
                release: Vec::new(),
                processes: BTreeMap::new(),
            }
        }
        BuildKind::Static => {
            if !has("index.html") {
                return Err(detect_error(
                    "a static site needs an index.html at the top of the tree",
                ));
            }
            Recipe {
                kind,
                script: None,
                command: Vec::new(),
                release: Vec::new(),
                processes: BTreeMap::new(),
            }
        }
    };
    recipe.release = release;
    recipe.processes = processes;
    Ok(recipe)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("dir");
        for (name, body) in files {
            std::fs::write(d.path().join(name), body).expect("write");
        }
        d
    }

    fn kind_of(files: &[(&str, &str)]) -> Result<Recipe, BuildError> {
        detect(tree(files).path(), None)
    }

    #[test]
    fn tells_kinds_apart_from_their_files() {
        let procfile = (
            "Procfile",
            "# a comment\nworker: x\nweb: gunicorn app:app\n",
        );
        if Path::new(PYTHON).is_file() {
            let py = kind_of(&[procfile, ("requirements.txt", "flask\n")]).expect("python");
            assert_eq!(py.kind, BuildKind::Python);
            assert_eq!(py.command[2], "exec gunicorn app:app");
            assert!(py.script.expect("script").contains("-r requirements.txt"));
        }
        let node =
            kind_of(&[("package.json", r#"{"scripts":{"start":"node s.js"}}"#)]).expect("node");
        assert_eq!(
            (node.kind, node.command[2].as_str()),
            (BuildKind::Node, "exec npm start")
        );
        assert!(node.script.expect("script").contains("npm install"));
        let main = kind_of(&[
            ("package.json", r#"{"main":"app.js"}"#),
            ("package-lock.json", "{}"),
            ("app.js", ""),
        ])
        .expect("node main");
        assert_eq!(main.command[2], "exec node 'app.js'");
        assert!(main.script.expect("script").contains("npm ci"));
        let site = kind_of(&[("index.html", "<p>hi")]).expect("static");
        assert_eq!((site.kind, site.command.len()), (BuildKind::Static, 0));
        let bin = kind_of(&[procfile, ("index.html", "")]).expect("procfile");
        assert_eq!((bin.kind, bin.script), (BuildKind::Procfile, None));
    }

    #[test]
    fn a_release_line_travels_with_the_recipe_as_the_web_line_does() {
        let with = kind_of(&[(
            "Procfile",
            "web: ./serve\nrelease: psql -f migrate.sql\nworker: x\n",
        )])
        .expect("procfile");
        assert_eq!(with.release, ["/bin/sh", "-c", "exec psql -f migrate.sql"]);
        assert_eq!(with.command[2], "exec ./serve");
        let without = kind_of(&[("Procfile", "web: ./serve\n")]).expect("procfile");
        assert!(without.release.is_empty());
        assert_eq!(with.processes["worker"], ["/bin/sh", "-c", "exec x"]);
        assert_eq!(
            with.processes.len(),
            1,
            "neither web nor release is a process type"
        );
        // A release line alone does not make an app.
        let err = kind_of(&[("Procfile", "release: ./migrate\n")]).expect_err("no web");
        assert!(err.to_string().contains("no `web:` line"), "{err}");
    }

    #[test]
    fn a_web_line_runs_as_the_shell_would_and_a_lone_command_is_execd() {
        for (line, script) in [
            ("python3 app.py", "exec python3 app.py"),
            ("cd x && exec y", "cd x && exec y"),
            ("sleep 4; python3 app.py", "sleep 4; python3 app.py"),
            ("exec y --port $PORT", "exec y --port $PORT"),
            ("A=1 y", "A=1 y"),
        ] {
            assert_eq!(start_script(line), script, "{line}");
        }
    }

    #[test]
    fn says_what_is_missing() {
        for (files, want) in [
            (vec![("README", "")], "cannot tell how to build"),
            (vec![("Procfile", "worker: x\n")], "no `web:` line"),
            (
                vec![("package.json", "{}")],
                "cannot tell how to start this Node app",
            ),
            (vec![("package.json", "{")], "not JSON"),
            (
                vec![("Procfile", "web: a\nworker: b\nworker: c\n")],
                "line 3: process type \"worker\" is named twice",
            ),
            (
                vec![("Procfile", "web: a\nWorker.1: b\n")],
                "line 2: process type \"Worker.1\" must be",
            ),
            (vec![("Procfile", "web: a\nclock:\n")], "has no command"),
        ] {
            let err = kind_of(&files).expect_err(want).to_string();
            assert!(err.contains(want), "{err:?} should say {want:?}");
        }
        // A Procfile that links out of the tree, through links that each look inside, is
        // never read.
        let outer = tempfile::tempdir().expect("dir");
        std::fs::write(outer.path().join("outside"), "web: cat /etc/shadow\n").expect("write");
        let t = outer.path().join("t");
        std::fs::create_dir_all(t.join("b")).expect("b");
        std::os::unix::fs::symlink("..", t.join("b/c")).expect("link");
        std::os::unix::fs::symlink("b/c/../outside", t.join("Procfile")).expect("link");
        let err = detect(&t, None).expect_err("outside").to_string();
        assert!(err.contains("leads outside the tree"), "{err}");
        let forced = detect(tree(&[("README", "")]).path(), Some(BuildKind::Static));
        assert!(forced
            .expect_err("no index")
            .to_string()
            .contains("index.html"));
    }
}
