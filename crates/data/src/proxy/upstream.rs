//! One server connection: connect, log in with SCRAM-SHA-256 as the target's role, run the
//! proxy's own statements (the client's parameters, the reset between clients).

use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use super::wire;
use super::{ServerAddr, Target};

/// The largest message the proxy reads whole from the server itself (authentication,
/// parameters, the answers to its own statements).
const MAX_OWN: usize = 1 << 20;

/// Why a server connection could not be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    #[error("cannot reach PostgreSQL at {addr}: {source}")]
    Unreachable { addr: String, source: io::Error },
    #[error("PostgreSQL at {addr} did not answer within {secs} s")]
    Timeout { addr: String, secs: u64 },
    #[error("PostgreSQL refused the login: {message} (SQLSTATE {code})")]
    Refused { code: String, message: String },
    #[error(
        "PostgreSQL asked for authentication method {0}; the proxy logs in only with SCRAM-SHA-256"
    )]
    Method(i32),
    #[error("the SCRAM exchange with PostgreSQL failed: {0}")]
    Scram(io::Error),
}

impl UpstreamError {
    /// PostgreSQL refused the role's password (invalid_password): someone changed it.
    pub(crate) fn bad_password(&self) -> bool {
        matches!(self, UpstreamError::Refused { code, .. } if code == "28P01")
    }
}

/// The socket to the server, Unix or TCP.
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

type Halves<'a> = (
    Box<dyn AsyncRead + Unpin + Send + 'a>,
    Box<dyn AsyncWrite + Unpin + Send + 'a>,
);

impl Stream {
    async fn connect(addr: &ServerAddr) -> io::Result<Stream> {
        Ok(match addr {
            ServerAddr::Unix { dir, port } => {
                Stream::Unix(UnixStream::connect(dir.join(format!(".s.PGSQL.{port}"))).await?)
            }
            ServerAddr::Tcp(a) => {
                let s = TcpStream::connect(a.as_str()).await?;
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
        })
    }

    /// Both directions, borrowed, so the relay can read and write at once without a lock.
    pub(crate) fn split(&mut self) -> Halves<'_> {
        match self {
            Stream::Unix(s) => {
                let (r, w) = s.split();
                (Box::new(r), Box::new(w))
            }
            Stream::Tcp(s) => {
                let (r, w) = s.split();
                (Box::new(r), Box::new(w))
            }
        }
    }

