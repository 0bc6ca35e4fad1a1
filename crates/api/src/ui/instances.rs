//! `/ui/apps/{name}/instances`: an app's instances (state, label, node, release, uptime) and
//! the labels that crash, each with its last lines.
//!
//! Everything comes from the JSON API, as `warden` reads it: the instances from
//! `GET /v1/instances`, their lines from `GET /v1/apps/{name}/logs` (`warden logs APP`), the
//! crashes from `GET /v1/status` (`warden status`) with the crashed instance's lines from
//! `GET /v1/instances/{id}/logs` (`warden logs ID`), or, where that instance ran on another
//! node, the lines its node recorded with the crash. Lines are program output: terminal
//! escapes are taken out and the rest escaped.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use warden_api_types::{AppLogEntry, CrashReport, Status};
use warden_core::{AppSpec, InstanceRecord, InstanceState};

use super::pages::{self, escape_html, word};
use super::{text, Peer, SessionId, Ui};

/// How many of an instance's last lines the page shows.
const LINES: usize = 20;

/// What the page shows.
struct Page {
    name: String,
    instances: Vec<InstanceRecord>,
    /// Each instance's last lines, by id.
    lines: BTreeMap<String, String>,
    /// The app's crashes, each with its last lines.
    crashes: Vec<(CrashReport, String)>,
    now_ms: u64,
}

/// `GET /ui/apps/{name}/instances`
pub(super) async fn page(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    let Some((token, csrf, set)) = super::session(&ui, &headers) else {
        return super::to_login();
    };
    match read(&ui, &token, &peer, &name).await {
        Ok(p) => super::page(StatusCode::OK, render(&p, &csrf), set),
        Err((ans, msg)) => super::refusal(&ans, &csrf, msg),
    }
}

async fn read(
    ui: &Ui,
    token: &SessionId,
    peer: &Peer,
    name: &str,
) -> Result<Page, (super::Answer, String)> {
    if let Err(e) = warden_core::validate_name("app", name) {
        let ans = super::Answer {
            status: StatusCode::NOT_FOUND,
            body: Default::default(),
        };
        return Err((ans, e.to_string()));
    }
    let _: AppSpec = super::read(ui, token, peer, &format!("/v1/apps/{name}")).await?;
    let all: Vec<InstanceRecord> = super::read(ui, token, peer, "/v1/instances").await?;
    // `lines` is the app's total (`warden logs APP -n`): each instance's own last lines are
    // asked for one instance at a time.
    let mut logs: Vec<AppLogEntry> = Vec::new();
    for i in all.iter().filter(|i| i.app == name) {
        let path = format!(
            "/v1/apps/{name}/logs?lines={LINES}&instance={}",
            query_safe(&i.id)
        );
        logs.extend(super::read::<Vec<AppLogEntry>>(ui, token, peer, &path).await?);
    }
    let status: Status = super::read(ui, token, peer, "/v1/status").await?;
    let reports = status
        .apps
        .into_iter()
        .find(|a| a.name == name)
        .map(|a| a.crash_loops)
        .unwrap_or_default();
    let mut crashes = Vec::new();
    for c in reports {
        let path = format!(
            "/v1/instances/{}/logs?lines={LINES}",
            query_safe(&c.health.last_instance)
        );
        let ans = ui.call(token, peer, Method::GET, &path, None).await;
        let here = String::from_utf8_lossy(&ans.body).into_owned();
        let lines = if ans.status.is_success() && !here.trim().is_empty() {
            here
        } else {
            c.health.last_lines.clone()
        };
        crashes.push((c, lines));
    }
    let mut instances: Vec<InstanceRecord> = all.into_iter().filter(|i| i.app == name).collect();
    instances.sort_by(|a, b| (&a.label, &a.node, &a.id).cmp(&(&b.label, &b.node, &b.id)));
    Ok(Page {
        name: name.to_owned(),
        instances,
        lines: logs.into_iter().map(|e| (e.instance, e.text)).collect(),
        crashes,
        now_ms: warden_core::model::now_ms(),
    })
}

/// An instance id as a path segment: ids are letters, digits and dashes; anything else is
/// dropped so that a hostile record cannot steer the call elsewhere.
fn query_safe(id: &str) -> String {
    id.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect()
}

/// Program output as inert text in a `<pre>`.
fn lines(text: &str) -> String {
    let (end, _) = text::tail(text);
    format!(
        "<pre class=\"lines\">{}</pre>",
        escape_html(&text::plain(end))
    )
}

fn render(p: &Page, csrf: &str) -> String {
    let name = escape_html(&p.name);
    let mut main = format!(
        "<h1>Instances of {name}</h1>\n<p><a href=\"/ui/apps/{name}\">Back to app {name}</a></p>\n\
         <section id=\"instance-list\" data-live><h2>Instances</h2><table id=\"instances-table\">\
         <tr><th>Instance</th><th>State</th><th>Label</th><th>Node</th><th>Release</th><th>Up</th></tr>"
    );
    for i in &p.instances {
        let id = escape_html(&i.id);
        let state = word(&i.state);
        let _ = write!(
            main,
            "<tr data-instance=\"{id}\" data-state=\"{s}\"><td>{id}</td><td class=\"state\">{s}</td>\
             <td>{label}</td><td>{node}</td><td>{release}</td><td>{up}</td></tr>",
            s = escape_html(&state),
            label = escape_html(&i.label),
            node = escape_html(&i.node),
            release = i.release.map(|r| r.to_string()).unwrap_or_default(),
            up = text::span(p.now_ms.saturating_sub(i.started_at_ms)),
        );
        // The lines of one that is not serving: what it says on its way up or down.
        if i.state != InstanceState::Ready {
            if let Some(t) = p.lines.get(&i.id).filter(|t| !t.is_empty()) {
                let _ = write!(main, "<tr><td colspan=\"6\">{}</td></tr>", lines(t));
            }
        }
    }
    main.push_str(
        "</table></section>\n<section id=\"crashes\" data-live><h2>Crashes</h2><table id=\"crashes-table\">\
         <tr><th>Label</th><th>Node</th><th>State</th><th>Crashes</th><th>Last exit</th></tr>",
    );
    for (c, text) in &p.crashes {
        let _ = write!(
            main,
            "<tr class=\"crash\" data-label=\"{l}\" data-node=\"{n}\"><td>{l}</td><td>{n}</td>\
             <td class=\"state\">{state}</td><td>{crashes}</td><td>{exit}</td></tr>\
             <tr class=\"crash-lines\" data-label=\"{l}\"><td colspan=\"5\">{lines}</td></tr>",
            l = escape_html(&c.label),
            n = escape_html(&c.node),
            state = if c.health.crash_loop {
                "crash-looping"
            } else {
                "crashed"
            },
            crashes = c.health.crashes,
            exit = escape_html(&text::plain(&c.health.last_exit)),
            lines = lines(text),
        );
    }
    if p.crashes.is_empty() {
        main.push_str("<tr><td colspan=\"5\">None.</td></tr>");
    }
    main.push_str("</table></section>");
    let events = format!("/ui/events?app={name}");
    main.push_str(&format!("<span data-events=\"{events}\" hidden></span>"));
    pages::document(&format!("Instances of {}", p.name), Some(csrf), &main)
}
