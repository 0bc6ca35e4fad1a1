//! Responses the gateway makes itself: JSON answers, and errors (JSON for programs, pages for
//! browsers, [`Ask`]) as hyper responses or as HTTP/1.1 bytes for the lane, both from one
//! [`Rendered`] form.

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};

use crate::endpoints::pages;
use crate::error::GatewayError;

/// The answer to a request head that did not arrive in time.
pub(crate) const TIMEOUT_408: &[u8] =
    b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// Errors a response body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Body type of every gateway response.
pub type Body = BoxBody<Bytes, BoxError>;

// === impl GatewayError (responses) ===

/// Who is asking, as far as the answer to a failure depends on it: a person's browser gets a
/// page (and, for a navigation that needs a session, the sign-in page), a program JSON.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ask<'a> {
    /// The client reads HTML (its `Accept` takes `text/html`, not behind JSON).
    pub html: bool,
    /// A GET or HEAD: sending it elsewhere loses nothing (another method would lose its body).
    pub navigation: bool,
    /// The path and query asked for, when this host serves the sign-in page: where to return
    /// after signing in. `None` for an app reached by its own host name, whose paths are all
    /// the app's.
    pub target: Option<&'a str>,
}

impl<'a> Ask<'a> {
    /// A program: JSON, never a redirect.
    pub const API: Ask<'static> = Ask {
        html: false,
        navigation: false,
        target: None,
    };

    /// From the request's `Accept`, method and target.
    pub fn new(accept: Option<&[u8]>, method: &[u8], target: Option<&'a str>) -> Self {
        Self {
            html: wants_html(accept),
            navigation: method == b"GET" || method == b"HEAD",
            target,
        }
    }
}

/// Whether an `Accept` value asks for HTML: `text/html` with a quality above zero, and not
/// below `application/json`'s (a program that takes both but prefers JSON gets JSON).
pub(crate) fn wants_html(accept: Option<&[u8]>) -> bool {
    let Some(accept) = accept.and_then(|a| std::str::from_utf8(a).ok()) else {
        return false;
    };
    let (mut html, mut json) = (0.0f32, 0.0f32);
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let kind = parts.next().unwrap_or("").trim();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        if kind.eq_ignore_ascii_case("text/html") {
            html = html.max(q);
        } else if kind.eq_ignore_ascii_case("application/json") {
            json = json.max(q);
        }
    }
    html > 0.0 && html >= json
}

/// An answer the gateway makes itself, before it is a hyper response or bytes for the lane:
/// the one form both downstreams write, so they answer alike.
pub(crate) struct Rendered {
    pub status: StatusCode,
    /// In the order they are written.
    pub headers: Vec<(header::HeaderName, header::HeaderValue)>,
    pub body: Bytes,
}

impl Rendered {
    /// As a hyper response.
    pub fn into_response(self) -> Response<Body> {
        let mut resp = Response::new(full(self.body));
        *resp.status_mut() = self.status;
        for (name, value) in self.headers {
            resp.headers_mut().insert(name, value);
        }
        resp
    }
}

/// The challenge a page asking a browser to sign in carries: a 401 needs one (RFC 9110
/// §15.5.2), and a scheme no browser knows shows no password prompt, unlike `Basic`.
const FORM_CHALLENGE: &str = "Form realm=\"warden\", action=\"/login\"";

/// The challenge of a 401 page: see [`FORM_CHALLENGE`].
pub(crate) fn form_challenge() -> (header::HeaderName, header::HeaderValue) {
    (
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static(FORM_CHALLENGE),
    )
}

impl GatewayError {
    /// The status [`Self::render`] answers `ask` with: [`Self::status`], but `303` for a
    /// browser's navigation that is sent to sign in.
    pub(crate) fn status_for(&self, ask: &Ask<'_>) -> StatusCode {
        match self {
            Self::Unauthenticated if ask.html && ask.navigation && ask.target.is_some() => {
                StatusCode::SEE_OTHER
            }
            _ => self.status(),
        }
    }

