//! One-off commands (`warden run`): a command run as a fresh process of an app's current
//! release, as an instance of `label` would be (its driver, so sandboxed where the app is; its
//! slug; its config vars; for a data app a socket as the label's role, never the owner's), but
//! attached to a client: stdin, stdout and stderr through the [`OneOff`] the API holds, no time
//! limit. It is a `Process` in the node's `Children`, so warden's shutdown ends it; dropping
//! the `OneOff` (the client went away) kills it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use warden_core::data::{DataPlane, DataSocket};
use warden_core::oneoff::{Exit, Input, OneOff, OneOffError, Output, RunSignal, MAX_CHUNK};
use warden_core::{AppSpec, DriverKind};
use warden_sandbox::process::Process;

use crate::drivers::attached::{Attached, AttachedStdin};
use crate::drivers::launch::Held;
use crate::drivers::{Drivers, Launch};
use crate::paths::Paths;

/// The stdin socket's name in a sandbox's data directory.
const STDIN_SOCKET: &str = ".warden-stdin";
/// How long a sandboxed process has to connect its stdin once it runs.
const STDIN_CONNECT: Duration = Duration::from_secs(60);
/// How long output is still read after the process exited (a child it left behind may hold
/// the pipes open; in a sandbox the kernel has killed it).
const DRAIN: Duration = Duration::from_secs(2);

fn node(what: &str, e: impl std::fmt::Display) -> OneOffError {
    OneOffError::Node(format!("cannot {what}: {e}"))
}

/// Starts `command` for `spec` at `label`; the process runs on a task of its own, which
/// cleans up after it.
pub(crate) async fn start(
    drivers: Arc<Drivers>,
    paths: &Paths,
    data: Option<Arc<dyn DataPlane>>,
    spec: &AppSpec,
    label: &str,
    command: &[String],
) -> Result<OneOff, OneOffError> {
    let mut run = warden_slugs::run_spec(&paths.slugs, spec)
        .map_err(|e| OneOffError::Node(e.to_string()))?
        .into_owned();
    // Through the shell, so that the command is found on the release's PATH (its slug's own
    // bin directories) as a Procfile line is; its arguments are passed as they are.
    run.command = ["/bin/sh", "-c", "exec \"$@\"", "warden-run"]
        .into_iter()
        .map(String::from)
        .chain(command.iter().cloned())
        .collect();
    let id = warden_core::id::short_id();
    let dir = paths
        .create_instance(&id)
        .map_err(|e| node("create the command's directory", e))?;
    let log = paths.logs.join(format!("run-{id}.log"));
    let started = launch(&drivers, data.as_deref(), &run, label, &id, &dir, &log).await;
    let (running, socket) = match started {
        Ok(s) => s,
        Err(e) => {
            cleanup(&dir, &log);
            return Err(e);
        }
    };
    let (input_tx, input) = mpsc::channel(16);
    let (output, output_rx) = mpsc::channel(16);
    let app = spec.name.clone();
    tokio::spawn(async move {
        let exit = running.attend(input, output.clone()).await;
        drop(socket);
        tracing::info!(app, ?exit, "one-off command ended");
        if let Some(exit) = exit {
            let _ = output.send(Output::Exited(exit)).await;
        }
        cleanup(&dir, &log);
    });
    Ok(OneOff {
        input: input_tx,
        output: output_rx,
    })
}

fn cleanup(dir: &Path, log: &Path) {
    crate::drivers::leftovers::remove_instance_dir(dir);
    let _ = std::fs::remove_file(log);
}

/// A started one-off process and the agent's ends of its stdio.
struct Running {
    child: Process,
    held: Option<Box<dyn Held>>,
    stdin: StdinEnd,
    stdout: tokio::net::unix::pipe::Receiver,
    stderr: tokio::net::unix::pipe::Receiver,
}

/// The agent's end of the process's stdin.
enum StdinEnd {
    Pipe(tokio::net::unix::pipe::Sender),
    /// A sandbox's: accepted once the app connects.
    Listener(tokio::net::UnixListener),
}

