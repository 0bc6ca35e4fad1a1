//! Static files of an app, served by the gateway itself (seed 003 §2.1.1): no instance starts
//! for them.
//!
//! Paths are percent-decoded and must stay inside the app's directory: `.` and `..` segments,
//! NUL bytes and backslashes are refused, and the kernel resolves the rest beneath the root's
//! descriptor when the file is opened (symlinks only while they stay beneath), so neither
//! traversal nor a symlink can reach other files; and nothing is served from warden's own data
//! directory, checked on what was opened, at every request.
//! Answers carry Content-Type, ETag and Last-Modified, honour If-None-Match and
//! If-Modified-Since with 304, and single byte ranges with 206 or 416.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use crate::error::GatewayError;
use crate::response::{self as respond, Body};

/// Read size when streaming a file.
const CHUNK: usize = 64 * 1024;

/// Where static files may never come from: warden's own data directory (its admin token, keys,
/// store and instances' data), except the sites warden built there (`slugs/`), which are served
/// on purpose. Paths are canonical.
#[derive(Debug, Clone, Default)]
pub struct PrivateData {
    /// Warden's data directory.
    pub data_dir: Option<PathBuf>,
    /// The one part of it that may be served: built slugs.
    pub served_within: Option<PathBuf>,
}

impl PrivateData {
    /// The data directory `dir` (resolved now), whose `slugs/` alone may be served.
    pub fn data_dir(dir: &Path) -> Self {
        let dir = std::fs::canonicalize(dir)
            .or_else(|_| std::path::absolute(dir))
            .unwrap_or_else(|_| dir.to_owned());
        Self {
            served_within: Some(dir.join("slugs")),
            data_dir: Some(dir),
        }
    }

    /// Whether a file whose real path is `real` may be served.
    fn allows(&self, real: &Path) -> bool {
        match &self.data_dir {
            Some(d) if real.starts_with(d) => self
                .served_within
                .as_ref()
                .is_some_and(|s| real.starts_with(s)),
            _ => true,
        }
    }
}

/// Answers a request for `rel` (the path after the static prefix) from `root`.
pub(crate) async fn file(
    root: &str,
    rel: &str,
    private: &PrivateData,
    method: &Method,
    headers: &HeaderMap,
) -> Response<Body> {
    // A browser reads a missing file as a page, a program as JSON.
    let accept = headers.get(header::ACCEPT).map(HeaderValue::as_bytes);
    let ask = crate::response::Ask::new(accept, method.as_str().as_bytes(), None);
    if method != Method::GET && method != Method::HEAD {
        let mut r =
            GatewayError::MethodNotAllowed("static files answer GET and HEAD only").respond(&ask);
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let (root, rel, private) = (PathBuf::from(root), rel.to_owned(), private.clone());
    let opened = tokio::task::spawn_blocking(move || open(&root, &rel, &private))
        .await
        .ok()
        .flatten();
    let Some(opened) = opened else {
        return GatewayError::NotFound("no such file".into()).respond(&ask);
    };
    match answer(opened, method, headers).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "reading a static file failed");
            GatewayError::NotFound("no such file".into()).respond(&ask)
        }
    }
}

/// A static file, opened.
struct Opened {
    file: std::fs::File,
    meta: std::fs::Metadata,
    /// Its real path (for its media type).
    real: PathBuf,
}

/// Opens the file `rel` names beneath `root`, or `None` if it does not exist, is no regular
/// file or would leave `root`. Resolved by the kernel at the moment of opening
/// (`RESOLVE_BENEATH`: no `..`, absolute path or symlink may leave the root's descriptor), never
/// as text; then the real path of what was opened must not be in warden's data directory,
/// whatever the root has become since it was configured (a path that did not exist when
/// written, made a symlink later).
fn open(root: &Path, rel: &str, private: &PrivateData) -> Option<Opened> {
    use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
    let decoded = percent_encoding::percent_decode_str(rel)
        .decode_utf8()
        .ok()?;
    let mut path = PathBuf::from(".");
    for seg in decoded.split('/') {
        if seg == "." || seg == ".." || seg.contains('\0') || seg.contains('\\') {
            return None;
        }
        if !seg.is_empty() {
            path.push(seg);
        }
    }
    let root = nix::fcntl::open(
        root,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .ok()?;
    // Non-blocking, so that a FIFO planted in the tree cannot hold the thread on open.
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOCTTY)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let at = |p: &Path| -> Option<(std::fs::File, std::fs::Metadata)> {
        let file = std::fs::File::from(openat2(&root, p, how).ok()?);
        let meta = file.metadata().ok()?;
        Some((file, meta))
    };
    let (mut file, mut meta) = at(&path)?;
    if meta.is_dir() {
        (file, meta) = at(&path.join("index.html"))?;
    }
    if !meta.is_file() {
        return None;
    }
    let real = std::fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&file)
    ))
    .ok()?;
    if !private.allows(&real) {
        tracing::warn!(
            "a static directory leads into warden's data directory: refused; point static_dir elsewhere"
        );
        return None;
    }
    Some(Opened { file, meta, real })
}

