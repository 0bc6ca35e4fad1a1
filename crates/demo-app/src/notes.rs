//! The demo's notes: when warden gave the instance a database (`PGHOST`, `PGDATABASE`), every
//! answer lists the notes its label may read, and `?note=TEXT` adds one at its label.
//!
//! It speaks just enough of PostgreSQL's protocol (version 3: startup, then the extended query
//! protocol with bound parameters) over the Unix socket warden serves in the instance, so the
//! instance image gains no client library. No password is sent or known: the socket is the
//! credential, and warden logs in on the instance's behalf. Every exchange is bounded in time
//! and every message the server sends in size.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// How long one request's exchange with the database may take.
const TIMEOUT: Duration = Duration::from_secs(5);
/// The largest message accepted from the server.
const MAX_MESSAGE: usize = 1 << 20;
/// The longest note kept, in characters.
pub const MAX_NOTE: usize = 500;
/// How many notes an answer lists (the newest).
const SHOWN: usize = 20;

/// The instance's database, as warden names it in the environment.
#[derive(Debug, Clone)]
pub struct Database {
    /// The socket directory (`PGHOST`).
    pub dir: PathBuf,
    /// The database (`PGDATABASE`).
    pub name: String,
}

impl Database {
    /// The database warden gave this instance, if any.
    pub fn from_env() -> Option<Self> {
        std::env::var_os("DATABASE_URL")?;
        Some(Self {
            dir: std::env::var_os("PGHOST")?.into(),
            name: std::env::var("PGDATABASE").ok()?,
        })
    }

    /// Adds `add` (cut to [`MAX_NOTE`] characters) if given, then lists the newest notes this
    /// instance may read, newest first.
    pub async fn notes(&self, add: Option<&str>) -> Result<Vec<String>, String> {
        tokio::time::timeout(TIMEOUT, self.exchange(add))
            .await
            .map_err(|_| format!("the database did not answer within {TIMEOUT:?}"))?
    }

    async fn exchange(&self, add: Option<&str>) -> Result<Vec<String>, String> {
        let socket = self.dir.join(".s.PGSQL.5432");
        let stream = UnixStream::connect(&socket)
            .await
            .map_err(|e| format!("cannot reach {}: {e}", socket.display()))?;
        let mut conn = Conn { stream };
        conn.startup(&self.name).await?;
        if let Some(text) = add {
            let text: String = text.chars().take(MAX_NOTE).collect();
            conn.query("INSERT INTO notes (body) VALUES ($1)", &[&text])
                .await?;
        }
        let limit = SHOWN.to_string();
        let rows = conn
            .query(
                "SELECT body FROM notes ORDER BY id DESC LIMIT $1::int",
                &[&limit],
            )
            .await?;
        let _ = conn.send(b'X', &[]).await;
        Ok(rows)
    }
}

/// One connection to the socket.
struct Conn {
    stream: UnixStream,
}

impl Conn {
    async fn send(&mut self, kind: u8, body: &[u8]) -> Result<(), String> {
        let mut msg = Vec::with_capacity(body.len() + 5);
        msg.push(kind);
        msg.extend_from_slice(&len32(body.len() + 4)?);
        msg.extend_from_slice(body);
        self.stream.write_all(&msg).await.map_err(io)
    }

    /// The next message: its type and body.
    async fn recv(&mut self) -> Result<(u8, Vec<u8>), String> {
        let mut head = [0u8; 5];
        self.stream.read_exact(&mut head).await.map_err(io)?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if !(4..=MAX_MESSAGE).contains(&len) {
            return Err(format!("the database sent a message of {len} bytes"));
        }
        let mut body = vec![0u8; len - 4];
        self.stream.read_exact(&mut body).await.map_err(io)?;
        Ok((head[0], body))
    }

