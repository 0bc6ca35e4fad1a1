//! One table per direction: every header a client or an app could send under a name the
//! gateway owns, and what becomes of it.

use super::*;

/// What becomes of a header on its way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// It arrives as it was sent.
    Kept,
    /// It does not arrive.
    Dropped,
    /// The gateway's own value arrives under that name instead.
    Replaced(&'static str),
}

use Fate::*;

/// Request headers, each sent alone beside a plain request.
const REQUEST: &[(&str, &str, Fate)] = &[
    ("Authorization", "Basic eDp5", Dropped),
    ("authorization", "Bearer tok", Dropped),
    ("Proxy-Authorization", "Basic eDp5", Dropped),
    ("Proxy_Authorization", "Basic eDp5", Dropped),
    ("Proxy", "http://evil.example:3128", Dropped),
    ("Transfer_Encoding", "chunked", Dropped),
    ("Cookie", "warden_session=tok", Dropped),
    (
        "COOKIE",
        "a=1; warden_session=tok; b=2",
        Replaced("a=1; b=2"),
    ),
    ("Cookie", "a=1; WARDEN_Session=tok", Replaced("a=1")),
    ("Cookie", "warden_csrf=c; a=1", Replaced("a=1")),
    ("Cookie", "a=1; Warden_CSRF=c", Replaced("a=1")),
    ("Cookie", "warden_ui=tok; a=1", Replaced("a=1")),
    ("Cookie", "a=1; WARDEN_UI_CSRF=c", Replaced("a=1")),
    ("Cookie", "warden_ui_oidc=b; a=1", Replaced("a=1")),
    ("X-Warden-User", "mallory", Replaced("alice")),
    ("x_warden_user", "mallory", Dropped),
    ("X-WARDEN-LABEL", "TOP SECRET", Replaced("SECRET")),
    ("x-warden_label", "TOP SECRET", Dropped),
    ("X-Warden-Taint", "UNCLASSIFIED", Dropped),
    // Replaced by the placeholder that the upstream side fills in for each instance.
    (
        "x-warden-signature",
        "forged",
        Replaced("v1=0000000000000000000000000000000000000000000000000000000000000000"),
    ),
    ("X-Forwarded-For", "1.2.3.4", Replaced("127.0.0.1")),
    ("X_Forwarded_For", "1.2.3.4", Dropped),
    ("x-forwarded-proto", "https", Replaced("http")),
    ("X-Forwarded-Host", "evil.example", Replaced("a")),
    ("X-Forwarded-Prefix", "/evil", Replaced("/apps/demo")),
    ("X-Forwarded-Port", "1", Dropped),
    (
        "Forwarded",
        "for=1.2.3.4",
        Replaced("for=127.0.0.1;host=\"a\";proto=http"),
    ),
    ("X-Real-IP", "1.2.3.4", Dropped),
    ("x_real_ip", "1.2.3.4", Dropped),
    ("Connection", "keep-alive", Dropped),
    ("Keep-Alive", "timeout=5", Dropped),
    ("TE", "trailers", Dropped),
    ("Trailer", "x-t", Dropped),
    ("Upgrade", "h2c", Dropped),
    ("Transfer-Encoding", "chunked", Dropped),
    ("Content-Length", "2", Kept),
    ("X-App", "y", Kept),
    ("Accept", "*/*", Kept),
    ("X-Forwardedfor", "1", Dropped),
    ("X-Original-Forwarded-For", "1.2.3.4", Dropped),
    ("True-Client-IP", "1.2.3.4", Dropped),
    ("CF-Connecting-IP", "1.2.3.4", Dropped),
    ("cf-connecting-ipv6", "::2", Dropped),
    ("X-Client-IP", "1.2.3.4", Dropped),
    ("X-Cluster-Client-IP", "1.2.3.4", Dropped),
    ("Fastly-Client-IP", "1.2.3.4", Dropped),
    ("X_Originating_IP", "1.2.3.4", Dropped),
    ("Client-Ip", "1.2.3.4", Dropped),
    ("WL-Proxy-Client-IP", "1.2.3.4", Dropped),
    ("X-Remote-Addr", "1.2.3.4", Dropped),
    ("X-Envoy-External-Address", "1.2.3.4", Dropped),
    ("X-Host", "evil.example", Dropped),
    ("X-Url-Scheme", "https", Dropped),
    ("X_Scheme", "https", Dropped),
    ("Front-End-Https", "on", Dropped),
    ("X-Zip", "1", Kept),
    ("X-Tip", "1", Kept),
    ("X-Ipsum", "1", Kept),
];

