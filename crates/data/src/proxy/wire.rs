//! PostgreSQL's wire protocol as far as the proxy needs it: the startup packet with a bounded
//! length, framed messages (a type byte and a length) read into a buffer, and the few messages
//! the proxy writes itself. Everything read here comes from an untrusted instance or from the
//! server; nothing panics on it.

use std::io;

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Protocol 3.0, the only one the proxy speaks.
pub(crate) const PROTOCOL_3_0: i32 = 196_608;
const CANCEL_REQUEST: i32 = 80_877_102;
const SSL_REQUEST: i32 = 80_877_103;
const GSSENC_REQUEST: i32 = 80_877_104;

/// PostgreSQL's own bound on a startup packet (`MAX_STARTUP_PACKET_LENGTH`).
pub(crate) const MAX_STARTUP: usize = 10_000;

/// What a client's first packet asked for.
#[derive(Debug)]
pub(crate) enum Startup {
    /// A 3.0 startup message: its parameters, in order.
    Params(Vec<(String, String)>),
    /// SSLRequest or GSSENCRequest: answered 'N', then the real startup follows.
    Encryption,
    /// CancelRequest: the key the client was given.
    Cancel { pid: i32, secret: i32 },
    /// Any other protocol version.
    Unsupported(i32),
}

/// Why a client's startup packet was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartupError {
    #[error("the startup packet's length {0} is outside 8..={MAX_STARTUP} bytes")]
    Length(i64),
    #[error("the startup packet is malformed: {0}")]
    Malformed(&'static str),
    #[error("reading the startup packet: {0}")]
    Io(#[from] io::Error),
}

/// Reads one startup-phase packet (no type byte), refusing a length past `MAX_STARTUP`
/// before reading its body.
pub(crate) async fn read_startup<R: AsyncRead + Unpin>(r: &mut R) -> Result<Startup, StartupError> {
    let len = i64::from(r.read_i32().await?);
    if !(8..=MAX_STARTUP as i64).contains(&len) {
        return Err(StartupError::Length(len));
    }
    // The bound above makes the cast lossless.
    let mut body = vec![0u8; len as usize - 4];
    r.read_exact(&mut body).await?;
    let mut buf = &body[..];
    let code = buf.get_i32();
    match code {
        SSL_REQUEST | GSSENC_REQUEST if buf.is_empty() => Ok(Startup::Encryption),
        CANCEL_REQUEST if buf.len() == 8 => Ok(Startup::Cancel {
            pid: buf.get_i32(),
            secret: buf.get_i32(),
        }),
        SSL_REQUEST | GSSENC_REQUEST | CANCEL_REQUEST => {
            Err(StartupError::Malformed("bad request length"))
        }
        PROTOCOL_3_0 => parse_params(buf).map(Startup::Params),
        other => Ok(Startup::Unsupported(other)),
    }
}

/// Parses `name\0value\0...\0`, the body of a 3.0 startup message.
fn parse_params(mut buf: &[u8]) -> Result<Vec<(String, String)>, StartupError> {
    let mut params = Vec::new();
    loop {
        let name = take_cstr(&mut buf)?;
        if name.is_empty() {
            return if buf.is_empty() {
                Ok(params)
            } else {
                Err(StartupError::Malformed("bytes after the last parameter"))
            };
        }
        let value = take_cstr(&mut buf)?;
        params.push((name, value));
    }
}

fn take_cstr(buf: &mut &[u8]) -> Result<String, StartupError> {
    let end = buf
        .iter()
        .position(|&b| b == 0)
        .ok_or(StartupError::Malformed("a string without its terminator"))?;
    let s = std::str::from_utf8(&buf[..end])
        .map_err(|_| StartupError::Malformed("a parameter that is not UTF-8"))?;
    let s = s.to_owned();
    *buf = &buf[end + 1..];
    Ok(s)
}

/// The header of a framed message: its type byte and the length of its body (the length
/// field's own four bytes excluded).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Header {
    pub tag: u8,
    pub body: usize,
}

/// Reads a framed message's header into nothing but `buf`, so a caller can be cancelled
/// between reads and resume from `buf` (`read_buf` is cancel-safe). `None` at a clean end of
/// stream before any byte of a header.
pub(crate) async fn read_header<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
) -> io::Result<Option<Header>> {
    while buf.len() < 5 {
        if r.read_buf(buf).await? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
    }
    let tag = buf[0];
    let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    let body = usize::try_from(len)
        .ok()
        .and_then(|l| l.checked_sub(4))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("message length {len} is below 4"),
            )
        })?;
    Ok(Some(Header { tag, body }))
}

