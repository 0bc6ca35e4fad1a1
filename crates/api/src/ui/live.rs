//! The dashboard's live part: `/ui/live.js` and `/ui/events`, a server-sent event stream that
//! says "change" when apps, instances or nodes change in the store, and, for an app's page
//! (`?app=NAME`), when the output of its newest release grows (its log file on this node).
//!
//! Each stream follows the store ([`warden_store::Follower`], the one way every role keeps up
//! with it) only while a browser listens: nothing runs when nobody looks. A stream that names
//! its page (`?page=/ui/...`) renders that page as its browser would get it on each change and
//! says "change" only when the page differs from the last it said so for (a SHA-256 of the
//! rendered page): node records change every second, and a page that does not show what
//! changed is left alone. Changes are paced to at most one render and one event per [`PACE`],
//! however busy the store; the script fetches the page again on each event. A stream ends when
//! its browser goes, its session no longer stands (asked of the API every [`RECHECK`]) or the
//! server stops; a principal holds at most [`MAX_STREAMS`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use sha2::Digest as _;
use tokio::sync::mpsc;
use tower_service::Service as _;
use warden_core::keys;
use warden_store::{Follower, Update};

use super::{Peer, Ui};

/// The shortest time between two events of one stream.
const PACE: Duration = Duration::from_millis(250);

/// How often the newest release log of a followed app is looked at: a file's growth has no
/// watch in the store, and a look is one directory listing.
const LOG_POLL: Duration = Duration::from_millis(500);

/// The script, as its own file, so the pages need no inline script.
const SCRIPT: &str = include_str!("live.js");

/// `GET /ui/live.js`
pub(super) async fn script() -> Response {
    let mut resp = SCRIPT.into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/javascript; charset=utf-8"),
    );
    for (name, value) in super::pages::headers() {
        h.insert(name, value);
    }
    resp
}

/// The query of `/ui/events`.
#[derive(serde::Deserialize)]
pub(super) struct EventsQuery {
    /// The app whose release output to follow too.
    app: Option<String>,
    /// The page the stream is for (a path under `/ui/`): events only when it changed.
    page: Option<String>,
}

/// A page of the dashboard, rendered as its browser would get it (its cookies, its address),
/// through the dashboard's own router: what decides whether a change is worth an event.
struct Page {
    router: Router,
    path: String,
    cookie: Option<HeaderValue>,
    peer: Peer,
}

// === impl Page ===

impl Page {
    /// The stream's page, if the query names one of the dashboard's pages (never a stream,
    /// which would never end, a sign-in start, which writes, or anything else).
    fn of(ui: &Ui, q: Option<String>, headers: &HeaderMap, peer: Peer) -> Option<Self> {
        let path = q?;
        is_page(&path).then(|| Self {
            router: super::router(ui.api.clone(), ui.json.clone()),
            path,
            cookie: headers.get(header::COOKIE).cloned(),
            peer,
        })
    }

    /// The SHA-256 of the page as it renders now (its status, where it sends the browser, and
    /// its body); `None` when it could not be rendered.
    async fn digest(&mut self) -> Option<[u8; 32]> {
        let mut req = Request::get(&self.path).body(Body::empty()).ok()?;
        if let Some(c) = &self.cookie {
            req.headers_mut().insert(header::COOKIE, c.clone());
        }
        if let Some(Extension(c)) = &self.peer {
            req.extensions_mut().insert(*c);
        }
        // Bounded: a page that does not answer in time says nothing changed.
        let resp = match tokio::time::timeout(DIGEST_TIME, self.router.call(req)).await {
            Ok(Ok(r)) => r,
            Ok(Err(never)) => match never {},
            Err(_) => return None,
        };
        let mut d = sha2::Sha256::new();
        d.update(resp.status().as_u16().to_be_bytes());
        if let Some(to) = resp.headers().get(header::LOCATION) {
            d.update(to.as_bytes());
        }
        let body = tokio::time::timeout(
            DIGEST_TIME,
            axum::body::to_bytes(resp.into_body(), super::MAX_ANSWER),
        )
        .await
        .ok()?
        .ok()?;
        d.update(steady(&body));
        Some(d.finalize().into())
    }
}

/// The longest one page's render for a digest may take.
const DIGEST_TIME: Duration = Duration::from_secs(5);

