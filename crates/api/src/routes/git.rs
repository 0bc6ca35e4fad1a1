//! `git push` to warden: git's smart HTTP protocol, receive side only, at
//! `/v1/apps/{name}/git` (under the app's path, so the one authorize path finds the app and the
//! push row of the table guards it). Each request runs `git receive-pack --stateless-rpc` (no
//! shell, a cleared environment, settings pinned on its command line) against one bare
//! repository per app under the data directory. Warden's own pre-receive hook (`git_hook`)
//! builds the pushed commit through the push route before git moves the branch: a failed build
//! leaves the branch, and what serves, as they were.
//!
//! Git authenticates with HTTP Basic: the password is an operator's token (or the break-glass
//! admin token), the user name is ignored. Refusals are plain text, which git shows as
//! `remote:` lines; a 401 carries the Basic challenge so that git asks for credentials.

use std::path::{Path as FsPath, PathBuf};
use std::process::Stdio;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::git_base::{base_dir, on_node, repository_path};
use super::git_hook;
use crate::authz::git::text;
pub(crate) use crate::authz::git::{RECEIVE, REFS};
use crate::authz::Principal;
use crate::error::ApiError;
use crate::Api;

/// The only service this remote serves: it receives, it never gives code out.
const SERVICE: &str = "git-receive-pack";

/// How much of the decoded body goes into the decoder at once: deflate expands at most about
/// a thousand times, so each step holds a few MiB at most.
const INFLATE_STEP: usize = 4096;
/// How many chunks of git's answer may wait for the client.
const OUT_QUEUE: usize = 16;
/// How long a client may leave git's answer unread before the push is ended.
const STALL: std::time::Duration = std::time::Duration::from_secs(60);

fn refused(e: ApiError) -> Response {
    text(e.status(), e.message())
}

/// The query of `GET …/info/refs`.
#[derive(Debug, serde::Deserialize)]
pub struct Service {
    /// The service git asks for.
    pub service: Option<String>,
}

