//! A response head from an instance: parsed, judged by [`crate::hygiene`], and written out
//! again for the client, with the way its body is framed.

use super::chunked::Scanner;
use crate::error::{Fault, GatewayError, Stage};
use crate::hygiene::{self, ResponseFraming};

/// Largest number of header fields accepted in a response head.
const MAX_HEADERS: usize = 100;

/// How the rest of a response body is delimited.
pub(crate) enum Framing {
    /// This many bytes.
    Length(u64),
    Chunked(Scanner),
    /// Until the instance closes the connection.
    Close,
}

/// A response head as read from an instance and cleaned for the client.
pub(crate) struct ResponseHead {
    pub status: u16,
    /// Status line and headers for the client, ending with the empty line.
    pub bytes: Vec<u8>,
    pub taint: Option<String>,
    /// How the body is delimited; `None` when there is none.
    pub framing: Option<Framing>,
    /// Whether the connection to the instance may carry another request after this one.
    pub reuse: bool,
}

pub(crate) enum Parsed {
    Partial,
    /// A 1xx head of this length, to skip: the request sends no `Expect`, so it is a hint.
    Informational(usize),
    Final(ResponseHead, usize),
}

fn malformed(what: impl std::fmt::Display) -> GatewayError {
    GatewayError::Broken(Fault::new(Stage::Head, what.to_string()))
}

/// Parses the response head at the start of `buf`; `head_only` for the answer to a HEAD.
pub(crate) fn parse(buf: &[u8], head_only: bool) -> Result<Parsed, GatewayError> {
    // Left uninitialised: filling the array costs more than parsing a short head.
    let mut fields = [std::mem::MaybeUninit::uninit(); MAX_HEADERS];
    let mut r = httparse::Response::new(&mut []);
    let n = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut r,
        buf,
        &mut fields,
    ) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(e) => return Err(malformed(format_args!("malformed response head: {e}"))),
    };
    let status = r.code.unwrap_or(0);
    if status == 101 {
        return Err(malformed("the instance switched protocols unasked"));
    }
    if (100..200).contains(&status) {
        return Ok(Parsed::Informational(n));
    }
    let pairs = || r.headers.iter().map(|f| (f.name.as_bytes(), f.value));
    let framed = ResponseFraming::of(pairs());
    let mut keep_alive = r.version == Some(1);
    let mut chunked = None;
    let mut length: Option<u64> = None;
    for (name, value) in pairs() {
        if name.eq_ignore_ascii_case(b"connection") {
            for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && r.version == Some(0) {
                    keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            let last = value.rsplit(|&b| b == b',').next().map(<[u8]>::trim_ascii);
            chunked = Some(last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked")));
        } else if name.eq_ignore_ascii_case(b"content-length") {
            // Digits only, as passed on: a client must read the same length as the gateway.
            let v = Some(value)
                .filter(|v| !v.is_empty() && v.iter().all(u8::is_ascii_digit))
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
                .ok_or_else(|| malformed("the response has an unreadable content-length"))?;
            if length.is_some_and(|l| l != v) {
                return Err(malformed("the response has conflicting content-lengths"));
            }
            length = Some(v);
        }
    }
    let no_body = head_only || status == 204 || status == 304;
    let framing = match (no_body, chunked, length) {
        (true, _, _) => None,
        (false, Some(true), _) => Some(Framing::Chunked(Scanner::new())),
        // A transfer coding other than chunked last: the body runs to the close (RFC 9112 §6.3).
        (false, Some(false), _) => Some(Framing::Close),
        (false, None, Some(n)) => Some(Framing::Length(n)),
        (false, None, None) => Some(Framing::Close),
    };
    let close = matches!(framing, Some(Framing::Close));
    let mut out = Vec::with_capacity(n + 32);
    out.extend_from_slice(b"HTTP/1.1 ");
    // httparse took exactly three digits.
    out.extend_from_slice(&crate::metrics::status_digits(status));
    out.push(b' ');
    out.extend_from_slice(r.reason.unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut taint = None;
    for (name, value) in pairs() {
        if name.eq_ignore_ascii_case(hygiene::TAINT.as_bytes()) {
            taint = Some(String::from_utf8_lossy(value).into_owned());
        }
        if hygiene::response_drops(name, value, &framed) {
            continue;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(Parsed::Final(
        ResponseHead {
            status,
            bytes: out,
            taint,
            reuse: keep_alive && !close,
            framing,
        },
        n,
    ))
}
