//! `warden login` and `warden logout`: an operator's session token, kept with the API's URL in
//! a file only its owner reads (`$XDG_CONFIG_HOME/warden/session.json`, else
//! `~/.config/warden/session.json`, mode 0600). Other commands present it when no --token or
//! WARDEN_TOKEN is given and the API is the one it was made for.
//!
//! Local operators log in with a password, asked without echo or read from standard input.
//! Operators from an identity provider log in with `--provider ID`: the device flow (RFC 8628)
//! run by the API, which holds the client secret; this prints the provider's page and code,
//! polls the API at the interval it says until the person has signed in there (bounded by the
//! codes' lifetime), and keeps the same [`Session`].

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use warden_api_types::{
    DeviceLogin, DevicePollAnswer, DevicePollRequest, DeviceStarted, IssuedToken, Login,
};

use crate::client::Client;
use crate::session::Session;
use crate::{ClientArgs, Endpoint};

/// `warden login`
#[derive(Debug, Clone, Args)]
pub struct LoginArgs {
    /// Operator name [default: $USER]
    #[arg(long)]
    pub name: Option<String>,
    /// Read the password from standard input (first line) instead of asking
    #[arg(long)]
    pub password_stdin: bool,
    /// Sign in through this identity provider (an `[[oidc]]` id) in a browser, with the code
    /// shown here, instead of with a password
    #[arg(long, conflicts_with_all = ["name", "password_stdin"])]
    pub provider: Option<String>,
}

/// Asks for a password on the terminal without echoing it.
fn ask_password(prompt: &str) -> anyhow::Result<String> {
    use nix::sys::termios::{tcgetattr, tcsetattr, LocalFlags, SetArg};
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .context("no terminal to ask the password on; pass it with --password-stdin")?;
    let saved = tcgetattr(&tty).context("cannot read the terminal's settings")?;
    let mut quiet = saved.clone();
    quiet.local_flags.remove(LocalFlags::ECHO);
    quiet.local_flags.insert(LocalFlags::ECHONL);
    tcsetattr(&tty, SetArg::TCSANOW, &quiet).context("cannot turn the terminal's echo off")?;
    let read = (|| {
        let mut out = &tty;
        out.write_all(prompt.as_bytes())?;
        out.flush()?;
        let mut line = String::new();
        std::io::BufReader::new(&tty).read_line(&mut line)?;
        Ok::<_, std::io::Error>(line)
    })();
    // Echo back on whatever happened.
    let _ = tcsetattr(&tty, SetArg::TCSANOW, &saved);
    let line = read.context("cannot read the password from the terminal")?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

/// `warden login`: a session token for a local operator, kept for the next commands.
pub async fn login(args: &ClientArgs, l: LoginArgs) -> anyhow::Result<()> {
    let api = crate::config::api_only(args)?;
    let client = Client::new(Endpoint {
        api: api.clone(),
        token: String::new(),
    });
    let issued = match &l.provider {
        Some(p) => device(&client, p).await?,
        None => password(&client, &api, l).await?,
    };
    keep(args, api, issued)
}

/// The session token of a local operator, by name and password.
async fn password(client: &Client, api: &str, l: LoginArgs) -> anyhow::Result<IssuedToken> {
    let name = match l.name {
        Some(n) => n,
        None => std::env::var("USER").context("say who logs in with --name")?,
    };
    let password = if l.password_stdin {
        crate::password_from_stdin()?
    } else {
        ask_password(&format!("password of operator {name} at {api}: "))?
    };
    client
        .call_with("POST", "/v1/login", &Login { name, password })
        .await
}

/// Transient poll failures in a row (no answer, 502-504) the device login rides out.
const MAX_POLL_FAILURES: u32 = 5;

/// The session token of an operator from identity provider `provider`, by its device flow:
/// the page and code printed (on standard error, so that `--json` output stays JSON), then
/// polls at the interval the API says, for no longer than the codes last; a few transient
/// failures in a row are polled through, a refusal ends it at once.
async fn device(client: &Client, provider: &str) -> anyhow::Result<IssuedToken> {
    let started: DeviceStarted = client
        .call_with(
            "POST",
            "/v1/login/device",
            &DeviceLogin {
                provider: provider.to_owned(),
            },
        )
        .await?;
    eprintln!(
        "To log in, open {} in a browser and enter the code {}",
        started.verification_uri, started.user_code
    );
    if let Some(u) = &started.verification_uri_complete {
        eprintln!("(or open {u}, which holds the code)");
    }
    eprintln!(
        "waiting for the sign-in at {provider} (up to {} min)...",
        started.expires_in.div_ceil(60)
    );
    let deadline = Instant::now() + Duration::from_secs(started.expires_in);
    let body = DevicePollRequest {
        handle: started.handle,
    };
    let mut interval = started.interval.max(1);
    // Transient failures in a row so far: a few are ridden out (a proxy restarting, the
    // provider briefly down), a refusal ends the login at once.
    let mut failed = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(interval).min(left)).await;
        match client
            .attempt_with("POST", "/v1/login/device/poll", &body)
            .await
        {
            Ok(DevicePollAnswer::Done { token }) => return Ok(token),
            Ok(
                DevicePollAnswer::Pending { interval: i }
                | DevicePollAnswer::SlowDown { interval: i },
            ) => {
                interval = i.max(1);
                failed = 0;
            }
            Err((true, e)) if failed < MAX_POLL_FAILURES => {
                failed += 1;
                eprintln!("the poll failed ({e:#}); trying again");
            }
            Err((true, e)) => {
                return Err(e.context(format!(
                    "{MAX_POLL_FAILURES} polls in a row failed; run `warden login --provider {provider}` again once the API answers"
                )))
            }
            Err((false, e)) => return Err(e),
        }
    }
    anyhow::bail!(
        "the sign-in at {provider} was not finished in time; run `warden login --provider {provider}` again"
    )
}

/// Keeps `issued` as the session for the next commands and says so.
fn keep(args: &ClientArgs, api: String, issued: IssuedToken) -> anyhow::Result<()> {
    let session = Session {
        api,
        operator: issued.operator,
        token: issued.token,
        expires_ms: issued.expires_ms,
    };
    let path = session.save()?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({"operator": session.operator, "api": session.api, "expires_ms": session.expires_ms})
        );
    } else {
        println!(
            "logged in as operator {} at {} until {} UTC (session kept in {})",
            session.operator,
            session.api,
            crate::deploy::when(session.expires_ms),
            path.display()
        );
    }
    Ok(())
}

/// `warden logout`: ends the stored session at the API and forgets it.
pub async fn logout(args: &ClientArgs) -> anyhow::Result<()> {
    let Some(session) = Session::load()? else {
        println!("not logged in");
        return Ok(());
    };
    let client = Client::new(Endpoint {
        api: session.api.clone(),
        token: session.token.clone(),
    });
    // Forgotten here whatever the API says: an expired or revoked session ends anyway.
    let ended = client.act("POST", "/v1/logout").await;
    if let Some(path) = Session::path() {
        let _ = std::fs::remove_file(path);
    }
    match ended {
        _ if args.json => println!("{}", serde_json::json!({ "ok": true })),
        Ok(()) => println!(
            "logged out of {} (operator {})",
            session.api, session.operator
        ),
        Err(e) => println!(
            "forgot the session of operator {} at {} (the API said: {e:#})",
            session.operator, session.api
        ),
    }
    Ok(())
}