async fn answer(
    opened: Opened,
    method: &Method,
    headers: &HeaderMap,
) -> std::io::Result<Response<Body>> {
    let Opened { file, meta, real } = opened;
    let path = real.as_path();
    let len = meta.len();
    let modified = changed(&meta);
    let mtime = modified.duration_since(UNIX_EPOCH).unwrap_or_default();
    // The inode too: a file replaced by another of the same size and time (a pushed slug's
    // files all carry the archive's fixed time) is another file.
    let etag = format!(
        "\"{len:x}-{:x}-{:x}{:08x}\"",
        std::os::unix::fs::MetadataExt::ino(&meta),
        mtime.as_secs(),
        mtime.subsec_nanos()
    );
    let last_modified = httpdate::fmt_http_date(modified);
    let mime = mime_guess::from_path(path).first_or_octet_stream();

    let mut resp = Response::new(respond::full(Bytes::new()));
    let h = resp.headers_mut();
    for (name, value) in [
        (header::ETAG, etag.as_str()),
        (header::LAST_MODIFIED, last_modified.as_str()),
        (header::CONTENT_TYPE, mime.as_ref()),
    ] {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(name, v);
        }
    }
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));

    if not_modified(headers, &etag, modified) {
        *resp.status_mut() = StatusCode::NOT_MODIFIED;
        return Ok(resp);
    }
    let (start, end) = match headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        None => (0, len),
        Some(spec) => match range(spec, len) {
            Range::Whole => (0, len),
            Range::Part(s, e) => {
                *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
                if let Ok(v) = HeaderValue::from_str(&format!("bytes {s}-{}/{len}", e - 1)) {
                    resp.headers_mut().insert(header::CONTENT_RANGE, v);
                }
                (s, e)
            }
            Range::Unsatisfiable => {
                *resp.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                    resp.headers_mut().insert(header::CONTENT_RANGE, v);
                }
                return Ok(resp);
            }
        },
    };
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(end - start));
    if method == Method::HEAD {
        return Ok(resp);
    }
    let mut file = tokio::fs::File::from_std(file);
    file.seek(std::io::SeekFrom::Start(start)).await?;
    let stream = futures_util::stream::unfold((file, end - start), |(mut file, left)| async move {
        if left == 0 {
            return None;
        }
        let mut buf = vec![0u8; CHUNK.min(left as usize)];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((
                    Ok(hyper::body::Frame::data(Bytes::from(buf))),
                    (file, left - n as u64),
                ))
            }
            // The head is sent already; ending the body early is all that is left to do.
            Err(_) => None,
        }
    });
    *resp.body_mut() = StreamBody::new(stream)
        .map_err(|never: std::convert::Infallible| match never {})
        .boxed();
    Ok(resp)
}

/// When the file last changed as far as a client can tell: the later of its modification time
/// and its inode's change time. A pushed slug's files carry the archive's fixed time (0), so
/// the modification time alone would call a new release's file unmodified; the change time
/// moves whenever the file is written, replaced or extracted anew.
fn changed(meta: &std::fs::Metadata) -> SystemTime {
    use std::os::unix::fs::MetadataExt;
    let modified = meta.modified().unwrap_or(UNIX_EPOCH);
    let ctime = u64::try_from(meta.ctime())
        .ok()
        .zip(u32::try_from(meta.ctime_nsec()).ok())
        .map(|(s, ns)| UNIX_EPOCH + std::time::Duration::new(s, ns))
        .unwrap_or(UNIX_EPOCH);
    modified.max(ctime)
}

fn not_modified(headers: &HeaderMap, etag: &str, modified: SystemTime) -> bool {
    if let Some(inm) = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
    {
        // If-None-Match wins over If-Modified-Since (RFC 9110 §13.2.2); weak comparison.
        return inm
            .split(',')
            .map(str::trim)
            .any(|t| t == "*" || t.trim_start_matches("W/") == etag);
    }
    let Some(since) = headers
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Ok(since) = httpdate::parse_http_date(since) else {
        return false;
    };
    let secs = |t: SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    };
    secs(modified) <= secs(since)
}

