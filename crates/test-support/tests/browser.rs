//! The WebDriver client against a page served here: a form typed into and submitted, the
//! page it leads to read back, a cookie the server set seen by the browser.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use warden_test_support::browser::Browser;

/// Serves two pages over a real socket: `/` with a form, `/done?...` echoing the query and
/// setting a cookie.
fn serve() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().take(20) {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 8192];
            let n = s.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]).into_owned();
            let path = req.split(' ').nth(1).unwrap_or("/").to_owned();
            let (extra, body) = if let Some(q) = path.strip_prefix("/done?") {
                (
                    "set-cookie: seen=yes; Path=/; HttpOnly\r\n",
                    format!("<p id=got>{}</p>", q.replace('<', "&lt;")),
                )
            } else {
                (
                    "",
                    "<form action=/done method=get><input name=who><button id=go>Go</button></form>"
                        .to_owned(),
                )
            };
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("http://{addr}")
}

#[test]
fn a_form_is_typed_into_submitted_and_its_answer_read() {
    let base = serve();
    let b = Browser::start();
    b.goto(&format!("{base}/"));
    let who = b.find("input[name=who]");
    b.type_into(&who, "alice");
    b.click(&b.find("#go"));
    b.wait_for("the answer page", Duration::from_secs(10), |b| {
        b.url().contains("/done")
    });
    assert_eq!(b.text_of(&b.find("#got")), "who=alice");
    assert!(b.try_find("#missing").is_none());
    let cookies = b.cookies();
    assert!(
        cookies
            .iter()
            .any(|c| c["name"] == "seen" && c["httpOnly"] == true),
        "{cookies:?}"
    );
}