    async fn startup(&mut self, db: &str) -> Result<(), String> {
        let mut body = 196_608u32.to_be_bytes().to_vec(); // protocol 3.0
                                                          // The user is ignored by warden's socket; libpq would send one too.
        for s in ["user", "warden", "database", db, "application_name", "demo"] {
            body.extend_from_slice(s.as_bytes());
            body.push(0);
        }
        body.push(0);
        let mut msg = len32(body.len() + 4)?.to_vec();
        msg.extend_from_slice(&body);
        self.stream.write_all(&msg).await.map_err(io)?;
        loop {
            match self.recv().await? {
                (b'R', b) if b.get(..4) == Some(&[0, 0, 0, 0][..]) => {}
                (b'R', _) => return Err("the database asked for a password".into()),
                (b'E', b) => return Err(error_text(&b)),
                (b'Z', _) => return Ok(()),
                _ => {} // parameters, the cancel key, notices
            }
        }
    }

    /// Runs `sql` with text parameters; the first column of every row.
    async fn query(&mut self, sql: &str, params: &[&str]) -> Result<Vec<String>, String> {
        let mut parse = vec![0u8]; // the unnamed statement
        parse.extend_from_slice(sql.as_bytes());
        parse.extend_from_slice(&[0, 0, 0]); // end of text, no parameter types
        let mut bind = vec![0u8, 0, 0, 0]; // unnamed portal and statement, text parameters
        bind.extend_from_slice(&len16(params.len())?);
        for p in params {
            bind.extend_from_slice(&len32(p.len())?);
            bind.extend_from_slice(p.as_bytes());
        }
        bind.extend_from_slice(&[0, 0]); // text results
        self.send(b'P', &parse).await?;
        self.send(b'B', &bind).await?;
        self.send(b'E', &[0, 0, 0, 0, 0]).await?; // unnamed portal, every row
        self.send(b'S', &[]).await?;
        let (mut rows, mut failed) = (Vec::new(), None);
        loop {
            match self.recv().await? {
                (b'D', b) => rows.push(first_column(&b)?),
                (b'E', b) => failed = Some(error_text(&b)),
                (b'Z', _) => break,
                _ => {}
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(rows),
        }
    }
}

fn io(e: std::io::Error) -> String {
    format!("the database connection failed: {e}")
}

fn len32(n: usize) -> Result<[u8; 4], String> {
    u32::try_from(n)
        .map(u32::to_be_bytes)
        .map_err(|_| "a message too long to send".to_owned())
}

fn len16(n: usize) -> Result<[u8; 2], String> {
    u16::try_from(n)
        .map(u16::to_be_bytes)
        .map_err(|_| "too many parameters".to_owned())
}

/// The first column of a DataRow, as text (NULL reads as empty).
fn first_column(b: &[u8]) -> Result<String, String> {
    let bad = || "the database sent a malformed row".to_owned();
    let len = b.get(2..6).ok_or_else(bad)?;
    let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
    let Ok(len) = usize::try_from(len) else {
        return Ok(String::new());
    };
    let value = b.get(6..6 + len).ok_or_else(bad)?;
    Ok(String::from_utf8_lossy(value).into_owned())
}

/// An ErrorResponse's message field (`M`), with its SQLSTATE (`C`).
fn error_text(b: &[u8]) -> String {
    let (mut message, mut code) = (String::new(), String::new());
    for field in b.split(|c| *c == 0) {
        match field.split_first() {
            Some((b'M', m)) => message = String::from_utf8_lossy(m).into_owned(),
            Some((b'C', c)) => code = String::from_utf8_lossy(c).into_owned(),
            _ => {}
        }
    }
    format!("{message} (SQLSTATE {code})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_errors_read_from_their_messages() {
        let mut row = vec![0, 1, 0, 0, 0, 5];
        row.extend_from_slice(b"hello");
        assert_eq!(first_column(&row).unwrap(), "hello");
        assert_eq!(first_column(&[0, 1, 255, 255, 255, 255]).unwrap(), "");
        assert!(first_column(&[0, 1, 0, 0, 0, 9, b'x']).is_err());
        let err = b"SERROR\0C42P01\0Mrelation \"notes\" does not exist\0\0";
        assert_eq!(
            error_text(err),
            "relation \"notes\" does not exist (SQLSTATE 42P01)"
        );
    }
}
