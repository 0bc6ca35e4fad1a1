//! `/ui/metrics`: requests per second, server errors per second and mean latency per app, from
//! the gateway's own counters (`warden_gateway_requests_total{app,status}` and
//! `warden_gateway_app_request_seconds_total{app}`), read in-process from the same text
//! `/metrics` serves, as small server-rendered SVG charts. On a cluster this is this node's
//! gateway only: each node counts what it serves (its `/metrics` likewise).
//!
//! Samples are taken only while a metrics page is open: each second by its event stream, which
//! then says "change" so the page fetches itself again; the last [`KEEP`] are kept, so charts
//! cover about a minute. Nothing samples when nobody looks.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;
use warden_core::AppSpec;

pub(crate) use super::metrics_html::{Counts, Sample};
use super::{live, metrics_html, page, refusal, session, to_login, Peer, Ui};

/// Samples kept: a minute at one a second.
const KEEP: usize = 60;

/// How often an open page's stream samples.
const EVERY: Duration = Duration::from_secs(1);

/// The kept samples, oldest first.
#[derive(Clone, Default)]
pub(crate) struct Samples(Arc<Mutex<VecDeque<Sample>>>);

/// `name{labels} value` → the value of label `label`.
fn label<'a>(labels: &'a str, label: &str) -> Option<&'a str> {
    let at = labels.find(&format!("{label}=\""))? + label.len() + 2;
    let rest = &labels[at..];
    Some(&rest[..rest.find('"')?])
}

/// The per-app counters in Prometheus text.
pub(crate) fn parse(text: &str) -> BTreeMap<String, Counts> {
    let mut apps: BTreeMap<String, Counts> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let Some((name, labels)) = series.split_once('{') else {
            continue;
        };
        let Some(app) = label(labels, "app") else {
            continue;
        };
        let c = apps.entry(app.to_owned()).or_default();
        match name {
            "warden_gateway_requests_total" => {
                c.requests += value;
                if label(labels, "status").is_some_and(|s| s.starts_with('5')) {
                    c.errors += value;
                }
            }
            "warden_gateway_app_request_seconds_total" => c.seconds += value,
            _ => {}
        }
    }
    apps
}

// === impl Samples ===

impl Samples {
    /// Takes a sample from `ui`'s metrics unless one was taken less than most of [`EVERY`]
    /// ago (several open pages share the samples).
    fn take(&self, ui: &Ui) {
        let Some(render) = &ui.api.metrics else {
            return;
        };
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if kept
            .back()
            .is_some_and(|s| s.at.elapsed() < EVERY.mul_f32(0.8))
        {
            return;
        }
        let apps = parse(&render());
        kept.push_back(Sample {
            at: Instant::now(),
            apps,
        });
        while kept.len() > KEEP {
            kept.pop_front();
        }
    }

    fn all(&self) -> Vec<Sample> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

/// `GET /ui/metrics`: for whoever may list the apps (asked of the API), each app's charts.
pub(super) async fn show(State(ui): State<Ui>, peer: Peer, headers: HeaderMap) -> Response {
    let (who, csrf, set) = match session(&ui, &headers) {
        Some(s) => s,
        None => return to_login(),
    };
    let ans = ui.call(&who, &peer, Method::GET, "/v1/apps", None).await;
    let apps = match ans.json::<Vec<AppSpec>>() {
        Ok(a) => a,
        Err(msg) => return refusal(&ans, &csrf, msg),
    };
    ui.samples.take(&ui);
    let names: Vec<String> = apps.into_iter().map(|a| a.name).collect();
    let html = metrics_html::page(&names, &ui.samples.all(), &csrf);
    page(StatusCode::OK, html, set)
}

/// `GET /ui/metrics/events`: samples each second and says "change", while the page is open and
/// its session stands (asked of the API each time).
pub(super) async fn events(State(ui): State<Ui>, peer: Peer, headers: HeaderMap) -> Response {
    let (who, _, _) = match session(&ui, &headers) {
        Some(s) => s,
        None => return to_login(),
    };
    let ans = ui.call(&who, &peer, Method::GET, "/v1/apps", None).await;
    if !ans.status.is_success() {
        return (ans.status, ans.error()).into_response();
    }
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
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = tx.closed() => break,
            }
            if stopping.as_mut().is_some_and(|s| *s.borrow_and_update()) {
                break;
            }
            let ans = ui.call(&who, &peer, Method::GET, "/v1/apps", None).await;
            if !ans.status.is_success() {
                break;
            }
            ui.samples.take(&ui);
            if tx
                .send(Ok(Event::default().event("change").data("1")))
                .await
                .is_err()
            {
                break;
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
    fn the_gateways_counters_per_app() {
        let text = "# HELP x\n\
            warden_gateway_requests_total{app=\"demo\",status=\"200\"} 7\n\
            warden_gateway_requests_total{app=\"demo\",status=\"502\"} 2\n\
            warden_gateway_requests_total{app=\"other\",status=\"404\"} 1\n\
            warden_gateway_app_request_seconds_total{app=\"demo\"} 0.5\n\
            warden_gateway_request_seconds_sum 9\n";
        let apps = parse(text);
        assert_eq!(
            apps["demo"],
            Counts {
                requests: 9.0,
                errors: 2.0,
                seconds: 0.5
            }
        );
        assert_eq!(apps["other"].errors, 0.0);
        assert_eq!(apps.len(), 2);
    }
}
