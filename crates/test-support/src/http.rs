//! A deliberately small HTTP/1.1 client over `std::net::TcpStream`: one request per connection,
//! exact bytes on the wire, so tests can also send what a browser never would.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use base64::Engine;

pub use ::http::Version;

/// A parsed response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// First header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (panics with the body if it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// `Basic base64(user:password)`.
pub fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

fn split_url(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").expect("http:// URL");
    match rest.find('/') {
        Some(i) => (rest[..i].to_owned(), rest[i..].to_owned()),
        None => (rest.to_owned(), "/".to_owned()),
    }
}

/// Sends one request and reads the whole response.
pub fn request(method: &str, url: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
    let (host, wire) = request_bytes(method, url, headers, body);
    raw(&host, &wire)
}

/// [`request`] from the loopback address `src` (every 127.x.y.z is this machine), as a client
/// on another address would send it.
pub fn request_from(
    src: std::net::Ipv4Addr,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let (host, wire) = request_bytes(method, url, headers, body);
    exchange(connect_from(src, &host), &host, &wire)
}

/// A TCP connection to `host` from `src`.
fn connect_from(src: std::net::Ipv4Addr, host: &str) -> TcpStream {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    let to: std::net::SocketAddrV4 = host.parse().expect("an IPv4 host:port");
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    let [a, b, c, d] = src.octets();
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::new(a, b, c, d, 0),
    )
    .unwrap();
    connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::from(to)).unwrap();
    TcpStream::from(fd)
}

/// The bytes of one request with `connection: close`, and the host they go to.
fn request_bytes(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (String, Vec<u8>) {
    let (host, path) = split_url(url);
    let mut head = format!("{method} {path} HTTP/1.1\r\nconnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("host: {host}\r\n"));
    }
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    if !body.is_empty() || matches!(method, "POST" | "PUT" | "PATCH") {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut wire = head.into_bytes();
    wire.extend_from_slice(body);
    (host, wire)
}

/// Sends raw bytes to `host` and parses what comes back.
pub fn raw(host: &str, wire: &[u8]) -> Response {
    let s = TcpStream::connect(host).unwrap_or_else(|e| panic!("connect {host}: {e}"));
    exchange(s, host, wire)
}

fn exchange(mut s: TcpStream, host: &str, wire: &[u8]) -> Response {
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s.write_all(wire).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            // A server that refuses a request may close with unread input, which resets the
            // connection after its answer; keep what arrived.
            Err(e) if !buf.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading from {host}: {e}"),
        }
    }
    parse(&buf)
}

/// A whole response's bytes parsed (chunked bodies joined).
pub fn parse_response(buf: &[u8]) -> Response {
    parse(buf)
}

fn parse(buf: &[u8]) -> Response {
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| {
            panic!(
                "no complete response head in {:?}",
                String::from_utf8_lossy(buf)
            )
        });
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = buf[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Response {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&b[..eol])
                .split(';')
                .next()
                .unwrap_or("0")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 || b.len() < eol + 2 + size {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
}

/// Sends `wire` (several requests, pipelined) on one connection, reads until the server closes
/// it, and splits what came back into responses, framed by content-length or chunked encoding.
/// `head_only[i]` says the i-th request was a HEAD, whose response has no body.
pub fn pipeline(host: &str, wire: &[u8], head_only: &[bool]) -> Vec<Response> {
    let mut s = TcpStream::connect(host).unwrap_or_else(|e| panic!("connect {host}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s.write_all(wire).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .unwrap_or_else(|e| panic!("reading from {host}: {e}"));
    let mut rest = &buf[..];
    let mut out = Vec::new();
    while !rest.is_empty() {
        let end = rest
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no complete head in {:?}", String::from_utf8_lossy(rest)))
            + 4;
        let head = parse(&rest[..end]);
        let body_len = if head_only.get(out.len()).copied().unwrap_or(false) {
            0
        } else if head.header("transfer-encoding").is_some() {
            chunked_len(&rest[end..])
        } else {
            head.header("content-length")
                .map_or(rest.len() - end, |n| n.parse().unwrap())
        };
        let mut r = parse(&rest[..end + body_len]);
        if head.header("transfer-encoding").is_none() {
            r.body = rest[end..end + body_len].to_vec();
        }
        out.push(r);
        rest = &rest[end + body_len..];
    }
    out
}

/// Length on the wire of the chunked body at the start of `b`, trailers included.
fn chunked_len(b: &[u8]) -> usize {
    let mut at = 0;
    loop {
        let eol = at
            + b[at..]
                .windows(2)
                .position(|w| w == b"\r\n")
                .expect("chunk size line");
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&b[at..eol])
                .split(';')
                .next()
                .unwrap_or("")
                .trim(),
            16,
        )
        .expect("chunk size");
        at = eol + 2;
        if size == 0 {
            // Trailer lines, then the empty line.
            loop {
                let eol = at
                    + b[at..]
                        .windows(2)
                        .position(|w| w == b"\r\n")
                        .expect("trailer");
                let empty = eol == at;
                at = eol + 2;
                if empty {
                    return at;
                }
            }
        }
        at += size + 2;
    }
}

/// A GET over HTTP/2 with prior knowledge (h2c), through hyper's client; returns the version
/// the server answered with and its response.
pub fn h2c_get(url: &str, headers: &[(&str, &str)]) -> (http::Version, Response) {
    use http_body_util::{BodyExt, Empty};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .http2_only(true)
                .build_http::<Empty<bytes::Bytes>>();
        let mut req = http::Request::get(url);
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        let resp = client
            .request(req.body(Empty::new()).unwrap())
            .await
            .unwrap();
        let version = resp.version();
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        let body = resp
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec();
        (
            version,
            Response {
                status,
                headers,
                body,
            },
        )
    })
}
