//! The API's end of warden's pre-receive hook. For each push, `git.rs` listens on a Unix
//! socket in a private directory and hands its path and a one-push key to `git receive-pack`
//! in the environment (never on a command line); git runs the hook (the warden binary, linked
//! as `DATA_DIR/git/hooks/pre-receive`), which sends the pushed refs here and prints what
//! comes back, which git shows as `remote:` lines. Here the pushed commit's tree becomes the
//! tarball `warden push` uploads and goes through the push handler as the principal that
//! authenticated the push; the hook exits non-zero unless the release serves, and git then
//! moves no branch.
//!
//! No token is made for the hook: the build runs in this process, as the request's principal.

use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use warden_api_types::{PushQuery, ReleaseEvent};

use crate::error::ApiError;
use crate::Api;

/// The environment variable naming the socket the hook connects to.
pub const SOCKET_ENV: &str = "WARDEN_GIT_HOOK_SOCKET";
/// The environment variable holding the key the hook presents, for this push only.
pub const KEY_ENV: &str = "WARDEN_GIT_HOOK_KEY";
/// The branches a push may build; others are refused with a message.
const BRANCHES: [&str; 2] = ["refs/heads/main", "refs/heads/master"];
/// How a build's error names the output it ends with (the agent's `build/`).
const LAST_LINES: &str = "; last lines:\n";
/// How long the hook's connection may take to say what was pushed.
const ASK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// Longest first line the hook may send (its refs and paths).
const MAX_ASK: usize = 64 * 1024;

/// What the hook sends: the key, the ref updates git received, and where the pushed objects
/// wait (git quarantines them until the hook agrees).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookAsk {
    /// The key of this push.
    pub key: String,
    /// `<old> <new> <ref>` lines, as git gave them to the hook.
    pub updates: Vec<String>,
    /// `GIT_OBJECT_DIRECTORY` of the hook: the quarantine.
    pub objects: Option<String>,
    /// `GIT_ALTERNATE_OBJECT_DIRECTORIES` of the hook: the repository's own objects.
    pub alternates: Option<String>,
}

/// What the API answers, one JSON line each: a line to show, then the verdict.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum HookSay {
    /// A line for git to show.
    Line(String),
    /// Whether git may update the refs.
    Accept(bool),
}

/// `DATA_DIR/git/hooks`: the only hooks git runs for warden's repositories.
pub(crate) fn hooks_dir(base: &Path) -> PathBuf {
    base.join("hooks")
}

/// Makes `dir` (mode 0700) unless it exists, and keeps it 0700.
pub(crate) fn private_dir(dir: &Path) -> Result<(), ApiError> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => private(dir),
        Err(e) => Err(ApiError::internal(format!(
            "cannot create {}: {e}",
            dir.display()
        ))),
    }
}

/// Sets `path` to mode 0700.
pub(crate) fn private(path: &Path) -> Result<(), ApiError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| ApiError::internal(format!("cannot make {} private: {e}", path.display())))
}

/// Links `hooks/pre-receive` to this very binary (which knows itself as the hook by that
/// name), replacing a link to another (an older binary's path).
pub(crate) fn install(base: &Path) -> Result<(), ApiError> {
    let hooks = hooks_dir(base);
    private_dir(&hooks)?;
    let exe = std::env::current_exe()
        .map_err(|e| ApiError::internal(format!("cannot find warden's own binary: {e}")))?;
    let link = hooks.join("pre-receive");
    if !std::fs::read_link(&link).is_ok_and(|t| t == exe) {
        let fresh = hooks.join(format!(".pre-receive.{}", warden_core::id::short_id()));
        std::os::unix::fs::symlink(&exe, &fresh)
            .and_then(|()| std::fs::rename(&fresh, &link))
            .map_err(|e| {
                let _ = std::fs::remove_file(&fresh);
                ApiError::internal(format!("cannot install warden's git hook: {e}"))
            })?;
    }
    // git skips a hook it cannot run and takes the push unbuilt: refuse instead.
    runnable(&link)
}

/// Whether the hook at `link` can be run; 503 saying why not.
fn runnable(link: &Path) -> Result<(), ApiError> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(link) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Ok(()),
        _ => Err(ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "warden's git hook ({}) cannot run: warden's binary was replaced or removed since this node started; restart warden on this node, then push again",
                link.display()
            ),
        )),
    }
}