async fn launch(
    drivers: &Drivers,
    data: Option<&dyn DataPlane>,
    spec: &AppSpec,
    label: &str,
    id: &str,
    dir: &Path,
    log: &Path,
) -> Result<(Running, Option<DataSocket>), OneOffError> {
    let driver = spec.driver_on(drivers.default().0);
    let sandboxed = driver == DriverKind::Sandbox;
    let mut env = drivers
        .base_env(spec, id)
        .map_err(|e| node("start the command", e))?;
    env.insert("WARDEN_LABEL".into(), label.to_owned());
    let socket = data_socket(data, spec, label, dir, sandboxed, &mut env).await?;
    // (read end, write end), each close-on-exec until the driver hands one to the process.
    let pipe = || {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| node("make the command's pipes", e))
    };
    let (stdout_r, stdout_w) = pipe()?;
    let (stderr_r, stderr_w) = pipe()?;
    let (stdin, ours) = match sandboxed {
        true => {
            let (inside, listener) = stdin_socket(dir)?;
            (AttachedStdin::Socket(inside), StdinEnd::Listener(listener))
        }
        false => {
            let (r, w) = pipe()?;
            let w = tokio::net::unix::pipe::Sender::from_owned_fd(w)
                .map_err(|e| node("make the command's pipes", e))?;
            (AttachedStdin::Pipe(r), StdinEnd::Pipe(w))
        }
    };
    let launch = Launch {
        spec,
        env,
        log,
        dir,
        build: false,
    };
    let stdio = Attached {
        stdin,
        stdout: stdout_w,
        stderr: stderr_w,
    };
    // The driver's command holds the process's ends and drops them once it is spawned: the
    // process's exit is then the pipes' end.
    let started = drivers
        .get(driver)
        .start_attached(&launch, stdio)
        .map_err(|e| node("start the command", e))?;
    let receiver = |r: std::os::fd::OwnedFd| {
        tokio::net::unix::pipe::Receiver::from_owned_fd(r)
            .map_err(|e| node("read the command's output", e))
    };
    let running = Running {
        child: started.child,
        held: started.held,
        stdin: ours,
        stdout: receiver(stdout_r)?,
        stderr: receiver(stderr_r)?,
    };
    Ok((running, socket))
}

/// A socket in the sandbox's data directory for the app's stdin, readable by the sandbox's
/// uid: its path inside the sandbox and the agent's listener.
fn stdin_socket(dir: &Path) -> Result<(String, tokio::net::UnixListener), OneOffError> {
    use std::os::unix::fs::PermissionsExt;
    let data = std::path::absolute(dir)
        .unwrap_or_else(|_| dir.to_owned())
        .join(warden_sandbox::DATA_DIR);
    std::fs::create_dir_all(&data).map_err(|e| node("make the command's directory", e))?;
    let path: PathBuf = data.join(STDIN_SOCKET);
    let listener =
        tokio::net::UnixListener::bind(&path).map_err(|e| node("make the stdin socket", e))?;
    // Only the sandbox sees this directory; its uid is not warden's.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| node("make the stdin socket", e))?;
    let inside = format!("{}/{STDIN_SOCKET}", warden_sandbox::DATA_MOUNT);
    Ok((inside, listener))
}

/// For an app with data: a socket in `dir` logged in as `label`'s role (never the owner's),
/// and the environment naming it added to `env`.
async fn data_socket(
    data: Option<&dyn DataPlane>,
    spec: &AppSpec,
    label: &str,
    dir: &Path,
    sandboxed: bool,
    env: &mut BTreeMap<String, String>,
) -> Result<Option<DataSocket>, OneOffError> {
    if !spec.data {
        return Ok(None);
    }
    let plane = data.ok_or_else(|| OneOffError::Node(crate::drivers::data::NO_SERVER.into()))?;
    let place = crate::drivers::data::place(dir, &spec.name, sandboxed)
        .map_err(|e| node("make the command's database socket", e))?;
    let socket = plane
        .attach(&spec.name, label, None, &place.socket)
        .await
        .map_err(|e| node("reach the app's database", e))?;
    env.extend(place.env);
    Ok(Some(socket))
}