#[derive(Debug, PartialEq, Eq)]
enum Range {
    /// No usable single range: send everything.
    Whole,
    /// Bytes `start..end`.
    Part(u64, u64),
    /// The range lies past the end.
    Unsatisfiable,
}

/// A byte position: digits only; one too large for 64 bits is as far past any end as
/// `u64::MAX` (RFC 9110 §14.1.2 sets no limit on the digits).
fn position(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.parse::<u64>().unwrap_or(u64::MAX))
}

fn range(spec: &str, len: u64) -> Range {
    let Some(set) = spec.trim().strip_prefix("bytes=") else {
        return Range::Whole;
    };
    if set.contains(',') {
        // Several ranges: answering with the whole file is allowed and simpler.
        return Range::Whole;
    }
    let Some((a, b)) = set.trim().split_once('-') else {
        return Range::Whole;
    };
    let (a, b) = (a.trim(), b.trim());
    let parsed = match (a.is_empty(), b.is_empty()) {
        (true, false) => position(b).map(|n| (len.saturating_sub(n), len)),
        (false, true) => position(a).map(|s| (s, len)),
        (false, false) => match (position(a), position(b)) {
            (Some(s), Some(e)) if s <= e => Some((s, e.saturating_add(1).min(len))),
            _ => None,
        },
        (true, true) => None,
    };
    match parsed {
        None => Range::Whole,
        Some((s, e)) if s >= len || s >= e => Range::Unsatisfiable,
        Some((s, e)) => Range::Part(s, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(range("bytes=0-3", 10), Range::Part(0, 4));
        assert_eq!(range("bytes=5-", 10), Range::Part(5, 10));
        assert_eq!(range("bytes=-3", 10), Range::Part(7, 10));
        assert_eq!(range("bytes=8-100", 10), Range::Part(8, 10));
        assert_eq!(range("bytes=10-", 10), Range::Unsatisfiable);
        assert_eq!(range("bytes=0-1,3-4", 10), Range::Whole);
        assert_eq!(range("items=0-1", 10), Range::Whole);
        assert_eq!(range("bytes=4-2", 10), Range::Whole);
        // Ends past 64 bits are past the end like any other, wherever they sit.
        assert_eq!(
            range("bytes=2-18446744073709551615", 10),
            Range::Part(2, 10)
        );
        assert_eq!(
            range("bytes=2-99999999999999999999999", 10),
            Range::Part(2, 10)
        );
        assert_eq!(
            range("bytes=99999999999999999999999-", 10),
            Range::Unsatisfiable
        );
        assert_eq!(
            range("bytes=-99999999999999999999999", 10),
            Range::Part(0, 10)
        );
        assert_eq!(range("bytes=+1-2", 10), Range::Whole);
    }

    #[test]
    fn paths_cannot_leave_the_root() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().join("static");
        std::fs::create_dir_all(root.join("sub")).expect("mkdir");
        std::fs::write(root.join("a.txt"), "a").expect("write");
        std::fs::write(root.join("sub/index.html"), "i").expect("write");
        std::fs::write(dir.path().join("secret"), "s").expect("write");
        std::os::unix::fs::symlink(dir.path().join("secret"), root.join("link")).expect("symlink");
        // Links that each look inside but whose chain ends outside.
        std::os::unix::fs::symlink("..", root.join("sub/up")).expect("symlink");
        std::os::unix::fs::symlink("sub/up/..", root.join("chain")).expect("symlink");
        std::os::unix::fs::symlink("a.txt", root.join("inner")).expect("symlink");
        nix::unistd::mkfifo(&root.join("fifo"), nix::sys::stat::Mode::S_IRWXU).expect("fifo");
        let open = |rel: &str| open(&root, rel, &PrivateData::default());
        assert!(open("a.txt").is_some());
        assert!(open("inner").is_some_and(|o| o.real.ends_with("a.txt")));
        assert!(open("sub/up/a.txt").is_some());
        assert!(open("sub/").is_some_and(|o| o.real.ends_with("index.html")));
        for bad in [
            "../secret",
            "%2e%2e/secret",
            "sub/../../secret",
            "link",
            "chain/secret",
            "a.txt%00",
            "..%2fsecret",
            "nope",
            "fifo",
        ] {
            assert!(open(bad).is_none(), "{bad}");
        }
        // Nothing from the data directory but its built sites.
        let private = PrivateData::data_dir(&root);
        std::fs::create_dir_all(root.join("slugs/s1")).expect("mkdir");
        std::fs::write(root.join("slugs/s1/site.html"), "s").expect("write");
        assert!(super::open(&root, "a.txt", &private).is_none());
        assert!(super::open(&root, "slugs/s1/site.html", &private).is_some());
    }
}