    /// The answer to this failure for `ask`: JSON `{"error": "..."}` for a program; for a
    /// browser an HTML page, or a redirect to the sign-in page for a navigation without a
    /// session; with the headers the status calls for.
    pub(crate) fn render(&self, ask: &Ask<'_>) -> Rendered {
        let status = self.status_for(ask);
        if !ask.html {
            let (body, kind) = match self.plain_text() {
                true => (format!("{self}\n"), TEXT),
                false => {
                    let message = serde_json::Value::String(self.to_string());
                    (format!("{{\"error\":{message}}}\n"), "application/json")
                }
            };
            let mut headers = vec![(header::CONTENT_TYPE, header::HeaderValue::from_static(kind))];
            headers.extend(self.extra_header());
            return Rendered {
                status,
                headers,
                body: Bytes::from(body),
            };
        }
        let mut headers: Vec<_> = pages::html_headers().into();
        let body = match (self, ask.target) {
            (Self::Unauthenticated, Some(target)) if status == StatusCode::SEE_OTHER => {
                let to = pages::sign_in_url(target);
                if let Ok(v) = header::HeaderValue::from_str(&to) {
                    headers.push((header::LOCATION, v));
                }
                return Rendered {
                    status,
                    headers,
                    body: Bytes::from(pages::error(status, "Sign in to continue.", Some(&to))),
                };
            }
            (Self::Unauthenticated, Some(target)) => {
                headers.push(form_challenge());
                pages::error(
                    status,
                    "You are not signed in, or your session has ended. Sign in, then try again.",
                    Some(&pages::sign_in_url(target)),
                )
            }
            // An app reached by its own host name owns every path there, `/login` too, and a
            // session cookie is the host's alone: the browser's own prompt (Basic) is the way
            // to sign in on that host.
            (Self::Unauthenticated, None) => {
                headers.extend(self.extra_header());
                pages::error(
                    status,
                    "You are not signed in: give your name and password when your browser asks, then try again.",
                    None,
                )
            }
            _ => {
                headers.extend(self.extra_header());
                pages::error(status, &self.to_string(), None)
            }
        };
        Rendered {
            status,
            headers,
            body: Bytes::from(body),
        }
    }

    /// The response for a program: a JSON body `{"error": "..."}` and the headers the status
    /// calls for.
    pub fn into_response(self) -> Response<Body> {
        self.render(&Ask::API).into_response()
    }

    /// The response for `ask`: see [`Self::render`].
    pub(crate) fn respond(&self, ask: &Ask<'_>) -> Response<Body> {
        self.render(ask).into_response()
    }

