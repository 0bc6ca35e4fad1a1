//! warden as git's pre-receive hook: `DATA_DIR/git/hooks/pre-receive` links to this binary,
//! which knows itself by that name (`main.rs`). git runs it inside the API's
//! `git receive-pack` with the pushed refs on standard input; it hands them to the API over
//! the push's socket (named, with its key, in the environment the API gave git) and prints
//! what comes back, which git shows the pusher as `remote:` lines. Its exit status is the
//! API's verdict: non-zero, and git moves no ref.
//!
//! Blocking, with no runtime: it runs once per push and waits on one socket.

use std::io::{BufRead, BufReader, Read, Write};

use warden_api::routes::git_hook::{HookAsk, HookSay, KEY_ENV, SOCKET_ENV};

/// Whether this process was started as the hook: its name, as git runs it.
pub(crate) fn is_hook(arg0: &std::ffi::OsStr) -> bool {
    std::path::Path::new(arg0)
        .file_name()
        .is_some_and(|n| n == "pre-receive")
}

/// Runs the hook; the exit code git goes by.
pub(crate) fn main() -> u8 {
    match run() {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            println!("warden: {e}");
            1
        }
    }
}

fn run() -> Result<bool, String> {
    let socket = std::env::var(SOCKET_ENV).map_err(|_| {
        "this hook runs only inside warden's own `git receive-pack` (no push socket given)"
            .to_owned()
    })?;
    let key = std::env::var(KEY_ENV).map_err(|_| "no push key given".to_owned())?;
    let mut input = String::new();
    std::io::stdin()
        .take(64 * 1024)
        .read_to_string(&mut input)
        .map_err(|e| format!("cannot read the pushed refs: {e}"))?;
    let ask = HookAsk {
        key,
        updates: input.lines().map(str::to_owned).collect(),
        objects: std::env::var("GIT_OBJECT_DIRECTORY").ok(),
        alternates: std::env::var("GIT_ALTERNATE_OBJECT_DIRECTORIES").ok(),
    };
    let mut stream = std::os::unix::net::UnixStream::connect(&socket)
        .map_err(|e| format!("cannot reach the API that took this push: {e}"))?;
    let mut line = serde_json::to_vec(&ask).map_err(|e| e.to_string())?;
    line.push(b'\n');
    stream
        .write_all(&line)
        .map_err(|e| format!("cannot reach the API that took this push: {e}"))?;
    let mut out = std::io::stdout();
    for l in BufReader::new(stream).lines() {
        let l = l.map_err(|e| format!("the API stopped answering: {e}"))?;
        match serde_json::from_str::<HookSay>(&l) {
            Ok(HookSay::Line(text)) => {
                // git relays each line as it comes; a broken pipe means the pusher went away.
                let _ = writeln!(out, "{text}");
                let _ = out.flush();
            }
            Ok(HookSay::Accept(ok)) => return Ok(ok),
            Err(_) => continue,
        }
    }
    Err("the API stopped answering before the release ended; `warden releases APP` shows how it ended".into())
}