// === impl Running ===

impl Running {
    /// Carries input in and output out until the process ends (how) or the client goes (then
    /// it is killed and `None` returned).
    async fn attend(
        self,
        mut input: mpsc::Receiver<Input>,
        output: mpsc::Sender<Output>,
    ) -> Option<Exit> {
        let Running {
            mut child,
            held,
            stdin,
            stdout,
            stderr,
        } = self;
        let mut out = tokio::spawn(pump(stdout, output.clone(), Output::Stdout));
        let mut err = tokio::spawn(pump(stderr, output.clone(), Output::Stderr));
        let pid = child.id();
        let status = tokio::select! {
            s = child.wait() => Some(s),
            () = feed(stdin, &mut input, pid) => None,
            () = output.closed() => None,
        };
        if status.is_none() {
            // The client went: the group killed and reaped before its cgroup and address are
            // given back below, so nothing of it runs in what another start may take next.
            child.signal(nix::sys::signal::Signal::SIGKILL);
            let _ = tokio::time::timeout(DRAIN, child.wait()).await;
        }
        // Still unreaped (the wait above timed out), the handle kills the process's group.
        drop(child);
        let exit = match status {
            Some(Ok(s)) => {
                use std::os::unix::process::ExitStatusExt;
                Some(match (s.code(), s.signal()) {
                    (Some(c), _) => Exit::Code(c),
                    (None, Some(sig)) => Exit::Signal(sig),
                    (None, None) => Exit::Code(-1),
                })
            }
            Some(Err(e)) => {
                let _ = output
                    .send(Output::Stderr(
                        format!("warden: cannot wait for the command: {e}\n").into_bytes(),
                    ))
                    .await;
                Some(Exit::Code(-1))
            }
            None => None,
        };
        if exit.is_some() {
            let _ = tokio::time::timeout(DRAIN, async {
                let _ = (&mut out).await;
                let _ = (&mut err).await;
            })
            .await;
        }
        // A grandchild that keeps a pipe open would keep its pump (and the pipe) for ever.
        out.abort();
        err.abort();
        if let Some(held) = held {
            held.release().await;
        }
        exit
    }
}

/// Copies what the process writes to `output`, each chunk made by `wrap`, until its end.
async fn pump(
    mut from: tokio::net::unix::pipe::Receiver,
    output: mpsc::Sender<Output>,
    wrap: fn(Vec<u8>) -> Output,
) {
    let mut buf = vec![0u8; MAX_CHUNK];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if output.send(wrap(buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Hands the client's input to the process; returns when the client is gone.
async fn feed(stdin: StdinEnd, input: &mut mpsc::Receiver<Input>, pid: Option<u32>) {
    let mut writer: Option<Box<dyn AsyncWrite + Send + Unpin>> = match stdin {
        StdinEnd::Pipe(p) => Some(Box::new(p)),
        StdinEnd::Listener(l) => {
            // Input waits in the channel until the app connected: it does so before it runs.
            match tokio::time::timeout(STDIN_CONNECT, l.accept()).await {
                Ok(Ok((conn, _))) => Some(Box::new(conn)),
                _ => None,
            }
        }
    };
    while let Some(msg) = input.recv().await {
        match msg {
            Input::Stdin(bytes) => {
                if let Some(w) = writer.as_mut() {
                    // The process closed its stdin: what it is sent is dropped, as a pipe
                    // to a closed reader would.
                    if w.write_all(&bytes).await.is_err() {
                        writer = None;
                    }
                }
            }
            Input::StdinEnd => {
                if let Some(mut w) = writer.take() {
                    let _ = w.shutdown().await;
                }
            }
            Input::Signal(s) => {
                let sig = match s {
                    RunSignal::Interrupt => nix::sys::signal::Signal::SIGINT,
                    RunSignal::Terminate => nix::sys::signal::Signal::SIGTERM,
                };
                // Its whole group: in a sandbox, the app and the processes around it.
                if let Some(pid) = pid {
                    warden_sandbox::process::signal_group(pid, sig);
                }
            }
        }
    }
}
