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
use subtle::ConstantTimeEq;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use warden_api_types::{PushQuery, ReleaseEvent};

use super::git_base::{base_dir, hooks_dir, on_node, private_dir};
pub use super::git_base::{HookAsk, HookSay, KEY_ENV, SOCKET_ENV};
use super::git_lock::{Lock, Slot, Taken};
use super::git_repo;
use crate::error::ApiError;
use crate::Api;

/// The branches a push may build; others are refused with a message.
const BRANCHES: [&str; 2] = ["refs/heads/main", "refs/heads/master"];
/// How a build's error names the output it ends with (the agent's `build/`).
const LAST_LINES: &str = "; last lines:\n";
/// How long the hook's connection may take to say what was pushed.
const ASK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// Longest first line the hook may send (its refs and paths).
const MAX_ASK: usize = 64 * 1024;
/// How many lines for the hook may wait for it; past that, lines are dropped (its verdict is
/// not).
const SAY_QUEUE: usize = 1024;

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
        _ => {
            tracing::warn!(hook = %link.display(), "warden's git hook cannot run");
            Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "warden's git hook cannot run: warden's binary was replaced or removed since this node started; restart warden on this node, then push again",
            ))
        }
    }
}

/// The socket of one push, removed (and its task ended) when the push ends.
pub(crate) struct Listener {
    path: PathBuf,
    key: String,
    task: tokio::task::JoinHandle<()>,
    /// The app's push lock, once the hook took it: held until git has moved its ref (the task
    /// waiting for git drops this listener once git exits), so that two pushes never build at
    /// once and a release never serves whose ref a later push's update then lost.
    _held: Slot,
}

impl Listener {
    /// Listens for the hook of a push to `app` by `actor` into `repo`.
    pub(crate) fn bind(
        api: &Api,
        app: String,
        actor: String,
        repo: PathBuf,
    ) -> Result<Self, ApiError> {
        let base = base_dir(api)?.join("run");
        private_dir(&base)?;
        let path = base.join(format!("{}.sock", warden_core::id::short_id()));
        let listener = tokio::net::UnixListener::bind(&path)
            .map_err(|e| {
                on_node(format!(
                    "cannot listen at {}: {e} (a Unix socket's path is at most 107 bytes: give warden a shorter --data-dir)",
                    path.display()
                ))
            })?;
        let key = warden_core::id::secret_token();
        let held = Slot::default();
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
    held: Slot,
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
            // Bounded: a hook (a client) that stops reading loses lines, never holds memory.
            let (tx, mut rx) = tokio::sync::mpsc::channel::<HookSay>(SAY_QUEUE);
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
    async fn answer(&self, ask: HookAsk, tx: tokio::sync::mpsc::Sender<HookSay>) {
        let accepted = match self.admit(&ask).await {
            Err(why) => {
                let _ = tx.try_send(HookSay::Line(printable(&why)));
                false
            }
            Ok((branch, commit, lock)) => self.build(&ask, &branch, &commit, lock, &tx).await,
        };
        let _ = tx.send(HookSay::Accept(accepted)).await;
    }

    /// The branch and commit to build, with the app's push lock, or why not.
    async fn admit(&self, ask: &HookAsk) -> Result<(String, String, Lock), String> {
        let (branch, old, commit) = self.check(&ask.updates)?;
        let lock = self.lock()?;
        git_repo::remove_stale_quarantines(&self.repo, ask.objects.as_deref());
        // Under the lock, the real repository's branch (not the quarantine's view) must be
        // where the pusher saw it: git would otherwise refuse the ref update after the release
        // served, and what serves would be on no branch.
        let now = git_repo::rev_parse(&self.repo, &format!("refs/heads/{branch}"))
            .await?
            .unwrap_or_else(|| "0".repeat(old.len()));
        if now != old {
            return Err(format!(
                "another push moved {branch} of {} since this push began; push again (after `git pull` if the branch is not yours alone)",
                self.app
            ));
        }
        // A tree or a tag is no commit to build from.
        let kind = git_repo::object_type(&self.repo, ask, &commit).await?;
        if kind != "commit" {
            return Err(format!(
                "{branch} must name a commit, and this push sets it to a {kind}; push a branch of commits"
            ));
        }
        Ok((branch, commit, lock))
    }

    /// Takes the app's push lock, or says why not. In this process: one API process owns a
    /// data directory, and so the repositories in it.
    fn lock(&self) -> Result<Lock, String> {
        let Some(taken) = Taken::take(&self.repo) else {
            return Err(format!(
                "another push of {} is being built here; push again once it has ended",
                self.app
            ));
        };
        if let Ok(mut held) = self.held.lock() {
            *held = Some(taken.clone());
        }
        Ok(taken)
    }

    /// The one branch update a push may make, or why not.
    fn check(&self, updates: &[String]) -> Result<(String, String, String), String> {
        let [update] = updates else {
            return Err(format!(
                "push one branch at a time: main (or master) is what warden builds; this push updates {} refs",
                updates.len()
            ));
        };
        let mut parts = update.split_whitespace();
        let (Some(old), Some(new), Some(name), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("git gave the hook an update it cannot read".into());
        };
        if !BRANCHES.contains(&name) {
            return Err(format!(
                "warden builds pushes to main or master, not {name}; push your branch as main: `git push warden HEAD:main`"
            ));
        }
        let is_hex = |id: &str| id.len() >= 40 && id.bytes().all(|b| b.is_ascii_hexdigit());
        if !is_hex(new) || !is_hex(old) {
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
            old.to_owned(),
            new.to_owned(),
        ))
    }

    /// Builds `commit` through the push route; true when its release serves. The release
    /// and the reading of its events run in a task of their own that holds `lock` to the
    /// release's last event: a push cut off mid-build (the client gone, the hook killed) does
    /// not stop the release, so neither may it let another push build beside it.
    async fn build(
        &self,
        ask: &HookAsk,
        branch: &str,
        commit: &str,
        lock: Lock,
        tx: &tokio::sync::mpsc::Sender<HookSay>,
    ) -> bool {
        let say = |tx: &tokio::sync::mpsc::Sender<HookSay>, s: String| {
            let _ = tx.try_send(HookSay::Line(printable(&s)));
        };
        let short = commit.get(..12).unwrap_or(commit);
        say(
            tx,
            format!("warden: building {short} of {branch} for {}", self.app),
        );
        let archive = match super::git_archive::archive(&self.api, &self.repo, ask, commit).await {
            Ok(a) => a,
            Err(e) => {
                say(tx, e);
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
        let (api, app, tx) = (self.api.clone(), self.app.clone(), tx.clone());
        let release = tokio::spawn(async move {
            let _lock = lock;
            let line = |s: String| say(&tx, s);
            let pushed = super::releases::push(
                State(api),
                UrlPath(app.clone()),
                Query(query),
                headers,
                Body::from(archive),
            )
            .await;
            match pushed {
                Ok(r) => follow(r.into_body(), &app, &line).await,
                Err(e) => {
                    line(e.message().to_owned());
                    false
                }
            }
        });
        release.await.unwrap_or(false)
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