    /// True if nothing is waiting to be read and the peer has not closed: an idle
    /// connection the server ended (a restart, `pg_terminate_backend`) reads its FATAL or
    /// its end here and is not handed to a client.
    fn is_quiet(&self) -> bool {
        let mut byte = [0u8; 1];
        let r = match self {
            Stream::Unix(s) => s.try_read(&mut byte),
            Stream::Tcp(s) => s.try_read(&mut byte),
        };
        matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

/// A logged-in server connection.
pub(crate) struct ServerConn {
    pub(crate) stream: Stream,
    /// Bytes read from the server not yet handled; kept across the relay and the reset.
    pub(crate) rbuf: BytesMut,
    /// The server's current ParameterStatus values, told to each new client.
    pub(crate) params: BTreeMap<String, String>,
    /// The server's BackendKeyData, for forwarding a client's cancel.
    pub(crate) key: (i32, i32),
    pub(crate) idle_since: Instant,
    /// The `SET` statements of the client parameters the session has now (after a reset
    /// too); empty for the role's defaults.
    applied: String,
    /// The connection's place in its app's bound ([`super::Pool`]): freed when it closes.
    pub(crate) slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// A statement of the proxy's own that did not end idle.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StatementError {
    /// PostgreSQL answered with an error; the connection is still usable.
    #[error("{message}")]
    Sql { code: String, message: String },
    /// The connection is broken, desynchronised, slow or not idle: close it.
    #[error("the server connection is unusable: {0}")]
    Broken(String),
}

impl ServerConn {
    /// Connects and logs in; the whole exchange within `timeout`.
    pub(crate) async fn connect(
        target: &Target,
        timeout: Duration,
    ) -> Result<ServerConn, UpstreamError> {
        let addr = target.server.to_string();
        match tokio::time::timeout(timeout, Self::login(target)).await {
            Ok(r) => r,
            Err(_) => Err(UpstreamError::Timeout {
                addr,
                secs: timeout.as_secs(),
            }),
        }
    }

    async fn login(target: &Target) -> Result<ServerConn, UpstreamError> {
        let addr = target.server.to_string();
        let unreachable = |source| UpstreamError::Unreachable {
            addr: addr.clone(),
            source,
        };
        let mut stream = Stream::connect(&target.server).await.map_err(unreachable)?;
        let mut out = BytesMut::new();
        let params = [
            ("user", target.role.as_str()),
            ("database", target.database.as_str()),
        ];
        frontend::startup_message(params, &mut out).map_err(unreachable)?;
        let (mut rbuf, mut server_params, mut key) = (BytesMut::new(), BTreeMap::new(), (0, 0));
        let mut scram = None;
        loop {
            let (mut r, mut w) = stream.split();
            if !out.is_empty() {
                w.write_all(&out).await.map_err(unreachable)?;
                out.clear();
            }
            let (tag, mut body) = wire::read_message(&mut r, &mut rbuf, MAX_OWN)
                .await
                .map_err(unreachable)?;
            match tag {
                b'R' if body.len() >= 4 => {
                    let code = body.get_i32();
                    scram = Self::authenticate(code, &body, scram, target, &mut out)?;
                }
                b'E' => {
                    let (code, message) = error_fields(&body);
                    return Err(UpstreamError::Refused { code, message });
                }
                b'S' => {
                    if let Some((k, v)) = wire::parse_parameter(&body) {
                        server_params.insert(k, v);
                    }
                }
                b'K' if body.len() == 8 => key = (body.get_i32(), body.get_i32()),
                b'Z' => break,
                // NoticeResponse and anything else before ReadyForQuery: nothing to do.
                _ => {}
            }
        }
        Ok(ServerConn {
            stream,
            rbuf,
            params: server_params,
            key,
            idle_since: Instant::now(),
            applied: String::new(),
            slot: None,
        })
    }

    /// One authentication request: SASL start, continue, final, or Ok; anything else refused
    /// (a cleartext or MD5 request would hand the password to whoever asks).
    fn authenticate(
        code: i32,
        body: &[u8],
        scram: Option<ScramSha256>,
        target: &Target,
        out: &mut BytesMut,
    ) -> Result<Option<ScramSha256>, UpstreamError> {
        match (code, scram) {
            (0, _) => Ok(None),
            (10, None) => {
                let offered = body
                    .split(|&b| b == 0)
                    .any(|m| m == SCRAM_SHA_256.as_bytes());
                if !offered {
                    return Err(UpstreamError::Method(10));
                }
                // No TLS on this path, so no channel binding to offer.
                let s = ScramSha256::new(target.password.as_bytes(), ChannelBinding::unsupported());
                frontend::sasl_initial_response(SCRAM_SHA_256, s.message(), out)
                    .map_err(UpstreamError::Scram)?;
                Ok(Some(s))
            }
            (11, Some(mut s)) => {
                s.update(body).map_err(UpstreamError::Scram)?;
                frontend::sasl_response(s.message(), out).map_err(UpstreamError::Scram)?;
                Ok(Some(s))
            }
            // The server's signature proves it knows the verifier: mutual authentication.
            (12, Some(mut s)) => s.finish(body).map(|()| None).map_err(UpstreamError::Scram),
            (code, _) => Err(UpstreamError::Method(code)),
        }
    }

    /// Resets the session for the next client; true if it answered ReadyForQuery idle.
    /// `DISCARD ALL` (which must be a statement of its own) and, pipelined in the same
    /// write, the departed client's startup parameters again: the next client of the same app
    /// most likely sends the same ones, and then needs no round trip of its own
    /// ([`ServerConn::apply`]).
    pub(crate) async fn reset(&mut self, timeout: Duration) -> bool {
        let applied = std::mem::take(&mut self.applied);
        let ok = if applied.is_empty() {
            self.statements(&["DISCARD ALL"], timeout).await.is_ok()
        } else {
            self.statements(&["DISCARD ALL", &applied], timeout)
                .await
                .is_ok()
        };
        if ok {
            self.applied = applied;
        }
        ok
    }

    /// Gives the session exactly the client's startup parameters (`sets`, the proxy's own
    /// `SET` statements): nothing to do if they are what the connection has already, else
    /// `RESET ALL` and them, in one statement.
    pub(crate) async fn apply(
        &mut self,
        sets: &str,
        timeout: Duration,
    ) -> Result<(), StatementError> {
        if self.applied == sets {
            return Ok(());
        }
        let sql = format!("RESET ALL;{sets}");
        self.applied.clear();
        self.statements(&[&sql], timeout).await?;
        self.applied = sets.to_owned();
        Ok(())
    }

    /// Reads and discards the answers to `n` sync points a departed client sent, within
    /// `timeout`; true if the last ReadyForQuery said idle.
    pub(crate) async fn drain(&mut self, n: i64, timeout: Duration) -> bool {
        let read = async {
            let (mut r, _) = self.stream.split();
            let mut left = n;
            loop {
                let (tag, body) = wire::read_message(&mut r, &mut self.rbuf, MAX_OWN).await?;
                match tag {
                    b'Z' => {
                        left -= 1;
                        if left == 0 {
                            return Ok::<bool, io::Error>(body.first() == Some(&b'I'));
                        }
                    }
                    b'S' => {
                        if let Some((k, v)) = wire::parse_parameter(&body) {
                            self.params.insert(k, v);
                        }
                    }
                    _ => {}
                }
            }
        };
        matches!(tokio::time::timeout(timeout, read).await, Ok(Ok(true)))
    }

    /// True if the connection can be handed to a client: nothing unread, not closed.
    pub(crate) fn is_quiet(&self) -> bool {
        self.rbuf.is_empty() && self.stream.is_quiet()
    }

    /// Runs simple-protocol queries of the proxy's own, pipelined in one write, and reads
    /// each answer up to its ReadyForQuery, which must say idle. Notifications are dropped;
    /// parameters tracked. The first error is returned, once every answer is read.
    async fn statements(&mut self, sqls: &[&str], timeout: Duration) -> Result<(), StatementError> {
        match tokio::time::timeout(timeout, self.statements_inner(sqls)).await {
            Ok(r) => r,
            Err(_) => Err(StatementError::Broken(format!(
                "no answer within {} s",
                timeout.as_secs()
            ))),
        }
    }

    async fn statements_inner(&mut self, sqls: &[&str]) -> Result<(), StatementError> {
        let broken = |e: io::Error| StatementError::Broken(e.to_string());
        let mut out = BytesMut::new();
        for sql in sqls {
            frontend::query(sql, &mut out).map_err(broken)?;
        }
        let (mut r, mut w) = self.stream.split();
        w.write_all(&out).await.map_err(broken)?;
        let (mut failed, mut left) = (None, sqls.len());
        loop {
            let (tag, body) = wire::read_message(&mut r, &mut self.rbuf, MAX_OWN)
                .await
                .map_err(broken)?;
            match tag {
                b'E' => failed = failed.or(Some(error_fields(&body))),
                b'S' => {
                    if let Some((k, v)) = wire::parse_parameter(&body) {
                        self.params.insert(k, v);
                    }
                }
                b'Z' if body.first() == Some(&b'I') && left > 1 => left -= 1,
                b'Z' => {
                    return match (failed, body.first()) {
                        (Some((code, message)), Some(b'I')) => {
                            Err(StatementError::Sql { code, message })
                        }
                        (None, Some(b'I')) => Ok(()),
                        _ => Err(StatementError::Broken(
                            "not idle after the statement".into(),
                        )),
                    }
                }
                // CommandComplete, NoticeResponse, NotificationResponse (dropped), rows.
                _ => {}
            }
        }
    }
}

/// SQLSTATE and message of an ErrorResponse body.
pub(crate) fn error_fields(body: &[u8]) -> (String, String) {
    let code = body
        .split(|&b| b == 0)
        .find(|f| f.first() == Some(&b'C'))
        .map(|f| String::from_utf8_lossy(&f[1..]).into_owned())
        .unwrap_or_default();
    (code, wire::error_message(body))
}

/// Sends a CancelRequest for the server key `key` on a fresh connection, as the protocol
/// wants, and waits until PostgreSQL closes that connection: only then has it signalled the
/// backend (PostgreSQL 15 signals twice, the process and its group, and a loaded machine can
/// hold the second signal back long enough to meet the backend's next client's query; issue
/// pgbouncer#717 is the same race). Errors only logged, the client is not told (nor is it by
/// PostgreSQL).
pub(crate) async fn cancel(addr: &ServerAddr, key: (i32, i32), timeout: Duration) {
    let send = async {
        let mut stream = Stream::connect(addr).await?;
        let mut out = BytesMut::new();
        frontend::cancel_request(key.0, key.1, &mut out);
        let (mut r, mut w) = stream.split();
        w.write_all(&out).await?;
        w.shutdown().await?;
        // PostgreSQL answers a cancel with nothing; a bounded read for its close.
        let mut sink = [0u8; 64];
        while r.read(&mut sink).await? > 0 {}
        Ok::<(), io::Error>(())
    };
    match tokio::time::timeout(timeout, send).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            warden_core::log_limited!(warn, %addr, error = %e, "forwarding a cancel request failed")
        }
        Err(_) => warden_core::log_limited!(warn, %addr, "forwarding a cancel request timed out"),
    }
}