/// Whether `path` is one of the dashboard's pages a stream may render: the overview, an app's
/// page or its instances, the nodes, users, audit and metrics pages.
fn is_page(path: &str) -> bool {
    let Some(rest) = path.strip_prefix("/ui/") else {
        return false;
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let name = |s: &str| warden_core::validate_name("app", s).is_ok();
    match parts.as_slice() {
        [""] | ["nodes"] | ["users"] | ["audit"] | ["metrics"] => true,
        ["apps", n] => name(n),
        ["apps", n, "instances"] => name(n),
        _ => false,
    }
}

/// Where a reading that moves with every heartbeat (a node's load average) begins on a page;
/// it ends at the next `</span>` (its value is escaped, so holds none).
pub(super) const READING: &str = "<span class=\"reading\">";

/// `body` without its readings: they alone are no change worth an event (the overview would
/// refresh every second); they show their new value with the next real change.
fn steady(body: &[u8]) -> Vec<u8> {
    let (open, close) = (READING.as_bytes(), b"</span>".as_slice());
    let mut out = Vec::with_capacity(body.len());
    let mut rest = body;
    while let Some(at) = rest.windows(open.len()).position(|w| w == open) {
        out.extend_from_slice(&rest[..at]);
        let after = &rest[at + open.len()..];
        match after.windows(close.len()).position(|w| w == close) {
            Some(end) => rest = &after[end + close.len()..],
            None => {
                rest = after;
                break;
            }
        }
    }
    out.extend_from_slice(rest);
    out
}

/// Most event streams one principal (an operator, or the admin token) holds open at once: a
/// few tabs. Each holds one of the API's `api_max_connections`, so one principal must not
/// take them all.
pub(super) const MAX_STREAMS: usize = 4;

/// How often a stream asks the API again whether its session still stands: a revoked or
/// logged-out token, or a signed-out session, ends its streams within this.
const RECHECK: Duration = Duration::from_secs(3);

/// Open event streams per principal.
#[derive(Clone, Default)]
pub(crate) struct Streams(Arc<Mutex<HashMap<String, usize>>>);

/// One open stream of a principal, counted until dropped.
pub(super) struct Held {
    streams: Streams,
    actor: String,
}

// === impl Streams ===

impl Streams {
    /// A stream for `actor`, unless they hold [`MAX_STREAMS`] already.
    pub(super) fn hold(&self, actor: &str) -> Option<Held> {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(actor.to_owned()).or_default();
        if *n >= MAX_STREAMS {
            return None;
        }
        *n += 1;
        Some(Held {
            streams: self.clone(),
            actor: actor.to_owned(),
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.streams.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.actor) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.actor);
            }
        }
    }
}

/// `GET /ui/events`: for whoever may read the overview (asked of the API, as every page), and
/// with `?app=`, the app's releases; at most [`MAX_STREAMS`] per principal, each ended when its
/// session no longer stands.
pub(super) async fn events(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Query(q): Query<EventsQuery>,
) -> Response {
    let (who, _, _) = match super::session(&ui, &headers) {
        Some(s) => s,
        None => return super::to_login(),
    };
    let page = Page::of(&ui, q.page, &headers, peer);
    let ans = ui.call(&who, &peer, Method::GET, CHECK, None).await;
    if !ans.status.is_success() {
        return (ans.status, ans.error()).into_response();
    }
    let mut logs = None;
    let mut prefixes: Vec<String> = [keys::APPS, keys::INSTANCES, keys::NODES]
        .iter()
        .map(|p| format!("{p}/"))
        .collect();
    if let Some(app) = q.app {
        if warden_core::validate_name("app", &app).is_err() {
            return (StatusCode::NOT_FOUND, "no such app").into_response();
        }
        let path = format!("/v1/apps/{app}/releases");
        let ans = ui.call(&who, &peer, Method::GET, &path, None).await;
        if !ans.status.is_success() {
            return (ans.status, ans.error()).into_response();
        }
        // Its releases' phases and its crash loops.
        prefixes.push(format!("{}/", keys::releases(&app)));
        prefixes.push(format!("{}/{app}/", keys::HEALTH));
        // Only where this node delivers releases is their output here to follow.
        if ui.api.builds.is_some() {
            logs = crate::deliver::log_path(&ui.api, &app, 0)
                .and_then(|p| p.parent().map(std::path::Path::to_path_buf));
        }
    }
    let Some((_, actor)) = super::session::credential(&ui, &who).await else {
        return super::to_login();
    };
    let Some(held) = ui.streams.hold(&actor) else {
        let msg = format!(
            "{actor} has {MAX_STREAMS} live pages open already; close one (its updates stop) and reload"
        );
        return (StatusCode::TOO_MANY_REQUESTS, msg).into_response();
    };
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(1);
    let still = Recheck {
        ui: ui.clone(),
        who,
        peer,
    };
    tokio::spawn(forward(
        ui.api.store.clone(),
        Watched {
            prefixes,
            logs,
            page,
        },
        tx,
        ui.api.stopping.clone(),
        still,
        held,
    ));
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) });
    let mut resp = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response();
    for (name, value) in super::pages::headers() {
        resp.headers_mut().insert(name, value);
    }
    resp
}

/// What a stream's holder must still be allowed to read: the overview's nodes.
const CHECK: &str = "/v1/nodes";

/// Asks the API whether a stream's session still stands.
struct Recheck {
    ui: Ui,
    who: super::SessionId,
    peer: Peer,
}

impl Recheck {
    async fn stands(&self) -> bool {
        let ans = self
            .ui
            .call(&self.who, &self.peer, Method::GET, CHECK, None)
            .await;
        ans.status.is_success()
    }
}

