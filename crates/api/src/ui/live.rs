//! The dashboard's live part: `/ui/live.js` and `/ui/events`, a server-sent event stream that
//! says "change" when apps, instances or nodes change in the store.
//!
//! Each stream follows the store ([`warden_store::Follower`], the one way every role keeps up
//! with it) only while a browser listens: nothing runs when nobody looks. Changes are paced to
//! at most one event per [`PACE`], however busy the store; the script fetches the page again
//! on each. A stream ends when its browser goes or the server stops.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method};
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

/// `GET /ui/events`: for whoever may read the overview (asked of the API, as every page).
pub(super) async fn events(State(ui): State<Ui>, peer: Peer, headers: HeaderMap) -> Response {
    let (token, _, _) = match super::session(&ui, &headers) {
        Some(s) => s,
        None => return super::to_login(),
    };
    let ans = ui.call(&token, &peer, Method::GET, "/v1/nodes", None).await;
    if !ans.status.is_success() {
        return (ans.status, ans.error()).into_response();
    }
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(1);
    tokio::spawn(forward(ui.api.store.clone(), tx, ui.api.stopping.clone()));
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

/// Follows apps, instances and nodes, sending a paced "change" to `tx` until its stream is
/// dropped or `stopping` turns true. The followers end with it (their set is dropped).
async fn forward(
    store: std::sync::Arc<dyn warden_store::Store>,
    tx: mpsc::Sender<Result<Event, Infallible>>,
    stopping: Option<tokio::sync::watch::Receiver<bool>>,
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
        }
    }
    followers.abort_all();
}