/// The socket of one push, removed (and its task ended) when the push ends.
pub(crate) struct Listener {
    path: PathBuf,
    key: String,
    task: tokio::task::JoinHandle<()>,
    /// The app's push lock, once the hook took it: held until git has moved its ref (this
    /// listener is dropped after git exits), so that two pushes never build at once and a
    /// release never serves whose ref a later push's update then lost.
    _held: Held,
}

/// An app's push lock, while a push holds it.
type Held = std::sync::Arc<std::sync::Mutex<Option<Taken>>>;

/// The repositories a push holds, in this process.
static PUSHING: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// One repository's push lock, given back when dropped.
struct Taken(PathBuf);

impl Taken {
    /// The lock of `repo`, unless a push holds it.
    fn take(repo: &Path) -> Option<Self> {
        // A poisoned list still holds the right names: a panic cannot leave it half-changed.
        let mut held = PUSHING.lock().unwrap_or_else(|p| p.into_inner());
        if held.iter().any(|r| r == repo) {
            return None;
        }
        held.push(repo.to_owned());
        Some(Self(repo.to_owned()))
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        let mut held = PUSHING.lock().unwrap_or_else(|p| p.into_inner());
        held.retain(|r| *r != self.0);
    }
}

impl Listener {
    /// Listens for the hook of a push to `app` by `actor` into `repo`.
    pub(crate) fn bind(
        api: &Api,
        app: String,
        actor: String,
        repo: PathBuf,
    ) -> Result<Self, ApiError> {
        let base = api
            .data_dir
            .as_ref()
            .map(|d| d.join("git").join("run"))
            .ok_or_else(|| ApiError::internal("this API has no data directory"))?;
        private_dir(&base)?;
        let path = base.join(format!("{}.sock", warden_core::id::short_id()));
        let listener = tokio::net::UnixListener::bind(&path)
            .map_err(|e| {
                ApiError::internal(format!(
                    "cannot listen at {}: {e} (a Unix socket's path is at most 107 bytes: give warden a shorter --data-dir)",
                    path.display()
                ))
            })?;
        let key = warden_core::id::secret_token();
        let held = Held::default();
        let push = Push {
            api: api.clone(),
            app,
            actor,
            repo,
            key: key.clone(),
            held: held.clone(),
        };
        let task = tokio::spawn(push.serve(listener));
        Ok(Self {
            path,
            key,
            task,
            _held: held,
        })
    }

