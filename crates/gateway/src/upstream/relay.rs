//! An answer's way to the client: as bytes on the lane, its body relayed with its own framing;
//! or as a hyper response, its body decoded into frames that hyper frames anew (HTTP/1.1 or
//! HTTP/2). Either way the connection to the instance goes back to the pool once the body is
//! through, if it can carry another request.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::head::Framing;
use super::{Answer, AnswerBody, Conn, Upstream};
use crate::error::{Fault, GatewayError, Stage};
use crate::response::{self, BoxError};

/// Bodies up to this size are copied behind the head for one write; larger ones are written
/// on their own, so no per-connection buffer grows to the size of a large answer.
const COPY_LIMIT: usize = 16 * 1024;

fn broken() -> std::io::Error {
    std::io::Error::other("the instance's response body ended early or was malformed")
}

/// What the next step of reading a body found.
enum Step {
    /// Body bytes, as they are on the wire (with their chunk framing, if any), and the data
    /// they hold (ranges into them).
    Bytes(Bytes, Vec<std::ops::Range<usize>>),
    /// The body is complete.
    Done,
    /// The instance closed a body that runs to the close.
    Closed,
}

/// Reads the next part of a body framed by `framing` from `conn`.
async fn step(conn: &mut Conn, framing: &mut Framing) -> Result<Step, std::io::Error> {
    loop {
        let mut data = Vec::new();
        let take = match framing {
            Framing::Length(left) => {
                let n = usize::try_from(*left)
                    .unwrap_or(usize::MAX)
                    .min(conn.buf.len());
                data.push(0..n);
                n
            }
            Framing::Chunked(s) => s
                .advance_with(&conn.buf, |r| data.push(r))
                .map_err(|_| broken())?,
            Framing::Close => {
                data.push(0..conn.buf.len());
                conn.buf.len()
            }
        };
        if take > 0 {
            if let Framing::Length(left) = framing {
                *left -= take as u64;
            }
            return Ok(Step::Bytes(conn.buf.split_to(take).freeze(), data));
        }
        let done = match framing {
            Framing::Length(left) => *left == 0,
            Framing::Chunked(s) => s.done(),
            Framing::Close => false,
        };
        if done {
            return Ok(Step::Done);
        }
        match conn.read_more(Stage::Body).await {
            Ok(0) if matches!(framing, Framing::Close) => return Ok(Step::Closed),
            Ok(0) | Err(_) => return Err(broken()),
            Ok(_) => {}
        }
    }
}

// === impl Answer ===

impl Answer {
    /// Writes the answer to the client, relaying a body still to come, and hands the instance's
    /// connection back to the pool when it can be reused. Returns whether the client's
    /// connection can carry another request. `close` adds `connection: close`, for a client
    /// that asked for it.
    pub(crate) async fn relay<W: AsyncWrite + Unpin>(
        self,
        upstream: &Upstream,
        close: bool,
        client: &mut W,
        out: &mut Vec<u8>,
    ) -> std::io::Result<bool> {
        out.clear();
        out.extend_from_slice(&self.head);
        let closing = matches!(
            &self.body,
            AnswerBody::Rest {
                framing: Framing::Close,
                ..
            }
        );
        if close && !closing {
            // Before the empty line that ends the head.
            out.truncate(out.len() - 2);
            out.extend_from_slice(b"connection: close\r\n\r\n");
        }
        let (mut conn, mut framing) = match self.body {
            AnswerBody::Whole(b) if b.len() <= COPY_LIMIT => {
                out.extend_from_slice(&b);
                client.write_all(out).await?;
                return Ok(true);
            }
            AnswerBody::Whole(b) => {
                client.write_all(out).await?;
                client.write_all(&b).await?;
                return Ok(true);
            }
            AnswerBody::Rest { conn, framing } => (conn, framing),
        };
        client.write_all(out).await?;
        loop {
            match step(&mut conn, &mut framing).await? {
                Step::Bytes(wire, _) => client.write_all(&wire).await?,
                Step::Done => {
                    if self.reuse && conn.buf.is_empty() {
                        upstream.idle.checkin(&self.instance, conn);
                    }
                    return Ok(true);
                }
                Step::Closed => return Ok(false),
            }
        }
    }

    /// The answer as a response for hyper to write. Its body is decoded from its framing
    /// (hyper frames it anew), so the framing and connection headers stay behind.
    pub(crate) fn into_response(
        self,
        upstream: Arc<Upstream>,
    ) -> Result<Response<response::Body>, GatewayError> {
        let mut fields = [std::mem::MaybeUninit::uninit(); 128];
        let mut parsed = httparse::Response::new(&mut []);
        // The head is the gateway's own writing of a head httparse already read.
        let Ok(httparse::Status::Complete(_)) = httparse::ParserConfig::default()
            .parse_response_with_uninit_headers(&mut parsed, &self.head, &mut fields)
        else {
            return Err(GatewayError::Broken(Fault::new(
                Stage::Head,
                "an unreadable response head",
            )));
        };
        let mut headers = HeaderMap::with_capacity(parsed.headers.len());
        for f in parsed.headers.iter() {
            let name = f.name.as_bytes();
            if name.eq_ignore_ascii_case(b"transfer-encoding")
                || name.eq_ignore_ascii_case(b"connection")
            {
                continue;
            }
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name),
                HeaderValue::from_bytes(f.value),
            ) {
                headers.append(n, v);
            }
        }
        let status = StatusCode::from_u16(self.status).map_err(|_| {
            GatewayError::Broken(Fault::new(
                Stage::Head,
                format!("status {} is not HTTP", self.status),
            ))
        })?;
        let body = match self.body {
            AnswerBody::Whole(b) => response::full(b),
            AnswerBody::Rest { conn, framing } => {
                let state = (conn, framing, upstream, self.instance, self.reuse, false);
                let frames = futures_util::stream::unfold(state, |mut s| async move {
                    loop {
                        let (conn, framing, _, _, _, over) = &mut s;
                        if *over {
                            return None;
                        }
                        match step(conn, framing).await {
                            // Only chunk framing, no data: read on.
                            Ok(Step::Bytes(_, data)) if data.iter().all(|r| r.is_empty()) => {}
                            Ok(Step::Bytes(wire, data)) => {
                                let frame = Frame::data(gather(&wire, &data));
                                return Some((Ok::<_, BoxError>(frame), s));
                            }
                            Ok(Step::Done) => {
                                let (conn, _, upstream, instance, reuse, _) = s;
                                if reuse && conn.buf.is_empty() {
                                    upstream.idle.checkin(&instance, conn);
                                }
                                return None;
                            }
                            Ok(Step::Closed) => return None,
                            Err(e) => {
                                *over = true;
                                return Some((Err(e.into()), s));
                            }
                        }
                    }
                });
                StreamBody::new(frames).boxed()
            }
        };
        let mut resp = Response::new(body);
        *resp.status_mut() = status;
        *resp.headers_mut() = headers;
        Ok(resp)
    }
}

/// The data of `wire` at `ranges`: a slice of it when they are one run.
fn gather(wire: &Bytes, ranges: &[std::ops::Range<usize>]) -> Bytes {
    match ranges {
        [] => Bytes::new(),
        [one] => wire.slice(one.clone()),
        many => {
            let mut b = BytesMut::with_capacity(many.iter().map(|r| r.len()).sum());
            for r in many {
                b.extend_from_slice(&wire[r.clone()]);
            }
            b.freeze()
        }
    }
}
