//! A client's messages to its server connection and back, framed both ways.
//!
//! Each direction scans whole messages out of its buffer and forwards runs of them in one
//! write. Client to server: Terminate ends the client (the server connection goes back to the
//! pool), a message past the bound ends it with an error. Server to client: every
//! NotificationResponse is dropped; ParameterStatus is tracked for the next client;
//! ReadyForQuery is counted, so the proxy knows whether the client left between transactions.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, Ordering::SeqCst};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;

use super::upstream::ServerConn;
use super::wire;

/// The largest server message the relay reads whole (ParameterStatus, ReadyForQuery).
const MAX_INSPECTED: usize = 1 << 20;
const READ_CHUNK: usize = 16 << 10;

/// How a client's relay ended.
#[derive(Debug)]
pub(crate) enum End {
    /// Terminate or end of stream from the client.
    ClientLeft,
    /// The client sent a message whose body is this long, past the bound.
    TooLarge(usize),
    /// The client sent a message whose length field is below 4.
    Malformed,
    /// The server closed (it said why, if it did, in a message already relayed).
    ServerGone,
    /// Reading or writing either side failed.
    Io(io::Error),
}

/// What both directions know of the session, to decide if the server connection is clean.
#[derive(Default)]
struct Session {
    /// Sync points the client sent (Query, Sync, FunctionCall) minus ReadyForQuery received.
    pending: AtomicI64,
    /// The client sent an extended-protocol message after its last sync point.
    loose: AtomicBool,
    /// The transaction status of the last ReadyForQuery ('I' idle, 'T', 'E').
    status: AtomicU8,
}

/// Where a direction is inside a message, kept outside its future so that, once the other
/// direction ends the relay, the proxy knows whether the server's stream is at a boundary.
#[derive(Default)]
struct Progress {
    /// Bytes of the current message still to forward.
    forward: usize,
    /// Bytes of the current message still to drop.
    drop: usize,
    /// A write of already-scanned bytes is under way.
    writing: bool,
}

impl Progress {
    fn at_boundary(&self) -> bool {
        self.forward == 0 && self.drop == 0 && !self.writing
    }
}

/// What the server connection owes once its client has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owed {
    /// Nothing: at a message boundary, every sync point answered, idle.
    Nothing,
    /// This many ReadyForQuery still to come for sync points the client sent before leaving
    /// (clients send Close and Sync, then Terminate, without waiting): read them, then it is
    /// clean if the last says idle.
    Answers(i64),
    /// Mid-message, mid-transaction or mid-pipeline: close it. `busy` if the server may
    /// still be working on something the client sent.
    Unusable { busy: bool },
}

/// Relays until one side ends. Returns how it ended and what the server connection owes.
pub(crate) async fn run(
    client: &mut UnixStream,
    conn: &mut ServerConn,
    max_message: usize,
) -> (End, Owed) {
    let session = Session {
        status: AtomicU8::new(b'I'),
        ..Session::default()
    };
    let (mut up, mut down) = (Progress::default(), Progress::default());
    let (mut cr, mut cw) = client.split();
    let (mut sr, mut sw) = conn.stream.split();
    let mut cbuf = BytesMut::with_capacity(READ_CHUNK);
    let end = tokio::select! {
        end = client_to_server(&mut cr, &mut cbuf, &mut sw, &session, &mut up, max_message) => end,
        end = server_to_client(&mut sr, &mut conn.rbuf, &mut cw, &session, &mut down, &mut conn.params) => end,
    };
    let pending = session.pending.load(SeqCst);
    let busy = pending != 0 || session.loose.load(SeqCst);
    let owed = if !matches!(end, End::ClientLeft | End::TooLarge(_) | End::Malformed)
        || !down.at_boundary()
        || !up.at_boundary()
        || session.loose.load(SeqCst)
        || pending < 0
    {
        Owed::Unusable { busy }
    } else if pending > 0 {
        Owed::Answers(pending)
    } else if session.status.load(SeqCst) == b'I' {
        Owed::Nothing
    } else {
        Owed::Unusable { busy }
    };
    let refusal = match end {
        End::TooLarge(len) => Some((
            "54000",
            format!(
                "a message of {len} bytes is past the data socket's bound of {max_message} bytes"
            ),
            "send large values in pieces, or with COPY",
        )),
        End::Malformed => Some((
            "08P01",
            "a message with a length below 4".to_owned(),
            "fix the client",
        )),
        _ => None,
    };
    // Only between the server's messages may the proxy write one of its own.
    if let Some((code, msg, hint)) = refusal.filter(|_| down.at_boundary()) {
        let mut out = BytesMut::new();
        wire::put_error(&mut out, "FATAL", code, &msg, Some(hint));
        let _ = cw.write_all(&out).await;
    }
    (end, owed)
}

