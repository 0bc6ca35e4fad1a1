//! `/ui/audit`: the audit trail searched with the filters of `warden audit` (actor, user, app,
//! label, kind, node, a time range), through `GET /v1/audit` as the signed-in browser, and
//! tailed live: `/ui/audit/events` asks the API for the newest record each [`POLL`] while the
//! page is open (the log is files on each node, not the store, so there is nothing to follow)
//! and says "change" when it moved. Each poll goes through the token check, so a stream ends
//! with its session; streams count against the principal's bound ([`super::live::MAX_STREAMS`]).

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;
use warden_core::audit::Record;

pub(crate) use super::audit_html::Search;
use super::{audit_html, live, page, refusal, session, to_login, Peer, Ui};

/// How often an open audit page's stream asks for the newest record.
const POLL: Duration = Duration::from_secs(1);

/// Most records a page shows: the newest.
const LIMIT: usize = 200;

/// A time as `warden audit --since` takes it: ms since the epoch or an age before `now`.
fn time(s: &str, now: u64) -> Result<u64, String> {
    let bad = || {
        format!("{s:?} is not a time: give ms since the epoch or an age such as 30s, 15m, 2h, 7d")
    };
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(ms);
    }
    // By the unit's character, never a byte index: the text is the browser's, any UTF-8.
    let mut chars = s.chars();
    let secs = match chars.next_back() {
        Some('s') => 1,
        Some('m') => 60,
        Some('h') => 3600,
        Some('d') => 86_400,
        _ => return Err(bad()),
    };
    let n: u64 = chars.as_str().parse().map_err(|_| bad())?;
    Ok(now.saturating_sub(n.saturating_mul(secs * 1000)))
}

/// A query value, percent-encoded.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The `GET /v1/audit` path of a search, or why it is not one.
fn path(s: &Search, now: u64) -> Result<String, String> {
    let mut parts = vec![format!("limit={LIMIT}")];
    for (k, v) in [
        ("actor", &s.actor),
        ("user", &s.user),
        ("app", &s.app),
        ("label", &s.label),
        ("kind", &s.kind),
        ("node", &s.node),
    ] {
        if !v.trim().is_empty() {
            parts.push(format!("{k}={}", encode(v.trim())));
        }
    }
    for (k, v) in [("since", &s.since), ("until", &s.until)] {
        if !v.trim().is_empty() {
            parts.push(format!("{k}={}", time(v.trim(), now)?));
        }
    }
    Ok(format!("/v1/audit?{}", parts.join("&")))
}

/// `GET /ui/audit?…`: the records the search finds, newest first.
pub(super) async fn search(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Query(s): Query<Search>,
) -> Response {
    let (who, csrf, set) = match session(&ui, &headers) {
        Some(s) => s,
        None => return to_login(),
    };
    let path = match path(&s, warden_core::model::now_ms()) {
        Ok(p) => p,
        Err(msg) => {
            let html = audit_html::page(&s, &[], &csrf, Some(&msg));
            return page(StatusCode::BAD_REQUEST, html, set);
        }
    };
    let ans = ui.call(&who, &peer, Method::GET, &path, None).await;
    match ans.json::<Vec<Record>>() {
        Ok(mut records) => {
            records.sort_by(|a, b| (b.at_ms, &b.node, b.seq).cmp(&(a.at_ms, &a.node, a.seq)));
            page(
                StatusCode::OK,
                audit_html::page(&s, &records, &csrf, None),
                set,
            )
        }
        Err(msg) => refusal(&ans, &csrf, msg),
    }
}

/// The newest record's place, as the API answers the session (`Err`: it no longer does).
async fn newest(
    ui: &Ui,
    who: &super::SessionId,
    peer: &Peer,
) -> Result<Option<(String, u64)>, Response> {
    let ans = ui
        .call(who, peer, Method::GET, "/v1/audit?limit=1", None)
        .await;
    match ans.json::<Vec<Record>>() {
        Ok(r) => Ok(r.last().map(|r| (r.node.clone(), r.seq))),
        Err(msg) => Err((ans.status, msg).into_response()),
    }
}

/// `GET /ui/audit/events`: "change" whenever a new record is written, while the page is open.
pub(super) async fn events(State(ui): State<Ui>, peer: Peer, headers: HeaderMap) -> Response {
    let (who, _, _) = match session(&ui, &headers) {
        Some(s) => s,
        None => return to_login(),
    };
    let mut last = match newest(&ui, &who, &peer).await {
        Ok(l) => l,
        Err(resp) => return resp,
    };
    let Some((_, actor)) = super::session::credential(&ui, &who).await else {
        return to_login();
    };
    let Some(held) = ui.streams.hold(&actor) else {
        let msg = format!(
            "{actor} has {} live pages open already; close one (its updates stop) and reload",
            live::MAX_STREAMS
        );
        return (StatusCode::TOO_MANY_REQUESTS, msg).into_response();
    };
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(1);
    let mut stopping = ui.api.stopping.clone();
    tokio::spawn(async move {
        let _held = held;
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = tx.closed() => break,
            }
            if stopping.as_mut().is_some_and(|s| *s.borrow_and_update()) {
                break;
            }
            let Ok(now) = newest(&ui, &who, &peer).await else {
                break;
            };
            if now != last {
                last = now;
                if tx
                    .send(Ok(Event::default().event("change").data("1")))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        }
    });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_is_the_api_query_of_warden_audit() {
        let s = Search {
            actor: "operator:oona".into(),
            kind: "change".into(),
            since: "15m".into(),
            until: "5000".into(),
            ..Search::default()
        };
        let now = 1_000_000_000;
        assert_eq!(
            path(&s, now).unwrap(),
            format!(
                "/v1/audit?limit={LIMIT}&actor=operator%3Aoona&kind=change&since={}&until=5000",
                now - 900_000
            )
        );
        let bad = Search {
            since: "yesterday".into(),
            ..Search::default()
        };
        assert!(path(&bad, now).unwrap_err().contains("not a time"));
        // A last character of several bytes is refused, not a panic.
        for odd in ["5\u{e9}", "\u{e9}", "\u{1f600}", "", "m"] {
            assert!(
                time(odd, now).unwrap_err().contains("not a time"),
                "{odd:?}"
            );
        }
        let sneaky = Search {
            app: "a&kind=x".into(),
            ..Search::default()
        };
        assert!(path(&sneaky, now).unwrap().ends_with("app=a%26kind%3Dx"));
    }
}
