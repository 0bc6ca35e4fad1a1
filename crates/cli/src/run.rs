//! `warden run APP [--label L] [--user U] -- CMD…`: a command run once in a fresh process of
//! the app's current release, attached to this terminal: stdin copied in (its end sent),
//! stdout and stderr out, Ctrl-C sent to the command (a second one closes the connection,
//! which kills it), and the command's exit status as this process's own (128+N for signal
//! N). No terminal is allocated: an interactive shell runs without one. Output bound for a
//! terminal has its control characters (escape sequences: the clipboard, the title, cursor
//! moves) and bidi overrides replaced, as `warden logs` does: it may hold what app users wrote.
//! Piped or redirected, it passes byte for byte (a dump, a binary).

mod term;

use std::io::Write;

use anyhow::{anyhow, bail};
use clap::Args;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use warden_api_types::run::{decode_output, encode_input, UPGRADE};
use warden_api_types::RunRequest;
use warden_core::oneoff::{Exit, Input, Output, RunSignal, MAX_CHUNK};

use crate::client::Client;

/// `warden run`
#[derive(Debug, Args)]
pub struct Run {
    /// App name
    pub app: String,
    /// Label the command runs at (a data app's database as that label's role) [default: the
    /// clearance of --user, else the lattice's lowest level]
    #[arg(long)]
    pub label: Option<String>,
    /// App user the command runs for: their clearance is its label (recorded in the audit log)
    #[arg(long)]
    pub user: Option<String>,
    /// The command and its arguments, after `--`
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Runs the command and exits with its status; returns only on an error before it ran.
pub(crate) async fn run(api: &Client, r: Run) -> anyhow::Result<()> {
    let mut query = Vec::new();
    if let Some(l) = &r.label {
        query.push(format!("label={}", encode(l)));
    }
    if let Some(u) = &r.user {
        query.push(format!("user={}", encode(u)));
    }
    let mut path = format!("/v1/apps/{}/run", encode(&r.app));
    if !query.is_empty() {
        path = format!("{path}?{}", query.join("&"));
    }
    let body = RunRequest { command: r.command };
    let upgraded = api.upgrade(&path, &body, UPGRADE).await?;
    let code = attach(TokioIo::new(upgraded)).await?;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // Not a return: the thread reading stdin may be blocked in a read, and would hold the
    // runtime's shutdown.
    std::process::exit(code)
}

/// Carries the terminal to the command and back; the command's exit status. Each direction
/// runs on its own, so a command that writes before it reads never waits on our input.
async fn attach<S>(io: S) -> anyhow::Result<i32>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let (tx, mut input) = mpsc::channel::<Input>(4);
    // A plain thread: a blocking read of stdin cannot be called off.
    std::thread::spawn(move || read_stdin(tx));
    let (signal_tx, mut signals) = mpsc::unbounded_channel::<Input>();
    let sending = async move {
        let mut stdin_open = true;
        loop {
            let frame = tokio::select! {
                biased;
                Some(s) = signals.recv() => s,
                i = input.recv(), if stdin_open => match i {
                    Some(i) => i,
                    None => {
                        stdin_open = false;
                        continue;
                    }
                },
            };
            if let Err(e) = wr.write_all(&encode_input(&frame)).await {
                return e;
            }
        }
    };
    let receiving = async move {
        use std::io::IsTerminal;
        let mut out_filter = term::Filter::new(std::io::stdout().is_terminal());
        let mut err_filter = term::Filter::new(std::io::stderr().is_terminal());
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; MAX_CHUNK];
        loop {
            let n = rd.read(&mut chunk).await.map_err(|e| {
                anyhow!("the connection to the API broke: {e}; the command was killed")
            })?;
            if n == 0 {
                bail!("the connection to the API ended before the command did; it was killed (did warden stop?)");
            }
            buf.extend_from_slice(&chunk[..n]);
            while let Some(out) = decode_output(&mut buf)? {
                match out {
                    Output::Stdout(b) => write_to(&mut std::io::stdout(), &out_filter.pass(&b)),
                    Output::Stderr(b) => write_to(&mut std::io::stderr(), &err_filter.pass(&b)),
                    Output::Exited(Exit::Code(c)) => return Ok(c),
                    Output::Exited(Exit::Signal(s)) => return Ok(s.saturating_add(128)),
                }
            }
        }
    };
    tokio::pin!(sending, receiving);
    let mut interrupts = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut caught = 0;
    loop {
        tokio::select! {
            code = &mut receiving => return code,
            e = &mut sending => {
                bail!("the connection to the API broke: {e}; the command was killed");
            }
            _ = interrupts.recv() => {
                caught += 1;
                if caught > 1 {
                    // The connection's end kills the command.
                    eprintln!("warden: interrupted again: the command is killed");
                    return Ok(130);
                }
                let _ = signal_tx.send(Input::Signal(RunSignal::Interrupt));
            }
        }
    }
}

/// Writes and flushes at once: the command's output shows as it comes. A closed stdout drops
/// the rest.
fn write_to(out: &mut dyn Write, bytes: &[u8]) {
    let _ = out.write_all(bytes).and_then(|()| out.flush());
}

/// Copies stdin to `tx` in chunks, then its end.
fn read_stdin(tx: mpsc::Sender<Input>) {
    use std::io::Read;
    let mut stdin = std::io::stdin().lock();
    let mut buf = vec![0u8; MAX_CHUNK];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx.blocking_send(Input::Stdin(buf[..n].to_vec())).is_err() {
                    return;
                }
            }
        }
    }
    let _ = tx.blocking_send(Input::StdinEnd);
}

/// `s` percent-encoded for a path segment or a query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn labels_are_encoded_for_the_query() {
        assert_eq!(super::encode("TOP SECRET"), "TOP%20SECRET");
        assert_eq!(super::encode("{A,B}"), "%7BA%2CB%7D");
        assert_eq!(super::encode("web-1"), "web-1");
    }
}
