//! A real OpenID provider for tests (panva's certified `oidc-provider`, `tests/oidc-provider/`)
//! and a small browser that signs in through the gateway with it.
//!
//! The provider's npm packages are installed once per target dir (`npm ci` into
//! `<target>/oidc-provider/`, behind a file lock, so parallel tests install once), from the
//! committed lock file.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::http::{request, Response};

/// The provider's sources in the repository.
fn sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/oidc-provider")
}

/// `<target>/oidc-provider`: beside the test binaries' `debug` dir.
fn cache_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // <target>/debug/deps/<test binary>
    let target = exe
        .ancestors()
        .nth(3)
        .expect("test binary under <target>/<profile>/deps");
    target.join("oidc-provider")
}

/// Installs the provider's packages into the cache dir once (again when the lock changes).
fn install() -> PathBuf {
    let dir = cache_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let lock = nix::fcntl::Flock::lock(
        File::create(dir.join(".install-lock")).unwrap(),
        nix::fcntl::FlockArg::LockExclusive,
    )
    .map_err(|(_, e)| e)
    .expect("lock the provider's install");
    let src = sources();
    let lock_text = std::fs::read(src.join("package-lock.json")).expect("package-lock.json");
    let stamp = dir.join(".installed");
    for f in ["package.json", "package-lock.json", "provider.js"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    if std::fs::read(&stamp).ok().as_deref() != Some(&lock_text[..]) {
        let out = Command::new("npm")
            .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .output()
            .expect("npm runs (install nodejs and npm)");
        assert!(
            out.status.success(),
            "npm ci failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(&stamp, &lock_text).unwrap();
    }
    drop(lock);
    dir
}

/// One person the provider knows.
#[derive(Debug, Clone)]
pub struct Person {
    pub name: String,
    pub password: String,
    pub groups: Vec<String>,
    /// The `preferred_username` the provider gives, when not the login name (which is `sub`).
    pub username: Option<String>,
}

impl Person {
    pub fn new(name: &str, password: &str, groups: &[&str]) -> Self {
        Self {
            name: name.into(),
            password: password.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            username: None,
        }
    }

    /// The same person with `preferred_username` = `username` (chosen at the provider).
    pub fn with_username(mut self, username: &str) -> Self {
        self.username = Some(username.into());
        self
    }
}

/// Token lifetimes the provider gives, in seconds.
#[derive(Debug, Clone, Copy)]
pub struct Ttls {
    pub id_token: u64,
    pub access_token: u64,
    /// 0: the provider issues no refresh token.
    pub refresh_token: u64,
}

impl Default for Ttls {
    fn default() -> Self {
        Self {
            id_token: 300,
            access_token: 300,
            refresh_token: 3600,
        }
    }
}

/// A running provider; killed on drop.
pub struct OidcProvider {
    child: Child,
    /// Its issuer, `http://127.0.0.1:PORT`.
    pub issuer: String,
    users: tempfile::NamedTempFile,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl OidcProvider {
    /// Starts a provider that knows `people`.
    pub fn start(people: &[Person], ttls: Ttls) -> Self {
        let dir = install();
        let users = tempfile::NamedTempFile::new().unwrap();
        write_people(users.path(), people);
        let mut child = Command::new("node")
            .arg(dir.join("provider.js"))
            .arg("--users")
            .arg(users.path())
            .args(["--id-ttl", &ttls.id_token.to_string()])
            .args(["--access-ttl", &ttls.access_token.to_string()])
            .args(["--refresh-ttl", &ttls.refresh_token.to_string()])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("node runs (install nodejs)");
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if let Some(issuer) = line.strip_prefix("listening ") {
                    let _ = tx.send(issuer.to_owned());
                }
            }
        });
        let stderr = crate::capture(child.stderr.take().unwrap());
        let issuer = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(i) => i,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "the OIDC provider did not start: {}",
                    stderr.lock().unwrap()
                );
            }
        };
        let p = Self {
            child,
            issuer,
            users,
            stderr,
        };
        crate::wait_until("the provider's discovery", Duration::from_secs(30), || {
            (p.get("/.well-known/openid-configuration").status == 200).then_some(())
        });
        p
    }

    fn get(&self, path: &str) -> Response {
        request("GET", &format!("{}{path}", self.issuer), &[], b"")
    }

    fn admin(&self, path: &str, body: serde_json::Value) -> Response {
        let r = request(
            "POST",
            &format!("{}{path}", self.issuer),
            &[("content-type", "application/json")],
            body.to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{path}: {} {}", r.text(), self.stderr());
        r
    }

    /// Registers warden's client.
    pub fn register(&self, client_id: &str, secret: &str, redirect: &str) {
        self.admin(
            "/admin/client",
            serde_json::json!({ "client_id": client_id, "client_secret": secret, "redirect_uris": [redirect] }),
        );
    }

    /// Registers warden's client with several redirect URLs (the gateway's and the
    /// dashboard's callbacks).
    pub fn register_redirects(&self, client_id: &str, secret: &str, redirects: &[&str]) {
        self.admin(
            "/admin/client",
            serde_json::json!({ "client_id": client_id, "client_secret": secret, "redirect_uris": redirects }),
        );
    }

    /// A new signing key (the old one is no longer published); its kid.
    pub fn rotate(&self) -> String {
        self.admin("/admin/rotate", serde_json::json!({})).json()["kid"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The next token answer's ID token re-signed with a wrong `aud` ("aud"), a past `exp`
    /// ("exp") or an unpublished key ("key").
    pub fn tamper(&self, kind: &str) {
        self.admin("/admin/tamper", serde_json::json!({ "kind": kind }));
    }

    /// Replaces the people the provider knows (read again at each login and refresh).
    pub fn set_people(&self, people: &[Person]) {
        write_people(self.users.path(), people);
    }

    /// What the provider wrote to stderr.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for OidcProvider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_people(path: &Path, people: &[Person]) {
    let list: Vec<serde_json::Value> = people
        .iter()
        .map(|p| serde_json::json!({ "name": p.name, "password": p.password, "groups": p.groups, "username": p.username }))
        .collect();
    // Written whole then renamed: the provider never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(&list).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A browser enough for sign-ins: a cookie jar per host, redirects followed.
#[derive(Default)]
pub struct Browser {
    jar: HashMap<String, HashMap<String, String>>,
}

/// `(host:port, path)` of an `http://` URL.
fn host_path(url: &str) -> (String, String) {
    let rest = url.strip_prefix("http://").expect("http:// URL");
    match rest.find('/') {
        Some(i) => (rest[..i].to_owned(), rest[i..].to_owned()),
        None => (rest.to_owned(), "/".to_owned()),
    }
}

impl Browser {
    pub fn new() -> Self {
        Self::default()
    }

    /// The cookie `name` this browser holds for `host`.
    pub fn cookie(&self, host: &str, name: &str) -> Option<String> {
        self.jar.get(host)?.get(name).cloned()
    }

    /// Sets (or with `None` removes) a cookie for `host`.
    pub fn set_cookie(&mut self, host: &str, name: &str, value: Option<&str>) {
        let c = self.jar.entry(host.to_owned()).or_default();
        match value {
            Some(v) => c.insert(name.to_owned(), v.to_owned()),
            None => c.remove(name),
        };
    }

    /// One request with this browser's cookies; the cookies it sets are kept.
    pub fn send(&mut self, method: &str, url: &str, form: Option<&str>) -> Response {
        let (host, _) = host_path(url);
        let cookies = self
            .jar
            .get(&host)
            .map(|c| {
                c.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default();
        let mut headers = vec![("accept", "text/html")];
        if !cookies.is_empty() {
            headers.push(("cookie", &cookies));
        }
        if form.is_some() {
            headers.push(("content-type", "application/x-www-form-urlencoded"));
        }
        let r = request(method, url, &headers, form.unwrap_or("").as_bytes());
        for (n, v) in &r.headers {
            if !n.eq_ignore_ascii_case("set-cookie") {
                continue;
            }
            let first = v.split(';').next().unwrap_or("");
            let Some((name, value)) = first.split_once('=') else {
                continue;
            };
            let expired = v.to_ascii_lowercase().contains("max-age=0");
            self.set_cookie(&host, name.trim(), (!expired).then_some(value.trim()));
        }
        r
    }

    /// GETs `url` and follows redirects (at most 10) across hosts; the last response and its URL.
    pub fn follow(&mut self, url: &str) -> (Response, String) {
        let mut url = url.to_owned();
        for _ in 0..10 {
            let r = self.send("GET", &url, None);
            if !(300..400).contains(&r.status) {
                return (r, url);
            }
            url = resolve(
                &url,
                r.header("location").expect("a redirect has a Location"),
            );
        }
        panic!("more than 10 redirects from {url}");
    }

    /// Signs in at `gateway` through provider `id` as `who`: the start, the provider's login
    /// form, and the redirects back. Returns the last response and its URL.
    pub fn sign_in(
        &mut self,
        gateway: &str,
        id: &str,
        next: &str,
        who: &Person,
    ) -> (Response, String) {
        let start = format!("{gateway}/login/oidc/{id}?next={next}");
        let (page, url) = self.follow(&start);
        assert_eq!(
            page.status,
            200,
            "the provider's login page: {}",
            page.text()
        );
        assert!(url.contains("/interaction/"), "{url}");
        let action = resolve(&url, &format!("{}/login", host_path(&url).1));
        let form = format!("login={}&password={}", who.name, who.password);
        let r = self.send("POST", &action, Some(&form));
        if !(300..400).contains(&r.status) {
            return (r, action);
        }
        let next = resolve(&action, r.header("location").unwrap());
        self.follow(&next)
    }

    /// Like [`Self::sign_in`], but stops at the callback URL (the provider's redirect to a
    /// gateway) without visiting it.
    pub fn sign_in_until_callback(
        &mut self,
        gateway: &str,
        id: &str,
        next: &str,
        who: &Person,
    ) -> String {
        let start = format!("{gateway}/login/oidc/{id}?next={next}");
        let (_, url) = self.follow(&start);
        let action = resolve(&url, &format!("{}/login", host_path(&url).1));
        let form = format!("login={}&password={}", who.name, who.password);
        let mut r = self.send("POST", &action, Some(&form));
        let mut at = action;
        let callback = format!("/login/oidc/{id}/callback?");
        for _ in 0..10 {
            let loc = resolve(&at, r.header("location").expect("a redirect"));
            // The registered redirect URL: on a cluster, maybe another gateway than `gateway`.
            if loc.contains(&callback) {
                return loc;
            }
            at = loc;
            r = self.send("GET", &at, None);
        }
        panic!("the provider never sent the browser back to {gateway}");
    }
}

/// The `value` of the hidden form field `name` in `html` (the provider's own pages).
fn hidden_field(html: &str, name: &str) -> Option<String> {
    let at = html.find(&format!("name=\"{name}\""))?;
    let rest = &html[at..];
    let v = rest.find("value=\"")? + "value=\"".len();
    let end = rest[v..].find('"')?;
    Some(rest[v..v + end].to_owned())
}

impl Browser {
    /// Approves a device sign-in (RFC 8628) as `who` on the provider's pages: GET the
    /// verification URI, POST the user code (then its confirmation), sign in on the
    /// interaction form, follow the redirects. Returns the last response (the provider's
    /// success page when it worked) and its URL.
    pub fn approve_device(
        &mut self,
        verification_uri: &str,
        user_code: &str,
        who: &Person,
    ) -> (Response, String) {
        let page = self.send("GET", verification_uri, None);
        assert_eq!(page.status, 200, "the device page: {}", page.text());
        let xsrf = hidden_field(&page.text(), "xsrf").expect("the device page's xsrf field");
        let code = format!("xsrf={xsrf}&user_code={user_code}");
        let confirm = self.send("POST", verification_uri, Some(&code));
        assert_eq!(
            confirm.status,
            200,
            "the confirmation page: {}",
            confirm.text()
        );
        let r = self.send(
            "POST",
            verification_uri,
            Some(&format!("{code}&confirm=yes")),
        );
        assert!(
            (300..400).contains(&r.status),
            "the confirmation leads to the sign-in: {} {}",
            r.status,
            r.text()
        );
        let (login, url) = self.follow(&resolve(verification_uri, r.header("location").unwrap()));
        assert_eq!(
            login.status,
            200,
            "the provider's login page: {}",
            login.text()
        );
        assert!(url.contains("/interaction/"), "{url}");
        let action = resolve(&url, &format!("{}/login", host_path(&url).1));
        let form = format!("login={}&password={}", who.name, who.password);
        let r = self.send("POST", &action, Some(&form));
        if !(300..400).contains(&r.status) {
            return (r, action);
        }
        let next = resolve(&action, r.header("location").unwrap());
        self.follow(&next)
    }
}

/// `location` resolved against `base` (absolute, or a path on `base`'s host).
fn resolve(base: &str, location: &str) -> String {
    if location.starts_with("http://") {
        return location.to_owned();
    }
    let (host, _) = host_path(base);
    format!("http://{host}{location}")
}
