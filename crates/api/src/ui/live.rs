//! The dashboard's live part: `/ui/live.js` and `/ui/events`, a server-sent event stream that
//! says "change" when apps, instances or nodes change in the store.
//!
//! Each stream follows the store ([`warden_store::Follower`], the one way every role keeps up
//! with it) only while a browser listens: nothing runs when nobody looks. Changes are paced to
//! at most one event per [`PACE`], however busy the store; the script fetches the page again
//! on each. A stream ends when its browser goes, its session no longer stands (asked of the
//! API every [`RECHECK`]) or the server stops; a principal holds at most [`MAX_STREAMS`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;
use warden_core::keys;
use warden_store::{Follower, Update};

use super::{Peer, Ui};

/// The shortest time between two events of one stream.
const PACE: Duration = Duration::from_millis(250);

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

/// `GET /ui/events`: for whoever may read the overview (asked of the API, as every page), at
/// most [`MAX_STREAMS`] per principal, each ended when its session no longer stands.
pub(super) async fn events(State(ui): State<Ui>, peer: Peer, headers: HeaderMap) -> Response {
    let (who, _, _) = match super::session(&ui, &headers) {
        Some(s) => s,
        None => return super::to_login(),
    };
    let ans = ui.call(&who, &peer, Method::GET, CHECK, None).await;
    if !ans.status.is_success() {
        return (ans.status, ans.error()).into_response();
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

/// Follows apps, instances and nodes, sending a paced "change" to `tx` until its stream is
/// dropped or `stopping` turns true. The followers end with it (their set is dropped).
async fn forward(
    store: Arc<dyn warden_store::Store>,
    tx: mpsc::Sender<Result<Event, Infallible>>,
    stopping: Option<tokio::sync::watch::Receiver<bool>>,
    still: Recheck,
    _held: Held,
) {
    let (changed_tx, mut changed) = mpsc::channel::<()>(1);
    let mut followers = tokio::task::JoinSet::new();
    for prefix in [keys::APPS, keys::INSTANCES, keys::NODES] {
        let mut f = Follower::new(store.clone(), format!("{prefix}/"));
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
    let mut recheck = tokio::time::interval(RECHECK);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            c = changed.recv() => {
                if c.is_none() || tx.send(Ok(Event::default().event("change").data("1"))).await.is_err() {
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