    /// The same response as [`Self::respond`] (less the `Date` header hyper adds),
    /// written as HTTP/1.1 bytes to `out`, for the fast lane, which answers errors without
    /// building a response object.
    /// `close` adds `connection: close`, for a client that asked for it.
    pub(crate) fn write_http1(
        &self,
        ask: &Ask<'_>,
        head_only: bool,
        close: bool,
        out: &mut Vec<u8>,
    ) {
        let r = self.render(ask);
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(r.status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(r.status.canonical_reason().unwrap_or("").as_bytes());
        out.extend_from_slice(b"\r\n");
        for (name, value) in &r.headers {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        crate::date::write_header(out);
        out.extend_from_slice(format!("content-length: {}\r\n\r\n", r.body.len()).as_bytes());
        if !head_only {
            out.extend_from_slice(&r.body);
        }
    }
}

/// The content type of the answers a person reads.
const TEXT: &str = "text/plain; charset=utf-8";

impl GatewayError {
    /// Whether this error is answered to a program as plain text rather than JSON.
    fn plain_text(&self) -> bool {
        matches!(self, Self::AuditRefused { text: true, .. })
    }
}

/// A JSON response.
pub fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let mut resp = Response::new(full(Bytes::from(value.to_string() + "\n")));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// A body from bytes.
pub fn full(b: Bytes) -> Body {
    Full::new(b).map_err(|never| match never {}).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn the_lane_writes_the_same_error_responses_as_hyper() {
        let asks = [
            Ask::API,
            Ask::new(Some(b"text/html"), b"GET", Some("/apps/demo/x?y=1")),
            Ask::new(Some(b"text/html"), b"POST", Some("/apps/demo/x")),
            Ask::new(Some(b"text/html"), b"GET", None),
        ];
        for ask in asks {
            for e in [
                || GatewayError::Unauthenticated,
                || GatewayError::Throttled { retry_after: 7 },
                || GatewayError::StartTimeout {
                    app: "demo".into(),
                    ms: 500,
                },
                || GatewayError::Forbidden {
                    user: "dave".into(),
                    app: "admin \"x\"".into(),
                    groups: vec!["<b>".into()],
                },
            ] {
                same_on_both(&ask, e).await;
            }
        }
    }

    async fn same_on_both(ask: &Ask<'_>, e: fn() -> GatewayError) {
        let resp = e().respond(ask);
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        let mut want = format!(
            "HTTP/1.1 {} {}\r\n",
            parts.status.as_str(),
            parts.status.canonical_reason().unwrap_or("")
        );
        for (n, v) in &parts.headers {
            want += &format!("{}: {}\r\n", n, v.to_str().expect("ascii"));
        }
        // hyper adds the date as it writes the head; the lane writes its own before the
        // length. The second may turn between two calls, so the time itself is left out.
        want += "date: <now>\r\n";
        want += &format!("content-length: {}\r\n\r\n", body.len());
        let mut head = Vec::new();
        e().write_http1(ask, true, false, &mut head);
        let head = String::from_utf8(head).expect("utf-8");
        let dated: Vec<String> = head
            .split_inclusive("\r\n")
            .map(|l| match l.strip_prefix("date: ") {
                Some(v) => {
                    httpdate::parse_http_date(v.trim_end()).expect("an HTTP date");
                    "date: <now>\r\n".to_owned()
                }
                None => l.to_owned(),
            })
            .collect();
        assert_eq!(dated.concat(), want);
        let head = want.len() - "<now>".len() + 29;
        let mut whole = Vec::new();
        e().write_http1(ask, false, false, &mut whole);
        assert_eq!(&whole[head..], &body[..]);
    }

    #[test]
    fn browsers_get_pages_and_a_way_to_sign_in_and_programs_json() {
        let nav = Ask::new(
            Some(b"text/html,*/*;q=0.8"),
            b"GET",
            Some("/apps/demo/x?y=1"),
        );
        let r = GatewayError::Unauthenticated.render(&nav);
        assert_eq!(r.status, StatusCode::SEE_OTHER);
        let location = r.headers.iter().find(|(n, _)| n == header::LOCATION);
        assert_eq!(
            location.map(|(_, v)| v.to_str().unwrap()),
            Some("/login?next=/apps/demo/x%3Fy%3D1")
        );
        // A form sent without a session: a page, not a redirect that would drop its body.
        let post = Ask::new(Some(b"text/html"), b"POST", Some("/apps/demo/x"));
        let r = GatewayError::Unauthenticated.render(&post);
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        let challenge = r
            .headers
            .iter()
            .find(|(n, _)| n == header::WWW_AUTHENTICATE);
        assert!(!challenge.unwrap().1.to_str().unwrap().starts_with("Basic"));
        for accept in [
            None,
            Some(&b"application/json"[..]),
            Some(b"application/json, text/html;q=0.5"),
        ] {
            let r = GatewayError::Unauthenticated.render(&Ask::new(accept, b"GET", Some("/x")));
            assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{accept:?}");
            assert_eq!(r.headers[0].1, "application/json");
        }
        assert!(!wants_html(Some(b"text/html;q=0")));
        // An app on a host of its own owns /login there: the browser's prompt instead.
        let r = GatewayError::Unauthenticated.render(&Ask::new(Some(b"text/html"), b"GET", None));
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        let challenge = r
            .headers
            .iter()
            .find(|(n, _)| n == header::WWW_AUTHENTICATE);
        assert!(challenge.unwrap().1.to_str().unwrap().starts_with("Basic"));
        assert!(wants_html(Some(
            b"Text/HTML; q=0.9, application/json;q=0.8"
        )));
    }
}
