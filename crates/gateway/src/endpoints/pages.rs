//! The gateway's pages for people: sign-in, who am I, and errors. Each is one self-contained
//! HTML document (no script, no external resource, one inline style allowed by its hash) sent
//! with headers that forbid everything else ([`html_headers`]).
//!
//! Every value put into a page goes through [`escape_html`], here and nowhere else: a user
//! name, a `next`, a provider's label or an error message never reaches a browser as markup.

use std::fmt::Write as _;
use std::sync::LazyLock;

use base64::Engine;
use bytes::Bytes;
use http::{header, HeaderName, HeaderValue, Response, StatusCode};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};
use sha2::{Digest, Sha256};

use crate::config::SignInButton;
use crate::response::{self, Body};

/// The content type of every page.
pub(crate) const HTML: &str = "text/html; charset=utf-8";

/// The one style block of every page, allowed by its hash in the content security policy.
const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:28rem;margin:3rem auto;\
padding:0 1rem;color:#222}h1{font-size:1.4rem}label{display:block;margin:.6rem 0}\
input[type=text],input[type=password]{width:100%;padding:.4rem;box-sizing:border-box}\
button,a.button{display:inline-block;margin:.4rem 0;padding:.45rem 1rem}\
p.message{padding:.5rem;border-left:4px solid #b00;background:#fee}dt{font-weight:bold}";

/// Nothing but the page itself: no script, no frame, no plugin, no remote resource; forms go
/// only to this gateway.
static CSP: LazyLock<HeaderValue> = LazyLock::new(|| {
    let hash = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(STYLE));
    let policy = format!(
        "default-src 'none'; style-src 'sha256-{hash}'; form-action 'self'; \
         frame-ancestors 'none'; base-uri 'none'"
    );
    HeaderValue::from_str(&policy).unwrap_or(HeaderValue::from_static("default-src 'none'"))
});

/// The headers of every page, in the order both downstreams write them.
pub(crate) fn html_headers() -> [(HeaderName, HeaderValue); 6] {
    [
        (header::CONTENT_TYPE, HeaderValue::from_static(HTML)),
        (header::CONTENT_SECURITY_POLICY, CSP.clone()),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        // `same-origin`, not `no-referrer`: under `no-referrer` a browser sends
        // `Origin: null` with the page's own form POSTs (Fetch: serializing a request origin),
        // which the forms' origin check refuses. Other sites still get no referrer.
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
    ]
}

/// A page as a response, with [`html_headers`].
pub(crate) fn respond(status: StatusCode, html: String) -> Response<Body> {
    let mut resp = Response::new(response::full(Bytes::from(html)));
    *resp.status_mut() = status;
    for (name, value) in html_headers() {
        resp.headers_mut().insert(name, value);
    }
    resp
}

/// `text` with every character that means something in HTML (text or a quoted attribute)
/// written as a character reference.
pub fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// What is percent-encoded in a query value: all but letters, digits, `-._~` and `/`.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// `value` percent-encoded for a query string.
pub(crate) fn query_value(value: &str) -> String {
    percent_encoding::utf8_percent_encode(value, QUERY_VALUE).to_string()
}

/// The sign-in page's address that returns to `next`.
pub(crate) fn sign_in_url(next: &str) -> String {
    format!("/login?next={}", query_value(next))
}

/// A whole document: `title` (escaped here) and `main`, markup already escaped by its maker.
fn document(title: &str, main: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"referrer\" content=\"same-origin\">\
         <title>{title} · warden</title><style>{STYLE}</style></head>\
         <body><main>\n{main}\n</main></body></html>\n",
        title = escape_html(title),
    )
}

/// What the sign-in page shows.
pub(crate) struct SignIn<'a> {
    /// Where the browser goes after signing in (already checked by `safe_next`).
    pub next: &'a str,
    /// The CSRF field for the browser's CSRF cookie.
    pub csrf: &'a str,
    /// Why the page is shown again (a wrong password, a throttle), if it is.
    pub message: Option<&'a str>,
    /// A button per identity provider.
    pub providers: &'a [SignInButton],
    /// Whether names and passwords are taken.
    pub passwords: bool,
}

/// The sign-in page.
pub(crate) fn sign_in(p: &SignIn<'_>) -> String {
    let mut main = String::from("<h1>Sign in</h1>\n");
    if let Some(m) = p.message {
        let _ = writeln!(
            main,
            "<p class=\"message\" role=\"alert\">{}</p>",
            escape_html(m)
        );
    }
    if p.passwords {
        let _ = writeln!(
            main,
            "<form method=\"post\" action=\"/login\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <input type=\"hidden\" name=\"next\" value=\"{next}\">\
             <label>Name <input type=\"text\" name=\"name\" autocomplete=\"username\" required autofocus></label>\
             <label>Password <input type=\"password\" name=\"password\" autocomplete=\"current-password\" required></label>\
             <button type=\"submit\">Sign in</button></form>",
            csrf = escape_html(p.csrf),
            next = escape_html(p.next),
        );
    } else {
        main.push_str(
            "<p>Password sign-in is turned off on this gateway: sign in with your organisation's \
             identity provider.</p>\n",
        );
    }
    if !p.providers.is_empty() {
        main.push_str("<p>Or sign in with:</p>\n");
    }
    for b in p.providers {
        let href = format!(
            "/login/oidc/{}?next={}",
            query_value(&b.id),
            query_value(p.next)
        );
        let _ = writeln!(
            main,
            "<p><a class=\"button\" href=\"{}\">{}</a></p>",
            escape_html(&href),
            escape_html(&b.label)
        );
    }
    if !p.passwords && p.providers.is_empty() {
        main.push_str("<p>No identity provider is configured either: ask an operator.</p>\n");
    }
    document("Sign in", &main)
}

