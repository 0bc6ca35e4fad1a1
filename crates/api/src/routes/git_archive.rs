//! The tree of a pushed commit as the gzip'd tar `warden push` uploads: `git archive` read
//! from the quarantine the hook names (the pushed objects are nowhere else until the hook
//! agrees), bounded on both sides (the raw tar by what the unpacker would take, the
//! compressed one by the upload limit), and compressed on a blocking thread, not on the
//! runtime the gateway shares.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::git_base::HookAsk;
use crate::Api;

/// The unpacker takes at most this many times the upload limit (`max_unpacked` of the
/// agent's builder, set in `warden/src/up/api.rs`): a tar past it would be refused anyway,
/// and a small pack of one huge zero-filled blob listed many times makes GiBs of it.
const UNPACKED_PER_UPLOAD: u64 = 4;

/// `commit`'s tree as a gzip'd tar, or what to tell the pusher.
pub(crate) async fn archive(
    api: &Api,
    repo: &Path,
    ask: &HookAsk,
    commit: &str,
) -> Result<Vec<u8>, String> {
    let objects = objects_env(repo, ask)?;
    let (repo, commit) = (repo.to_owned(), commit.to_owned());
    let max_upload = api.max_upload;
    let max_tar = api.max_upload.saturating_mul(UNPACKED_PER_UPLOAD);
    tokio::task::spawn_blocking(move || run(&repo, &objects, &commit, max_tar, max_upload))
        .await
        .unwrap_or_else(|e| Err(format!("the archive of the pushed tree failed: {e}")))
}

/// The quarantine's environment for git, checked: each directory must be the repository's
/// own `objects` or a quarantine (`objects/*incoming-*`) in it, after `..` and links are
/// resolved, and alternates are split on `:` as git splits them.
pub(crate) fn objects_env(
    repo: &Path,
    ask: &HookAsk,
) -> Result<Vec<(&'static str, String)>, String> {
    let outside =
        |var: &str| format!("the hook named objects outside the app's repository ({var})");
    let objects = repo
        .canonicalize()
        .map_err(|e| format!("cannot find the app's repository: {e}"))?
        .join("objects");
    let allowed = |dir: &str| -> Option<PathBuf> {
        // git quotes an alternate holding `:` or `"`: none of warden's do.
        if dir.is_empty() || dir.starts_with('"') {
            return None;
        }
        // git names them relative to the repository, where it runs, or absolute.
        let real = repo.join(dir).canonicalize().ok()?;
        let quarantine = real.parent() == Some(objects.as_path())
            && real
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(is_quarantine);
        (real == objects || quarantine).then_some(real)
    };
    let mut env = Vec::new();
    if let Some(dir) = &ask.objects {
        let real = allowed(dir).ok_or_else(|| outside("GIT_OBJECT_DIRECTORY"))?;
        env.push(("GIT_OBJECT_DIRECTORY", real.display().to_string()));
    }
    if let Some(list) = &ask.alternates {
        let real: Option<Vec<String>> = list
            .split(':')
            .map(|d| allowed(d).map(|p| p.display().to_string()))
            .collect();
        let real = real.ok_or_else(|| outside("GIT_ALTERNATE_OBJECT_DIRECTORIES"))?;
        env.push(("GIT_ALTERNATE_OBJECT_DIRECTORIES", real.join(":")));
    }
    Ok(env)
}

/// Whether `name` (in `objects`) is a push's quarantine: `tmp_objdir-incoming-*` since git
/// 2.18, `incoming-*` before.
pub(crate) fn is_quarantine(name: &str) -> bool {
    name.starts_with("incoming-") || name.starts_with("tmp_objdir-incoming-")
}