/// Reads a whole framed message (header and body) into `buf` and splits it off. For
/// messages the proxy reads itself (authentication, ParameterStatus, ReadyForQuery), bounded
/// by `max` bytes of body.
pub(crate) async fn read_message<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    max: usize,
) -> io::Result<(u8, BytesMut)> {
    let h = read_header(r, buf)
        .await?
        .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
    if h.body > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a '{}' message of {} bytes", h.tag as char, h.body),
        ));
    }
    while buf.len() < 5 + h.body {
        if r.read_buf(buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    let mut msg = buf.split_to(5 + h.body);
    msg.advance(5);
    Ok((h.tag, msg))
}

/// Appends a message of type `tag` with `body`.
pub(crate) fn put_message(out: &mut BytesMut, tag: u8, body: &[u8]) {
    out.put_u8(tag);
    // Bodies the proxy writes are small (parameters, errors); i32 holds them.
    out.put_i32(i32::try_from(body.len() + 4).unwrap_or(i32::MAX));
    out.put_slice(body);
}

/// Appends an ErrorResponse: severity, SQLSTATE, message and an optional hint.
pub(crate) fn put_error(
    out: &mut BytesMut,
    severity: &str,
    code: &str,
    message: &str,
    hint: Option<&str>,
) {
    let mut body = BytesMut::new();
    for (field, value) in [
        (b'S', severity),
        (b'V', severity),
        (b'C', code),
        (b'M', message),
    ] {
        put_field(&mut body, field, value);
    }
    if let Some(hint) = hint {
        put_field(&mut body, b'H', hint);
    }
    body.put_u8(0);
    put_message(out, b'E', &body);
}

fn put_field(body: &mut BytesMut, field: u8, value: &str) {
    body.put_u8(field);
    // A NUL inside would end the field early; the proxy's texts have none, but be exact.
    body.put_slice(value.replace('\0', " ").as_bytes());
    body.put_u8(0);
}

/// Appends a ParameterStatus.
pub(crate) fn put_parameter(out: &mut BytesMut, name: &str, value: &str) {
    let mut body = BytesMut::with_capacity(name.len() + value.len() + 2);
    body.put_slice(name.as_bytes());
    body.put_u8(0);
    body.put_slice(value.as_bytes());
    body.put_u8(0);
    put_message(out, b'S', &body);
}

/// Splits a ParameterStatus body into name and value.
pub(crate) fn parse_parameter(body: &[u8]) -> Option<(String, String)> {
    let mut buf = body;
    let name = take_cstr(&mut buf).ok()?;
    let value = take_cstr(&mut buf).ok()?;
    Some((name, value))
}

/// The message field (`M`) of an ErrorResponse body, for errors the proxy reports itself.
pub(crate) fn error_message(body: &[u8]) -> String {
    body.split(|&b| b == 0)
        .find(|f| f.first() == Some(&b'M'))
        .map(|f| String::from_utf8_lossy(&f[1..]).into_owned())
        .unwrap_or_else(|| "no message".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(code: i32, rest: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((rest.len() + 8) as i32).to_be_bytes());
        v.extend_from_slice(&code.to_be_bytes());
        v.extend_from_slice(rest);
        v
    }

    #[tokio::test]
    async fn startup_packets_parse_or_are_refused() {
        let p = packet(PROTOCOL_3_0, b"user\0me\0database\0d\0\0");
        let Startup::Params(params) = read_startup(&mut &p[..]).await.unwrap() else {
            panic!()
        };
        assert_eq!(
            params,
            vec![
                ("user".into(), "me".into()),
                ("database".into(), "d".into())
            ]
        );
        let p = packet(CANCEL_REQUEST, &[0, 0, 0, 7, 0, 0, 0, 9]);
        assert!(matches!(
            read_startup(&mut &p[..]).await.unwrap(),
            Startup::Cancel { pid: 7, secret: 9 }
        ));
        let p = packet(SSL_REQUEST, b"");
        assert!(matches!(
            read_startup(&mut &p[..]).await.unwrap(),
            Startup::Encryption
        ));
        let p = packet(0x0002_0000, b"");
        assert!(matches!(
            read_startup(&mut &p[..]).await.unwrap(),
            Startup::Unsupported(_)
        ));
        // Unterminated, too long, too short: refused, never a panic.
        let p = packet(PROTOCOL_3_0, b"user\0me");
        assert!(read_startup(&mut &p[..]).await.is_err());
        let mut p = packet(PROTOCOL_3_0, b"");
        p[..4].copy_from_slice(&(MAX_STARTUP as i32 + 1).to_be_bytes());
        assert!(matches!(
            read_startup(&mut &p[..]).await,
            Err(StartupError::Length(_))
        ));
        let p = [0u8, 0, 0, 3];
        assert!(matches!(
            read_startup(&mut &p[..]).await,
            Err(StartupError::Length(3))
        ));
    }
}