/// What one stream follows: the store under `prefixes`, the release logs in `logs`, and the
/// page whose rendering decides whether a change is worth an event.
struct Watched {
    prefixes: Vec<String>,
    logs: Option<PathBuf>,
    page: Option<Page>,
}

/// Follows what `watched` names, sending a paced "change" to `tx` (with a page, only when that
/// page renders differently) until its stream is dropped, its session no longer stands
/// (`still`, asked every [`RECHECK`]) or `stopping` turns true. The followers end with it (their set is dropped).
async fn forward(
    store: Arc<dyn warden_store::Store>,
    watched: Watched,
    tx: mpsc::Sender<Result<Event, Infallible>>,
    stopping: Option<tokio::sync::watch::Receiver<bool>>,
    still: Recheck,
    _held: Held,
) {
    let Watched {
        prefixes,
        logs,
        mut page,
    } = watched;
    let (changed_tx, mut changed) = mpsc::channel::<()>(1);
    let mut followers = tokio::task::JoinSet::new();
    for prefix in prefixes {
        let mut f = Follower::new(store.clone(), prefix);
        let changed_tx = changed_tx.clone();
        followers.spawn(async move {
            while let Some(u) = f.next().await {
                if matches!(u, Update::Changes { .. }) {
                    // Full: a change is pending already, which covers this one.
                    let _ = changed_tx.try_send(());
                }
            }
        });
    }
    if let Some(dir) = logs {
        let changed_tx = changed_tx.clone();
        followers.spawn(async move {
            // A directory listing blocks: off the runtime's threads.
            let look = |dir: PathBuf| async move {
                tokio::task::spawn_blocking(move || newest_log(&dir))
                    .await
                    .ok()
                    .flatten()
            };
            let mut seen = look(dir.clone()).await;
            loop {
                tokio::time::sleep(LOG_POLL).await;
                let now = look(dir.clone()).await;
                if now != seen {
                    seen = now;
                    let _ = changed_tx.try_send(());
                }
            }
        });
    }
    drop(changed_tx);
    let stop = async move {
        match stopping {
            Some(mut s) => {
                let _ = s.wait_for(|s| *s).await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stop);
    // What the browser was last told to show (the page as the stream began: the script
    // fetches it again when the stream opens).
    let mut shown = match page.as_mut() {
        Some(p) => p.digest().await,
        None => None,
    };
    let mut recheck = tokio::time::interval(RECHECK);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            c = changed.recv() => {
                if c.is_none() {
                    break;
                }
                if let Some(p) = page.as_mut() {
                    let now = p.digest().await;
                    if now.is_some() && now == shown {
                        tokio::time::sleep(PACE).await;
                        continue;
                    }
                    shown = now;
                }
                if tx.send(Ok(Event::default().event("change").data("1"))).await.is_err() {
                    break;
                }
                tokio::time::sleep(PACE).await;
            }
            () = tx.closed() => break,
            () = &mut stop => break,
            _ = recheck.tick() => {
                if !still.stands().await {
                    break;
                }
            }
        }
    }
    followers.abort_all();
}

/// The newest release log in `dir` (the highest number) and its length: what says the
/// output of the release being delivered grew.
/// Only the newest is looked at (one stat): older releases' logs no longer grow.
fn newest_log(dir: &Path) -> Option<(u64, u64)> {
    let n = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name();
            name.to_str()?.strip_suffix(".log")?.parse::<u64>().ok()
        })
        .max()?;
    let len = std::fs::metadata(dir.join(format!("{n}.log"))).ok()?.len();
    Some((n, len))
}

#[cfg(test)]
mod reading_tests {
    #[test]
    fn readings_are_left_out_of_what_counts_as_a_change() {
        let a = super::steady(b"<td><span class=\"reading\">1.41</span></td><td>no</td>");
        let b = super::steady(b"<td><span class=\"reading\">0.20</span></td><td>no</td>");
        assert_eq!(a, b);
        assert_eq!(a, b"<td></td><td>no</td>");
        assert_ne!(
            a,
            super::steady(b"<td><span class=\"reading\">1</span></td><td>yes</td>")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::is_page;

    #[test]
    fn a_stream_renders_only_the_dashboards_pages() {
        for p in [
            "/ui/",
            "/ui/nodes",
            "/ui/users",
            "/ui/audit",
            "/ui/metrics",
            "/ui/apps/demo",
            "/ui/apps/demo/instances",
        ] {
            assert!(is_page(p), "{p}");
        }
        for p in [
            "/ui/events",
            "/ui/audit/events",
            "/ui/metrics/events",
            "/ui/live.js",
            "/ui/login",
            "/ui/login/oidc/corp",
            "/ui/login/oidc/corp/callback",
            "/ui/apps/demo/rollback",
            "/ui/apps/../events",
            "/ui/apps/demo%2Fx",
            "/v1/status",
            "/ui",
            "",
        ] {
            assert!(!is_page(p), "{p}");
        }
    }
}