/// `GET /v1/apps/{name}/git/info/refs?service=git-receive-pack`: the refs a push may update.
/// Fetching and cloning are refused: this remote only receives.
pub async fn refs(
    State(api): State<Api>,
    Path(name): Path<String>,
    Query(q): Query<Service>,
) -> Response {
    if q.service.as_deref() != Some(SERVICE) {
        return text(
            StatusCode::NOT_FOUND,
            format!(
                "this remote only receives pushes (`git push`); it gives no code out, so it cannot be cloned or fetched from. Keep the app's repository where you work, and `warden releases {name}` lists the commits pushed"
            ),
        );
    }
    let advertised = async {
        warden_core::validate_name("app", &name)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let repo = repository(&api, &name).await?;
        let out = git(&api, &repo)?
            .args(["--advertise-refs", &repo.display().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .await
            .map_err(not_installed)?;
        if !out.status.success() {
            return Err(on_node(format!(
                "git receive-pack could not list the refs of {}: {}",
                repo.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(out.stdout)
    }
    .await;
    let refs = match advertised {
        Ok(r) => r,
        Err(e) => return refused(e),
    };
    // Smart HTTP: the service announced in one pkt-line, a flush, then git's advertisement.
    let head = format!("# service={SERVICE}\n");
    let mut body = format!("{:04x}{head}0000", head.len() + 4).into_bytes();
    body.extend_from_slice(&refs);
    (
        [
            (
                header::CONTENT_TYPE,
                "application/x-git-receive-pack-advertisement",
            ),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `POST /v1/apps/{name}/git/git-receive-pack`: a push. The body (gzip'd when git says so,
/// bounded by the upload limit after decoding) goes to `git receive-pack`, whose answer, with
/// the hook's build output in it, streams back to git as it comes.
pub(crate) async fn receive(
    State(api): State<Api>,
    Path(name): Path<String>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match start(api, name, principal, headers, body).await {
        Ok(r) => r,
        Err(e) => refused(e),
    }
}

async fn start(
    api: Api,
    name: String,
    principal: Principal,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    warden_core::validate_name("app", &name).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    if content_type != Some("application/x-git-receive-pack-request") {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "this route takes git's push requests; use `git push` with the URL `warden git-remote APP` prints",
        ));
    }
    let gzip = match headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
    {
        None | Some("identity") => false,
        Some("gzip" | "x-gzip") => true,
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("content encoding {other:?} is not taken; git sends gzip or nothing"),
            ))
        }
    };
    let repo = repository(&api, &name).await?;
    let hook = git_hook::Listener::bind(&api, name.clone(), principal.actor(), repo.clone())?;
    let mut child = git(&api, &repo)?
        .arg(repo.display().to_string())
        .envs(hook.env())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(not_installed)?;
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(ApiError::internal(
            "git receive-pack started without its pipes",
        ));
    };
    // Read at once, while the body is still going in: git may answer (progress) before it
    // has read everything, and a full pipe would stall both.
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(OUT_QUEUE);
    tokio::spawn(read_all(stdout, tx));
    // git is waited on by a task of its own, which holds the hook (and with it the app's push
    // lock) until git exits: not by this request, which a client can drop or stop reading.
    tokio::spawn(wait(child, hook, tokio::spawn(last_words(stderr))));
    feed(&api, body, gzip, &mut stdin).await?;
    drop(stdin);
    let stream = futures_util::stream::unfold(rx, |mut rx| async {
        let chunk = rx.recv().await?;
        Some((Ok::<_, std::io::Error>(chunk), rx))
    });
    Ok((
        [
            (
                header::CONTENT_TYPE,
                "application/x-git-receive-pack-result",
            ),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Copies the request body into git's standard input, inflating it when gzip'd, and refuses
/// it once more than the upload limit has come out.
async fn feed(
    api: &Api,
    body: Body,
    gzip: bool,
    stdin: &mut tokio::process::ChildStdin,
) -> Result<(), ApiError> {
    use futures_util::StreamExt;
    use std::io::Write as _;
    let mut inflate = gzip.then(|| flate2::write::GzDecoder::new(Vec::new()));
    let mut size = 0u64;
    let mut stream = body.into_data_stream();
    let broken = |e: std::io::Error| {
        ApiError::bad_request(format!("the push's gzip'd body does not inflate: {e}"))
    };
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("the push broke off: {e}")))?;
        let pieces: Vec<Vec<u8>> = match &mut inflate {
            Some(d) => {
                let mut out = Vec::new();
                for step in chunk.chunks(INFLATE_STEP) {
                    d.write_all(step).map_err(broken)?;
                    out.push(std::mem::take(d.get_mut()));
                    size += out.last().map_or(0, |o| o.len() as u64);
                    if size > api.max_upload {
                        return Err(super::upload::too_large(api.max_upload));
                    }
                }
                out
            }
            None => {
                size += chunk.len() as u64;
                vec![chunk.to_vec()]
            }
        };
        if size > api.max_upload {
            return Err(super::upload::too_large(api.max_upload));
        }
        for p in pieces {
            write(stdin, &p).await?;
        }
    }
    if let Some(d) = inflate {
        let rest = d.finish().map_err(broken)?;
        if size + rest.len() as u64 > api.max_upload {
            return Err(super::upload::too_large(api.max_upload));
        }
        write(stdin, &rest).await?;
    }
    Ok(())
}

async fn write(stdin: &mut tokio::process::ChildStdin, bytes: &[u8]) -> Result<(), ApiError> {
    stdin.write_all(bytes).await.map_err(|e| {
        // git stops reading what it refuses (a malformed request): the client's to fix.
        ApiError::bad_request(format!(
            "git receive-pack stopped reading the push ({e}): it refused what was sent; push with git itself"
        ))
    })
}

/// Sends what git writes, chunk by chunk, until it closes its output, or until the client
/// has taken nothing for `STALL`: then git's output is closed, and git ends (which ends the
/// push and gives back its lock).
async fn read_all(mut stdout: tokio::process::ChildStdout, tx: tokio::sync::mpsc::Sender<Bytes>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stdout.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let chunk = Bytes::copy_from_slice(&buf[..n]);
                if tx.send_timeout(chunk, STALL).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The end of what git wrote to its standard error (bounded), for the node's log.
async fn last_words(mut stderr: tokio::process::ChildStderr) -> String {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        all.extend_from_slice(&buf[..n]);
        if all.len() > 16 * 1024 {
            all.drain(..all.len() - 16 * 1024);
        }
    }
    String::from_utf8_lossy(&all).into_owned()
}

/// Waits for git to exit, then gives back the push's hook (and its lock), logging why git
/// failed if it did.
async fn wait(
    mut child: tokio::process::Child,
    hook: git_hook::Listener,
    errors: tokio::task::JoinHandle<String>,
) {
    let status = child.wait().await;
    drop(hook);
    let errors = errors.await.unwrap_or_default();
    if !status.as_ref().is_ok_and(|s| s.success()) {
        warden_core::log_limited!(warn, status = ?status, errors = %errors.trim(), "git receive-pack failed");
    }
}

/// `git` with a cleared environment and settings pinned, ready for `receive-pack`'s
/// arguments: warden's hooks and none of the repository's, no deletions, every object
/// checked, at most the upload limit received.
fn git(api: &Api, repo: &FsPath) -> Result<tokio::process::Command, ApiError> {
    let base = base_dir(api)?;
    let mut cmd = tokio::process::Command::new("git");
    cmd.env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
        )
        // Nobody's config but the repository's own (which warden wrote): not the system's, not
        // a home directory's.
        .env("HOME", &base)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("LANG", "C")
        .arg("-c")
        .arg(format!(
            "core.hooksPath={}",
            super::git_base::hooks_dir(&base).display()
        ))
        .args(["-c", "receive.denyDeletes=true"])
        .args(["-c", "receive.fsckObjects=true"])
        .args(["-c", "receive.advertisePushOptions=false"])
        .arg("-c")
        .arg(format!("receive.maxInputSize={}", api.max_upload))
        .args(["receive-pack", "--stateless-rpc"])
        .current_dir(repo)
        .kill_on_drop(true);
    Ok(cmd)
}

fn not_installed(e: std::io::Error) -> ApiError {
    if e.kind() == std::io::ErrorKind::NotFound {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "git is not installed on this API node, so it cannot take `git push`; install git there (or push with `warden push APP DIR`)",
        )
    } else {
        ApiError::internal(format!("cannot run git: {e}"))
    }
}

/// The app's bare repository, made (mode 0700, with warden's hook) when first asked for.
async fn repository(api: &Api, name: &str) -> Result<PathBuf, ApiError> {
    let base = base_dir(api)?;
    let repos = base.join("repos");
    super::git_base::private_dir(&base)?;
    super::git_base::private_dir(&repos)?;
    git_hook::install(&base)?;
    let repo = repository_path(api, name)?;
    if repo.join("HEAD").exists() {
        return Ok(repo);
    }
    // Made beside it and renamed into place: two first pushes at once make one repository.
    let fresh = repos.join(format!(".{name}.{}", warden_core::id::short_id()));
    let out = tokio::process::Command::new("git")
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
        )
        .env("HOME", &base)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args(["init", "--bare", "--quiet", "--initial-branch=main"])
        .arg(&fresh)
        .output()
        .await
        .map_err(not_installed)?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&fresh);
        return Err(on_node(format!(
            "git init could not make a repository for {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    super::git_base::private(&fresh)?;
    if std::fs::rename(&fresh, &repo).is_err() {
        // Another push made it first.
        let _ = std::fs::remove_dir_all(&fresh);
    }
    Ok(repo)
}