/// Response headers, each returned alone beside a plain response.
const RESPONSE: &[(&str, &str, Fate)] = &[
    ("X-Warden-Taint", "SECRET", Dropped),
    ("x-warden-taint", "TOP SECRET", Dropped),
    ("Connection", "close", Dropped),
    ("Keep-Alive", "timeout=5", Dropped),
    ("Proxy-Authenticate", "Basic", Dropped),
    ("Trailer", "x-t", Dropped),
    ("Upgrade", "h2c", Dropped),
    ("Transfer-Encoding", "chunked", Kept),
    ("Content-Length", "5", Kept),
    ("Set-Cookie", "a=1", Kept),
    ("Set-Cookie", "a=1; Path=/; HttpOnly", Kept),
    ("Set-Cookie", "warden_sessions=1", Kept),
    ("Set-Cookie", "warden_session=dave-token; Path=/", Dropped),
    ("Set-Cookie", "warden_ui=dave-token; Path=/ui", Dropped),
    (
        "Set-Cookie",
        "Warden_UI_OIDC=planted; Path=/ui/login/oidc/",
        Dropped,
    ),
    ("set-cookie", "WARDEN_SESSION=x", Dropped),
    ("SET-COOKIE", " Warden_Session =x; Max-Age=0", Dropped),
    ("Set-Cookie", "warden_session", Dropped),
    // Nameless cookies: a browser sends the value back alone, as `warden_session=x`.
    ("Set-Cookie", "=warden_session=x", Dropped),
    ("Set-Cookie", " \t= Warden_Session=x; Path=/", Dropped),
    ("Set-Cookie", "=warden_sessions=x", Kept),
    ("Set-Cookie", "=a=1", Kept),
    // A browser ignores a cookie with a control character: nothing to pass on.
    ("Set-Cookie", "a=1\x01", Dropped),
    ("Set-Cookie", "a=1;\tPath=/", Kept),
    ("Set-Cookie", "warden_csrf=planted; Path=/login", Dropped),
    ("Set-Cookie", "=warden_csrf=planted", Dropped),
    ("Set-Cookie", "warden_csrfs=1", Kept),
    (
        "Set-Cookie",
        "warden_oidc=planted; Path=/login/oidc/",
        Dropped,
    ),
    ("Service-Worker-Allowed", "/", Dropped),
    ("service-worker-allowed", "/apps/", Dropped),
    ("Clear-Site-Data", "\"cookies\"", Dropped),
    ("clear-site-data", "\"cache\"", Dropped),
    ("Clear-Site-Data", "*", Dropped),
    ("Set-Cookie2", "a=1; Version=1", Dropped),
    ("X-App", "y", Kept),
];

fn request(extra: &[(&str, &str)], reframed: Option<usize>) -> String {
    let mut headers: Vec<(&[u8], &[u8])> = vec![(b"Host", b"a")];
    headers.extend(extra.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
    let mut out = Vec::new();
    write_request(
        &mut out,
        b"POST",
        b"/p",
        headers.iter().copied(),
        reframed,
        &Identity {
            user: "alice",
            label: "SECRET",
            client: "127.0.0.1",
            https: false,
            host: "a",
            prefix: "/apps/demo",
        },
        b"hi",
    );
    String::from_utf8(out).expect("text")
}

/// The values the app gets under `name`, in any case.
fn values_of<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.split("\r\n")
        .filter_map(|l| l.split_once(": "))
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
        .collect()
}

#[test]
fn every_header_the_gateway_owns_is_its_own_in_both_directions() {
    for &(name, value, fate) in REQUEST {
        let text = request(&[(name, value)], None);
        let got = values_of(&text, name);
        let want: Vec<&str> = match fate {
            Kept => vec![value],
            Dropped => vec![],
            Replaced(v) => vec![v],
        };
        assert_eq!(got, want, "request header {name}: {value}\n{text}");
    }
    for &(name, value, fate) in RESPONSE {
        let headers = [(name.as_bytes(), value.as_bytes())];
        let framing = ResponseFraming::of(headers.iter().copied());
        let dropped = response_drops(name.as_bytes(), value.as_bytes(), &framing);
        assert_eq!(dropped, fate == Dropped, "response header {name}: {value}");
    }
}

#[test]
fn headers_named_by_connection_stay_behind_but_never_the_framing() {
    let text = request(&[("Connection", "x-hop, close"), ("X-Hop", "1")], None);
    assert!(values_of(&text, "x-hop").is_empty(), "{text}");

    let headers: [(&[u8], &[u8]); 4] = [
        (b"Connection", b"content-length, x-a"),
        (b"Content-Length", b"5"),
        (b"X-A", b"1"),
        (b"X-B", b"2"),
    ];
    let framing = ResponseFraming::of(headers.iter().copied());
    assert!(response_drops(b"x-a", b"1", &framing));
    assert!(!response_drops(b"content-length", b"5", &framing));
    assert!(!response_drops(b"x-b", b"2", &framing));

    // With a transfer coding, a content-length means nothing and is not passed on.
    let chunked: [(&[u8], &[u8]); 2] = [
        (b"Transfer-Encoding", b"chunked"),
        (b"Content-Length", b"9"),
    ];
    let framing = ResponseFraming::of(chunked.iter().copied());
    assert!(response_drops(b"Content-Length", b"9", &framing));
}

#[test]
fn a_body_the_gateway_frames_gets_its_length_and_no_other() {
    let text = request(
        &[("Content-Length", "7"), ("Transfer-Encoding", "chunked")],
        Some(2),
    );
    assert_eq!(values_of(&text, "content-length"), vec!["2"], "{text}");
    assert!(values_of(&text, "transfer-encoding").is_empty());
    assert!(text.ends_with("\r\n\r\nhi"));
}

#[test]
fn identity_values_that_could_split_a_header_are_left_out() {
    let mut out = Vec::new();
    write_request(
        &mut out,
        b"GET",
        b"/",
        std::iter::empty(),
        None,
        &Identity {
            user: "a\r\nx-evil: 1",
            label: "SECRET",
            client: "::1",
            https: true,
            host: "b\"; for=evil",
            prefix: "",
        },
        b"",
    );
    let text = String::from_utf8(out).expect("text");
    assert!(!text.contains("x-evil"), "{text}");
    assert!(values_of(&text, "x-warden-user").is_empty());
    assert_eq!(values_of(&text, "x-forwarded-proto"), vec!["https"]);
    // A host that would break out of its quotes is left out, with no prefix for a host route.
    assert_eq!(
        values_of(&text, "forwarded"),
        vec!["for=\"[::1]\";proto=https"]
    );
    assert!(values_of(&text, "x-forwarded-host").is_empty());
    assert!(values_of(&text, "x-forwarded-prefix").is_empty());
}
