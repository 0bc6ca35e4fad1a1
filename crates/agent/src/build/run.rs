//! Running a build script in the tree it builds: through the node's driver (a sandbox that may
//! write only the tree and its own private directory, sharing the host's network so package
//! managers reach their registries), with a time limit, its output streamed line by line.

use std::io::{Read, Seek};
use std::path::Path;
use std::time::Duration;

use warden_core::builds::{BuildError, Output};
use warden_core::{AppSpec, Limits};

use crate::drivers::{Drivers, Launch, LaunchError};
use crate::paths::Paths;

/// Limits of a build: package installs need more than an instance's defaults.
const BUILD_LIMITS: Limits = Limits {
    memory_mb: 4096,
    processes: 1024,
    cpu_seconds: 0,
    millicpus: 0,
};

/// Most bytes of build output read at once.
const READ_AT_ONCE: u64 = 1 << 20;
/// Longest line handed on whole; longer ones come in pieces.
const LONGEST_LINE: usize = 4096;

/// Lines of output a failed build's error carries.
pub(crate) const TAIL_LINES: usize = 20;

/// Runs `script` with `/bin/sh` in `tree` for `app`, at most `limit`; every line it prints goes
/// to `out`.
pub(crate) async fn run_script(
    drivers: &Drivers,
    paths: &Paths,
    app: &str,
    tree: &Path,
    script: &str,
    limit: Duration,
    out: &Output,
) -> Result<(), BuildError> {
    let id = warden_core::id::short_id();
    let dir = paths
        .create_instance(&id)
        .map_err(|e| BuildError::Node(format!("cannot create the build's directory: {e}")))?;
    let log = paths.logs.join(format!("build-{id}.log"));
    let result = run_in(drivers, app, tree, script, limit, out, &dir, &log).await;
    crate::drivers::leftovers::remove_instance_dir(&dir);
    let _ = std::fs::remove_file(&log);
    if result.is_err() && drivers.children().ending() {
        stopped_by_shutdown().await;
    }
    result
}

/// What a build or trial that warden's shutdown ended waits for: nothing, ever. The end was
/// warden's, not the release's, so no failure is reported and the release stays in its phase,
/// resumed at the next start as after a crash.
pub(crate) async fn stopped_by_shutdown() {
    tracing::info!("warden is stopping: the release resumes when it starts again");
    std::future::pending::<()>().await;
}

#[allow(clippy::too_many_arguments)]
async fn run_in(
    drivers: &Drivers,
    app: &str,
    tree: &Path,
    script: &str,
    limit: Duration,
    out: &Output,
    dir: &Path,
    log: &Path,
) -> Result<(), BuildError> {
    let mut spec = AppSpec::new(app, vec!["/bin/sh".into(), "-c".into(), script.into()]);
    spec.workdir = Some(tree.display().to_string());
    spec.limits = BUILD_LIMITS;
    let mut env = std::collections::BTreeMap::new();
    for (k, v) in [
        ("CI", "true"),
        ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
        ("npm_config_update_notifier", "false"),
    ] {
        env.insert(k.to_owned(), v.to_owned());
    }
    let (kind, why) = drivers.default();
    if kind == warden_core::DriverKind::Process {
        // A build runs the app's dependencies' own install scripts: hostile code, which a
        // plain process would run with the node's file system view and whose leftovers would
        // outlive it.
        return Err(BuildError::Node(format!(
            "this node builds nothing: builds run in a sandbox and this node cannot make one ({why}); push through an API node whose agent can (user namespaces allowed, or warden run as root)"
        )));
    }
    let launch = Launch {
        spec: &spec,
        env,
        log,
        dir,
        build: true,
    };
    let ended = run_to_end(drivers, kind, &launch, limit, out)
        .await
        .map_err(|e| BuildError::Node(format!("cannot start the build: {e}")))?;
    match ended {
        Ended::TimedOut => Err(BuildError::Failed(format!(
            "the build ran out of its {} s; last lines:\n{}",
            limit.as_secs(),
            crate::logs::tail(log, TAIL_LINES)
        ))),
        Ended::Exited(s) if s.success() => Ok(()),
        Ended::Exited(s) => Err(BuildError::Failed(format!(
            "the build failed ({s}); last lines:\n{}",
            crate::logs::tail(log, TAIL_LINES)
        ))),
        Ended::Lost(e) => Err(BuildError::Node(format!("cannot wait for the build: {e}"))),
    }
}

/// How a one-off process (a build script, a release command) ended.
pub(crate) enum Ended {
    /// It exited, with this status.
    Exited(std::process::ExitStatus),
    /// It ran past its time limit and was killed.
    TimedOut,
    /// Waiting for it failed.
    Lost(std::io::Error),
}

/// Starts `launch` through the driver of `kind` and waits for it to end, at most `limit`
/// (then kills it); every line it prints goes to `out` as it comes.
pub(crate) async fn run_to_end(
    drivers: &Drivers,
    kind: warden_core::DriverKind,
    launch: &Launch<'_>,
    limit: Duration,
    out: &Output,
) -> Result<Ended, LaunchError> {
    let started = drivers.get(kind).start(launch)?;
    let mut child = started.child;
    let mut reader = Tail::new(launch.log);
    let deadline = tokio::time::Instant::now() + limit;
    let status = loop {
        tokio::select! {
            status = child.wait() => break Some(status),
            () = tokio::time::sleep_until(deadline) => break None,
            () = tokio::time::sleep(Duration::from_millis(100)) => reader.emit(out),
        }
    };
    if status.is_none() {
        child.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = child.wait().await;
    }
    reader.emit(out);
    reader.finish(out);
    if let Some(held) = started.held {
        held.release().await;
    }
    Ok(match status {
        None => Ended::TimedOut,
        Some(Ok(s)) => Ended::Exited(s),
        Some(Err(e)) => Ended::Lost(e),
    })
}

/// Follows a growing log file, handing on whole lines.
struct Tail<'a> {
    path: &'a Path,
    offset: u64,
    partial: Vec<u8>,
}

impl<'a> Tail<'a> {
    fn new(path: &'a Path) -> Self {
        Self {
            path,
            offset: 0,
            partial: Vec::new(),
        }
    }

    /// Hands on the whole lines written since the last call: at most [`READ_AT_ONCE`] bytes
    /// of them (the rest comes next time), a line longer than [`LONGEST_LINE`] in pieces.
    fn emit(&mut self, out: &Output) {
        let Ok(f) = std::fs::File::open(self.path) else {
            return;
        };
        let mut f = std::io::BufReader::new(f);
        if f.seek(std::io::SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        if let Ok(n) = f.take(READ_AT_ONCE).read_to_end(&mut buf) {
            self.offset += n as u64;
            self.partial.extend_from_slice(&buf);
        }
        loop {
            let end = match self.partial.iter().position(|&b| b == b'\n') {
                Some(i) if i <= LONGEST_LINE => i,
                _ if self.partial.len() > LONGEST_LINE => LONGEST_LINE,
                _ => break,
            };
            let line: Vec<u8> = self.partial.drain(..end).collect();
            if self.partial.first() == Some(&b'\n') {
                self.partial.remove(0);
            }
            out(String::from_utf8_lossy(&line).trim_end_matches('\r'));
        }
    }

    fn finish(&mut self, out: &Output) {
        if !self.partial.is_empty() {
            out(&String::from_utf8_lossy(&std::mem::take(&mut self.partial)));
        }
    }
}
