//! Headless Chromium driven over W3C WebDriver (Debian's `chromium` and `chromium-driver`,
//! which `.ci/run` installs), for tests of what a browser shows and does: pages, forms,
//! cookies, redirects, as a person's browser would meet them.
//!
//! Written on the blocking client of [`crate::http`] rather than taken from a crate
//! (fantoccini, thirtyfour): the suite's tests are blocking, and the handful of WebDriver
//! commands they use are one JSON request each; an async client would bring a runtime into
//! every browser test for nothing.
//!
//! Chromium runs headless, with a fresh profile, and without the background connections it
//! would otherwise make (this machine's network is closed to them). Dropping the [`Browser`]
//! ends the WebDriver session and kills chromedriver's process group, Chromium with it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http;

/// The key under which WebDriver names an element (W3C WebDriver §12.1).
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The Chromium and chromedriver programs, Debian's by default.
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// One headless Chromium with its own profile, driven through its own chromedriver.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    _profile: tempfile::TempDir,
}

/// An element of the current page.
#[derive(Debug, Clone)]
pub struct Element(String);

impl Browser {
    /// Starts chromedriver and a headless Chromium. Panics, saying what to install, when
    /// either is missing: a browser test never passes by not running.
    pub fn start() -> Self {
        for program in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                std::path::Path::new(program).exists(),
                "{program} is missing: install Debian's chromium and chromium-driver (.ci/run does)"
            );
        }
        let (driver, port) = start_driver();
        let base = format!("http://127.0.0.1:{port}");
        let profile = tempfile::tempdir().expect("a profile dir");
        let args = [
            "--headless=new".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-quic".to_owned(),
            "--no-first-run".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
        }}});
        let mut b = Self {
            driver,
            base,
            session: String::new(),
            _profile: profile,
        };
        let v = b.command("POST", "/session", Some(caps));
        b.session = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id from chromedriver: {v}"))
            .to_owned();
        b
    }

    /// Opens `url` and waits for the page to load (WebDriver's default page-load strategy).
    pub fn goto(&self, url: &str) {
        self.session_command("POST", "/url", Some(json!({ "url": url })));
    }

    /// The URL the browser shows now (after every redirect it followed).
    pub fn url(&self) -> String {
        self.session_command("GET", "/url", None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The page's HTML as the browser holds it.
    pub fn source(&self) -> String {
        self.session_command("GET", "/source", None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The text the page shows (its `body`'s rendered text). A page that navigates or is
    /// replaced between finding its body and reading it leaves a stale element: found again,
    /// a bounded number of times.
    pub fn text(&self) -> String {
        for _ in 0..50 {
            let Some(body) = self.try_find("body") else {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            };
            let path = format!("/session/{}/element/{}/text", self.session, body.0);
            let r = self.raw("GET", &path, None);
            if (200..300).contains(&r.status) {
                return value_of(&r).as_str().unwrap_or_default().to_owned();
            }
            if !r.text().contains("stale element") {
                panic!("WebDriver GET {path}: {} {}", r.status, r.text());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the page's body stayed stale for 5 s at {}", self.url());
    }

    /// The first element matching the CSS `selector`; panics with the page when there is none.
    pub fn find(&self, selector: &str) -> Element {
        self.try_find(selector).unwrap_or_else(|| {
            panic!(
                "no element {selector:?} at {}: {}",
                self.url(),
                self.source()
            )
        })
    }

    /// The first element matching the CSS `selector`, if any.
    pub fn try_find(&self, selector: &str) -> Option<Element> {
        let body = json!({ "using": "css selector", "value": selector });
        let r = self.raw(
            "POST",
            &format!("/session/{}/element", self.session),
            Some(body),
        );
        if r.status == 404 {
            return None;
        }
        let v = value_of(&r);
        Some(Element(
            v[ELEMENT]
                .as_str()
                .unwrap_or_else(|| panic!("no element id in {v}"))
                .to_owned(),
        ))
    }

    /// Types `text` into the element (which is focused first).
    pub fn type_into(&self, e: &Element, text: &str) {
        self.session_command(
            "POST",
            &format!("/element/{}/value", e.0),
            Some(json!({ "text": text })),
        );
    }

    /// Clicks the element, and waits for a navigation it starts to load.
    pub fn click(&self, e: &Element) {
        self.session_command("POST", &format!("/element/{}/click", e.0), Some(json!({})));
    }

    /// The element's rendered text.
    pub fn text_of(&self, e: &Element) -> String {
        self.session_command("GET", &format!("/element/{}/text", e.0), None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The cookies the browser holds for the current page, as WebDriver gives them (name,
    /// value, httpOnly, secure, sameSite…).
    pub fn cookies(&self) -> Vec<Value> {
        self.session_command("GET", "/cookie", None)
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Runs `script` (a function body; `return` gives its value) in the page and returns its
    /// value: to leave a mark on the page that only a reload would wipe.
    pub fn execute(&self, script: &str) -> Value {
        self.session_command(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
    }

    /// Waits until `f` holds of the browser, up to `limit`; panics with the page otherwise.
    pub fn wait_for(&self, what: &str, limit: Duration, mut f: impl FnMut(&Self) -> bool) {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if f(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "{what}: not within {limit:?}; at {}: {}",
            self.url(),
            self.text()
        );
    }

    fn session_command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.command(method, &format!("/session/{}{path}", self.session), body)
    }

    fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let r = self.raw(method, path, body);
        assert!(
            (200..300).contains(&r.status),
            "WebDriver {method} {path}: {} {}",
            r.status,
            r.text()
        );
        value_of(&r)
    }

    fn raw(&self, method: &str, path: &str, body: Option<Value>) -> http::Response {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let host = self.base.trim_start_matches("http://");
        let mut wire = format!(
            "{method} {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        wire.extend_from_slice(body.as_bytes());
        exchange(host, &wire)
    }
}

/// One request to chromedriver, its answer read to its `content-length`: chromedriver keeps
/// the connection open whatever the request says, so reading to the end would wait forever.
fn exchange(host: &str, wire: &[u8]) -> http::Response {
    let mut s = TcpStream::connect(host).unwrap_or_else(|e| panic!("connect {host}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s.write_all(wire).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            if let Some(len) = len {
                if buf.len() >= end + 4 + len {
                    buf.truncate(end + 4 + len);
                    break;
                }
            }
        }
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => panic!("reading from chromedriver at {host}: {e}"),
        }
    }
    http::parse_response(&buf)
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.raw("DELETE", &format!("/session/{}", self.session), None)
            }));
        }
        // chromedriver leads its own group; Chromium and its helpers are in it.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.driver.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.driver.wait();
    }
}

/// The `value` of a WebDriver answer.
fn value_of(r: &http::Response) -> Value {
    let v: Value = serde_json::from_slice(&r.body)
        .unwrap_or_else(|e| panic!("WebDriver answer is not JSON ({e}): {}", r.text()));
    v.get("value").cloned().unwrap_or(Value::Null)
}

/// How many times chromedriver is started before a test gives up: see [`start_driver`].
const DRIVER_STARTS: usize = 10;

/// Starts chromedriver on a port it picks; returns it and the port.
///
/// For `--port=0` chromedriver binds `[::1]:0` first and then `127.0.0.1` on the port that
/// gave it, and exits ("IPv4 port not available") when another process holds that IPv4
/// port: the two address families' ports are taken independently. With the suite's hundreds
/// of loopback sockets that happens now and then (CI saw chromedriver exit before saying its
/// port). So a chromedriver that exits before it listens is started again, with a new port
/// each time, a bounded number of times; what each one said is in the panic if none listens.
/// This is the test's own tool starting, not a behaviour under test.
fn start_driver() -> (Child, u16) {
    let mut exits = Vec::new();
    for _ in 0..DRIVER_STARTS {
        let mut driver = Command::new(CHROMEDRIVER)
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start chromedriver");
        match driver_port(&mut driver) {
            Ok(port) => return (driver, port),
            Err(said) => {
                let status = driver.wait();
                eprintln!("chromedriver exited ({status:?}) before it listened: {said:?}");
                exits.push(format!("{status:?}: {}", said.join(" | ")));
            }
        }
    }
    panic!("chromedriver exited before it listened in each of {DRIVER_STARTS} starts: {exits:#?}");
}

/// The port chromedriver says it listens on, or every line it wrote before it exited.
fn driver_port(driver: &mut Child) -> Result<u16, Vec<String>> {
    let out = driver.stdout.take().expect("chromedriver's stdout");
    let mut lines = BufReader::new(out).lines();
    let mut said = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("read chromedriver's stdout");
        if let Some(rest) = line.split("started successfully on port ").nth(1) {
            let port = rest.trim_end_matches('.').trim().parse().expect("a port");
            // Keep reading its output so chromedriver never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            return Ok(port);
        }
        said.push(line);
    }
    Err(said)
}