async fn client_to_server(
    r: &mut (impl AsyncRead + Unpin),
    buf: &mut BytesMut,
    w: &mut (impl AsyncWrite + Unpin),
    session: &Session,
    p: &mut Progress,
    max: usize,
) -> End {
    loop {
        let mut n = 0;
        let mut stop = None;
        loop {
            if p.forward > 0 {
                let k = p.forward.min(buf.len() - n);
                n += k;
                p.forward -= k;
                if p.forward > 0 {
                    break;
                }
            }
            let Some((tag, body)) = header_at(&buf[n..]) else {
                break;
            };
            let Some(body) = body else {
                stop = Some(End::Malformed);
                break;
            };
            if body > max {
                stop = Some(End::TooLarge(body));
                break;
            }
            match tag {
                b'X' => {
                    stop = Some(End::ClientLeft);
                    break;
                }
                b'Q' | b'S' | b'F' => {
                    session.pending.fetch_add(1, SeqCst);
                    session.loose.store(false, SeqCst);
                }
                // COPY data belongs to the Query that started it.
                b'd' | b'c' | b'f' => {}
                _ => session.loose.store(true, SeqCst),
            }
            p.forward = 5 + body;
        }
        if n > 0 {
            p.writing = true;
            if let Err(e) = w.write_all(&buf[..n]).await {
                return End::Io(e);
            }
            buf.advance(n);
            p.writing = false;
        }
        if let Some(end) = stop {
            return end;
        }
        buf.reserve(READ_CHUNK);
        match r.read_buf(buf).await {
            Ok(0) => return End::ClientLeft,
            Ok(_) => {}
            Err(e) => return End::Io(e),
        }
    }
}

async fn server_to_client(
    r: &mut (impl AsyncRead + Unpin),
    buf: &mut BytesMut,
    w: &mut (impl AsyncWrite + Unpin),
    session: &Session,
    p: &mut Progress,
    params: &mut std::collections::BTreeMap<String, String>,
) -> End {
    loop {
        let mut n = 0;
        loop {
            if p.forward > 0 {
                let k = p.forward.min(buf.len() - n);
                n += k;
                p.forward -= k;
                if p.forward > 0 {
                    break;
                }
            }
            if p.drop > 0 {
                // Forward what comes before the dropped message first.
                if n > 0 {
                    break;
                }
                let k = p.drop.min(buf.len());
                buf.advance(k);
                p.drop -= k;
                if p.drop > 0 {
                    break;
                }
                continue;
            }
            let Some((tag, body)) = header_at(&buf[n..]) else {
                break;
            };
            let Some(body) = body else {
                return End::Io(invalid("a server message with a length below 4"));
            };
            match tag {
                // LISTEN/NOTIFY would be a channel between labels: no instance receives one.
                b'A' => p.drop = 5 + body,
                b'Z' | b'S' => {
                    if body > MAX_INSPECTED {
                        return End::Io(invalid("an oversized ParameterStatus or ReadyForQuery"));
                    }
                    if buf.len() - n < 5 + body {
                        break;
                    }
                    let msg = &buf[n + 5..n + 5 + body];
                    if tag == b'Z' {
                        // Counted before the client sees it, so a client that leaves right
                        // after leaves a connection known to be idle.
                        session
                            .status
                            .store(msg.first().copied().unwrap_or(0), SeqCst);
                        session.pending.fetch_sub(1, SeqCst);
                    } else if let Some((k, v)) = wire::parse_parameter(msg) {
                        params.insert(k, v);
                    }
                    n += 5 + body;
                }
                _ => p.forward = 5 + body,
            }
        }
        if n > 0 {
            p.writing = true;
            if let Err(e) = w.write_all(&buf[..n]).await {
                return End::Io(e);
            }
            buf.advance(n);
            p.writing = false;
            continue;
        }
        buf.reserve(READ_CHUNK);
        match r.read_buf(buf).await {
            Ok(0) => return End::ServerGone,
            Ok(_) => {}
            Err(e) => return End::Io(e),
        }
    }
}

/// The tag and body length of a message starting at `buf`, if its header is all there; the
/// length is `None` when the header's length field is below 4 or does not fit.
fn header_at(buf: &[u8]) -> Option<(u8, Option<usize>)> {
    if buf.len() < 5 {
        return None;
    }
    let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    Some((
        buf[0],
        usize::try_from(len).ok().and_then(|l| l.checked_sub(4)),
    ))
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}