    /// What the hook needs to find this push.
    pub(crate) fn env(&self) -> [(&'static str, String); 2] {
        [
            (SOCKET_ENV, self.path.display().to_string()),
            (KEY_ENV, self.key.clone()),
        ]
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One push, waiting for its hook.
struct Push {
    api: Api,
    app: String,
    actor: String,
    repo: PathBuf,
    key: String,
    held: Held,
}

impl Push {
    /// Takes connections until one presents the key, and answers it.
    async fn serve(self, listener: tokio::net::UnixListener) {
        while let Ok((stream, _)) = listener.accept().await {
            let (read, mut write) = stream.into_split();
            let mut first = Vec::new();
            let mut read = tokio::io::BufReader::new(read).take(MAX_ASK as u64);
            // The hook sends its line at once; a connection that sends nothing (anything else
            // of warden's uid that found the socket) must not hold the push up.
            let sent = tokio::time::timeout(ASK_WAIT, read.read_until(b'\n', &mut first)).await;
            if !matches!(sent, Ok(Ok(_))) {
                continue;
            }
            let Ok(ask) = serde_json::from_slice::<HookAsk>(&first) else {
                continue;
            };
            if !bool::from(ask.key.as_bytes().ct_eq(self.key.as_bytes())) {
                continue;
            }
            let say = |s: HookSay| {
                let mut line = serde_json::to_vec(&s).unwrap_or_default();
                line.push(b'\n');
                line
            };
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<HookSay>();
            let work = self.answer(ask, tx);
            let send = async {
                while let Some(s) = rx.recv().await {
                    if write.write_all(&say(s)).await.is_err() {
                        return;
                    }
                }
            };
            tokio::join!(work, send);
            let _ = write.shutdown().await;
            return;
        }
    }

    /// Checks the updates, builds the pushed commit and says how it went.
    async fn answer(&self, ask: HookAsk, tx: tokio::sync::mpsc::UnboundedSender<HookSay>) {
        let line = |s: String| {
            let _ = tx.send(HookSay::Line(printable(&s)));
        };
        let accepted = match self.check(&ask.updates) {
            Err(why) => {
                line(why);
                false
            }
            Ok((branch, commit)) => match self.lock() {
                Err(why) => {
                    line(why);
                    false
                }
                Ok(()) => self.build(&ask, &branch, &commit, &line).await,
            },
        };
        let _ = tx.send(HookSay::Accept(accepted));
    }

    /// Takes the app's push lock, or says why not. In this process: one API process owns a
    /// data directory, and so the repositories in it.
    fn lock(&self) -> Result<(), String> {
        let Some(taken) = Taken::take(&self.repo) else {
            return Err(format!(
                "another push of {} is being built here; push again once it has ended",
                self.app
            ));
        };
        if let Ok(mut held) = self.held.lock() {
            *held = Some(taken);
        }
        Ok(())
    }

    /// The one branch update a push may make, or why not.
    fn check(&self, updates: &[String]) -> Result<(String, String), String> {
        let [update] = updates else {
            return Err(format!(
                "push one branch at a time: main (or master) is what warden builds; this push updates {} refs",
                updates.len()
            ));
        };
        let mut parts = update.split_whitespace();
        let (Some(_old), Some(new), Some(name), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("git gave the hook an update it cannot read".into());
        };
        if !BRANCHES.contains(&name) {
            return Err(format!(
                "warden builds pushes to main or master, not {name}; push your branch as main: `git push warden HEAD:main`"
            ));
        }
        let is_hex = new.len() >= 40 && new.bytes().all(|b| b.is_ascii_hexdigit());
        if !is_hex {
            return Err("git gave the hook an update it cannot read".into());
        }
        if new.bytes().all(|b| b == b'0') {
            return Err(format!(
                "deleting {name} is refused: the app keeps serving its release; `warden apps rm {}` removes the app",
                self.app
            ));
        }
        Ok((
            name.trim_start_matches("refs/heads/").to_owned(),
            new.to_owned(),
        ))
    }

    /// Builds `commit` through the push route; true when its release serves.
    async fn build(
        &self,
        ask: &HookAsk,
        branch: &str,
        commit: &str,
        line: &impl Fn(String),
    ) -> bool {
        let short = commit.get(..12).unwrap_or(commit);
        line(format!(
            "warden: building {short} of {branch} for {}",
            self.app
        ));
        let archive = match self.archive(ask, commit).await {
            Ok(a) => a,
            Err(e) => {
                line(e);
                return false;
            }
        };
        let mut headers = HeaderMap::new();
        if let Ok(by) = HeaderValue::from_str(&self.actor) {
            headers.insert("x-warden-by", by);
        }
        let query = PushQuery {
            kind: None,
            from: Some(format!("git push {branch}@{commit}")),
            groups: None,
        };
        let pushed = super::releases::push(
            State(self.api.clone()),
            UrlPath(self.app.clone()),
            Query(query),
            headers,
            Body::from(archive),
        )
        .await;
        let resp = match pushed {
            Ok(r) => r,
            Err(e) => {
                line(e.message().to_owned());
                return false;
            }
        };
        follow(resp.into_body(), &self.app, line).await
    }

    /// The commit's tree as the gzip'd tar `warden push` uploads, read from the quarantine
    /// the hook names (the pushed objects are nowhere else until the hook agrees).
    async fn archive(&self, ask: &HookAsk, commit: &str) -> Result<Vec<u8>, String> {
        use std::io::Write as _;
        let mut cmd = tokio::process::Command::new("git");
        cmd.env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
            )
            .env("GIT_DIR", &self.repo)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null");
        for (var, value) in [
            ("GIT_OBJECT_DIRECTORY", &ask.objects),
            ("GIT_ALTERNATE_OBJECT_DIRECTORIES", &ask.alternates),
        ] {
            if let Some(v) = value {
                // Only directories of this repository: the hook is warden's, but say so here.
                if !Path::new(v).starts_with(&self.repo) {
                    return Err(format!(
                        "the hook named objects outside the app's repository ({var})"
                    ));
                }
                cmd.env(var, v);
            }
        }
        // The tree, not the commit: no commit id header in the tar, which the unpacker
        // would refuse.
        let mut child = cmd
            .args(["archive", "--format=tar"])
            .arg(format!("{commit}^{{tree}}"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run git archive: {e}"))?;
        let (Some(mut tar), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err("git archive started without its pipes".into());
        };
        // Compressed as it comes, so that what is held is at most the upload limit.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = tar
                .read(&mut buf)
                .await
                .map_err(|e| format!("cannot read git archive's output: {e}"))?;
            if n == 0 {
                break;
            }
            gz.write_all(&buf[..n])
                .map_err(|e| format!("cannot compress the pushed tree: {e}"))?;
            if gz.get_ref().len() as u64 > self.api.max_upload {
                return Err(super::upload::too_large(self.api.max_upload)
                    .message()
                    .to_owned());
            }
        }
        let mut errors = String::new();
        let _ = stderr.read_to_string(&mut errors).await;
        let status = child
            .wait()
            .await
            .map_err(|e| format!("git archive did not finish: {e}"))?;
        if !status.success() {
            return Err(format!("git archive of {commit} failed: {}", errors.trim()));
        }
        gz.finish()
            .map_err(|e| format!("cannot compress the pushed tree: {e}"))
    }
}

/// Shows a release's progress (NDJSON `ReleaseEvent`s) line by line; true when it serves.
async fn follow(body: Body, app: &str, line: &impl Fn(String)) -> bool {
    let mut pending = Vec::new();
    let mut served = false;
    let mut streamed = false;
    use futures_util::StreamExt as _;
    let mut stream = body.into_data_stream();
    while let Some(data) = stream.next().await {
        let Ok(data) = data else { break };
        pending.extend_from_slice(&data);
        while let Some(i) = pending.iter().position(|&b| b == b'\n') {
            let raw: Vec<u8> = pending.drain(..=i).collect();
            let Ok(event) = serde_json::from_slice::<ReleaseEvent>(&raw) else {
                continue;
            };
            match event {
                ReleaseEvent::Log { log } => {
                    streamed = true;
                    line(log);
                }
                ReleaseEvent::Done { done, .. } => {
                    line(format!("warden: release {} of {app} serves", done.number));
                    served = true;
                }
                ReleaseEvent::Failed { failed } => {
                    let error = failed.error.as_deref().unwrap_or_default();
                    // The build's last lines were streamed just above: not twice.
                    let error = match error.split_once(LAST_LINES) {
                        Some((head, _)) if streamed => format!("{head} (its last lines are above)"),
                        _ => error.to_owned(),
                    };
                    for l in error.lines() {
                        line(l.to_owned());
                    }
                    line(format!(
                        "warden: release {} of {app} failed; the app keeps serving what it served before, and the branch is not moved",
                        failed.number
                    ));
                }
                ReleaseEvent::Lost { lost } => line(lost),
                ReleaseEvent::Saved { saved } => line(saved),
            }
        }
    }
    if !served {
        line(format!(
            "warden: the push of {app} was refused; `warden releases {app}` shows how it ended"
        ));
    }
    served
}

/// A line for a terminal: control characters (escape sequences a hostile dependency might
/// print) become U+FFFD, tabs stay.
fn printable(line: &str) -> String {
    line.chars()
        .map(|c| {
            if c.is_control() && c != '\t'
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
            {
                '\u{fffd}'
            } else {
                c
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_hook_git_would_skip_refuses_the_push() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("warden-hook-{}", warden_core::id::short_id()));
        std::fs::create_dir(&dir).unwrap();
        // A link to a binary that is gone (replaced by an upgrade): git would skip it.
        let gone = dir.join("gone");
        std::os::unix::fs::symlink(dir.join("no-such-binary"), &gone).unwrap();
        let e = super::runnable(&gone).unwrap_err();
        assert_eq!(e.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.message().contains("restart warden"), "{}", e.message());
        let plain = dir.join("plain");
        std::fs::write(&plain, "").unwrap();
        assert!(super::runnable(&plain).is_err());
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(super::runnable(&plain).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