/// What the signed-in page shows.
pub(crate) struct WhoAmI<'a> {
    pub user: &'a str,
    pub clearance: &'a str,
    pub groups: &'a [String],
    /// The CSRF field for the sign-out form.
    pub csrf: &'a str,
}

/// The signed-in page: who, at which clearance, in which groups, and a sign-out button.
pub(crate) fn whoami(p: &WhoAmI<'_>) -> String {
    let groups = match p.groups.is_empty() {
        true => "none".to_owned(),
        false => p
            .groups
            .iter()
            .map(|g| escape_html(g))
            .collect::<Vec<_>>()
            .join(", "),
    };
    let main = format!(
        "<h1>Signed in</h1>\n<dl><dt>User</dt><dd id=\"user\">{user}</dd>\
         <dt>Clearance</dt><dd id=\"clearance\">{clearance}</dd>\
         <dt>Groups</dt><dd id=\"groups\">{groups}</dd></dl>\n\
         <form method=\"post\" action=\"/logout\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <button type=\"submit\">Sign out</button></form>\n",
        user = escape_html(p.user),
        clearance = escape_html(p.clearance),
        csrf = escape_html(p.csrf),
    );
    document("Signed in", &main)
}

/// An error page: the status, what happened, and a way on (`sign_in`: the sign-in page's
/// address to offer, for a refusal that signing in would lift).
pub(crate) fn error(status: StatusCode, message: &str, sign_in: Option<&str>) -> String {
    let title = format!(
        "{} {}",
        status.as_str(),
        status.canonical_reason().unwrap_or("Error")
    );
    let mut main = format!(
        "<h1>{}</h1>\n<p class=\"message\">{}</p>\n",
        escape_html(&title),
        escape_html(message)
    );
    match sign_in {
        Some(url) => {
            let _ = writeln!(main, "<p><a href=\"{}\">Sign in</a></p>", escape_html(url));
        }
        None => main.push_str("<p><a href=\"/whoami\">Who am I signed in as?</a></p>\n"),
    }
    document(&title, &main)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_is_escaped_everywhere() {
        assert_eq!(
            escape_html("<a href=\"x\" onclick='y'>&</a>"),
            "&lt;a href=&quot;x&quot; onclick=&#39;y&#39;&gt;&amp;&lt;/a&gt;"
        );
        let evil = "<script>alert(1)</script>\"'";
        let buttons = [SignInButton {
            id: evil.into(),
            label: evil.into(),
        }];
        let pages = [
            sign_in(&SignIn {
                next: evil,
                csrf: evil,
                message: Some(evil),
                providers: &buttons,
                passwords: true,
            }),
            whoami(&WhoAmI {
                user: evil,
                clearance: evil,
                groups: &[evil.to_owned()],
                csrf: evil,
            }),
            error(StatusCode::FORBIDDEN, evil, Some(evil)),
        ];
        for page in pages {
            assert!(!page.contains("<script>"), "{page}");
            assert!(!page.contains("\"'"), "{page}");
        }
    }

    #[test]
    fn each_provider_is_a_link_that_carries_next_and_no_password_form_when_off() {
        let buttons = [SignInButton {
            id: "corp".into(),
            label: "Corp SSO".into(),
        }];
        let page = sign_in(&SignIn {
            next: "/apps/demo/?a=1",
            csrf: "f",
            message: None,
            providers: &buttons,
            passwords: false,
        });
        assert!(
            page.contains("<a class=\"button\" href=\"/login/oidc/corp?next=/apps/demo/%3Fa%3D1\">Corp SSO</a>"),
            "{page}"
        );
        assert!(!page.contains("type=\"password\""), "{page}");
        assert!(page.contains("Password sign-in is turned off"), "{page}");
    }

    #[test]
    fn the_policy_allows_the_style_and_nothing_else() {
        let csp = CSP.to_str().unwrap().to_owned();
        assert!(
            csp.starts_with("default-src 'none'; style-src 'sha256-"),
            "{csp}"
        );
        assert!(!csp.contains("unsafe"), "{csp}");
        assert_eq!(
            sign_in_url("/apps/a b?x=1&y"),
            "/login?next=/apps/a%20b%3Fx%3D1%26y"
        );
    }
}