/// Runs `git archive` and compresses what it writes, blocking.
fn run(
    repo: &Path,
    objects: &[(&'static str, String)],
    commit: &str,
    max_tar: u64,
    max_upload: u64,
) -> Result<Vec<u8>, String> {
    let mut cmd = Command::new("git");
    cmd.env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
        )
        .env("GIT_DIR", repo)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .envs(objects.iter().map(|(k, v)| (*k, v)));
    // The tree, not the commit: no commit id header in the tar, which the unpacker would
    // refuse.
    let mut child = cmd
        .args(["archive", "--format=tar"])
        .arg(format!("{commit}^{{tree}}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run git archive: {e}"))?;
    let (Some(tar), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err("git archive started without its pipes".into());
    };
    // Its errors read beside its output, so that neither pipe stalls git.
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.take(16 * 1024).read_to_string(&mut text);
        text
    });
    let compressed = compress(tar, max_tar, max_upload);
    if compressed.is_err() {
        let _ = child.kill();
    }
    let status = child.wait();
    let errors = errors.join().unwrap_or_default();
    let gz = compressed?;
    match status {
        Ok(s) if s.success() => Ok(gz),
        _ => {
            // The server's paths and git's words are for the node's log, not the pusher.
            tracing::warn!(commit, errors = %errors.trim(), "git archive failed");
            Err(format!(
                "warden could not read the tree of {commit} from the push; push again, and if it fails again ask the operator to look at warden's log"
            ))
        }
    }
}

/// Compresses `tar` as it comes; refuses past `max_tar` raw or `max_upload` compressed.
fn compress(mut tar: impl std::io::Read, max_tar: u64, max_upload: u64) -> Result<Vec<u8>, String> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut buf = vec![0u8; 64 * 1024];
    let mut raw = 0u64;
    loop {
        let n = match tar.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("cannot read git archive's output: {e}")),
        };
        raw += n as u64;
        if raw > max_tar {
            return Err(format!(
                "the pushed tree unpacks to more than {} MiB, more than warden unpacks for one release (4 times --max-upload-mb); leave large files out of the repository",
                max_tar >> 20
            ));
        }
        gz.write_all(&buf[..n])
            .map_err(|e| format!("cannot compress the pushed tree: {e}"))?;
        if gz.get_ref().len() as u64 > max_upload {
            return Err(super::upload::too_large(max_upload).message().to_owned());
        }
    }
    gz.finish()
        .map_err(|e| format!("cannot compress the pushed tree: {e}"))
}

#[cfg(test)]
mod tests {
    use super::{objects_env, HookAsk};

    fn ask(objects: &str, alternates: &str) -> HookAsk {
        HookAsk {
            key: String::new(),
            updates: vec![],
            objects: Some(objects.to_owned()),
            alternates: Some(alternates.to_owned()),
        }
    }

    #[test]
    fn objects_outside_the_repository_are_refused_however_they_are_spelled() {
        let dir = std::env::temp_dir().join(format!("warden-objs-{}", warden_core::id::short_id()));
        let repo = dir.join("app.git");
        let quarantine = repo.join("objects/tmp_objdir-incoming-x");
        std::fs::create_dir_all(&quarantine).unwrap();
        std::fs::create_dir_all(dir.join("other.git/objects")).unwrap();
        std::fs::create_dir_all(repo.join("objects/pack")).unwrap();
        let q = quarantine.display().to_string();
        let objects = repo.join("objects").display().to_string();

        // What git gives: the quarantine, the repository's objects (relative or not).
        let env = objects_env(&repo, &ask("./objects/tmp_objdir-incoming-x", "./objects"));
        assert_eq!(env.unwrap().len(), 2);
        assert!(objects_env(&repo, &ask(&q, &objects)).is_ok());
        // `..` out of the repository, a `:`-joined alternate elsewhere, a directory of the
        // repository that is no quarantine, a quoted alternate.
        let up = format!("{objects}/../../other.git/objects");
        let other = dir.join("other.git/objects").display().to_string();
        for (o, a) in [
            (up.as_str(), objects.as_str()),
            (q.as_str(), &format!("{objects}:{other}")),
            (&format!("{objects}/pack"), objects.as_str()),
            (q.as_str(), &format!("\"{objects}\"")),
        ] {
            assert!(objects_env(&repo, &ask(o, a)).is_err(), "{o} {a}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
