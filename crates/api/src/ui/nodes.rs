//! `/ui/nodes`: the cluster's live nodes (roles, load, lease, drain state, as `warden nodes
//! list` and `warden status` show them) with a drain or undrain button each, which call
//! `POST` and `DELETE /v1/nodes/{name}/drain` (`warden nodes drain` and `undrain`).

use std::fmt::Write as _;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Form;
use warden_api_types::{NodeRecord, Status};

use super::pages::{self, escape_html};
use super::{text, Peer, Plain, SessionId, Ui};

/// `GET /ui/nodes`
pub(super) async fn page(State(ui): State<Ui>, peer: Peer, headers: HeaderMap) -> Response {
    let Some((token, csrf, set)) = super::session(&ui, &headers) else {
        return super::to_login();
    };
    match read(&ui, &token, &peer).await {
        Ok((nodes, status)) => {
            super::page(StatusCode::OK, render(&nodes, &status, &csrf, None), set)
        }
        Err((ans, msg)) => super::refusal(&ans, &csrf, msg),
    }
}

async fn read(
    ui: &Ui,
    token: &SessionId,
    peer: &Peer,
) -> Result<(Vec<NodeRecord>, Status), (super::Answer, String)> {
    let mut nodes: Vec<NodeRecord> = super::read(ui, token, peer, "/v1/nodes").await?;
    nodes.sort_by(|a, b| a.id.cmp(&b.id));
    let status: Status = super::read(ui, token, peer, "/v1/status").await?;
    Ok((nodes, status))
}

/// A node's drain state as `warden nodes list` says it: a drain that has moved every
/// instance away is `drained`, one still moving them says how many are left.
fn drain_state(draining: bool, instances: usize) -> String {
    match (draining, instances) {
        (false, _) => "ready".to_owned(),
        (true, 0) => "drained".to_owned(),
        (true, n) => format!("draining ({n} left)"),
    }
}

fn render(nodes: &[NodeRecord], s: &Status, csrf: &str, msg: Option<&str>) -> String {
    let now = warden_core::model::now_ms();
    let mut main = format!(
        "<h1>Nodes</h1>\n{}\n<section id=\"node-list\" data-live><table id=\"nodes-table\"><tr>\
         <th>Node</th><th>Roles</th><th>Node port</th><th>Load</th><th>CPU</th><th>Memory</th>\
         <th>Instances</th><th>Lease</th><th>State</th><th></th></tr>",
        pages::message(msg)
    );
    for n in nodes {
        let name = escape_html(&n.id);
        let load = s
            .by_node
            .iter()
            .find(|b| b.name == n.id)
            .map_or("-".to_owned(), |b| format!("{:.2}", b.load));
        let (action, label) = if n.draining {
            ("undrain", "Undrain")
        } else {
            ("drain", "Drain")
        };
        let pct = |x: f64| format!("{:.0}%", x * 100.0);
        // The id goes into a URL path: a node whose id is not a plain name (a record written
        // by hand or by something hostile) is listed without a form rather than given a path
        // it could bend (`..`, `?`, `#`).
        let form = match warden_core::validate_name("node", &n.id) {
            Ok(()) => format!(
                "<form method=\"post\" action=\"/ui/nodes/{name}/{action}\" class=\"{action}\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
                 <button type=\"submit\">{label}</button></form>",
                csrf = escape_html(csrf),
            ),
            Err(_) => String::new(),
        };
        let _ = write!(
            main,
            "<tr data-node=\"{name}\"><td>{name}{sched}</td><td>{roles}</td><td>{port}</td><td>{load}</td>\
             <td>{cpu}</td><td>{mem}</td><td>{count}</td><td>held, up {up}</td><td class=\"state\">{state}</td>\
             <td>{form}</td></tr>",
            sched = if s.scheduler.as_deref() == Some(n.id.as_str()) {
                " (scheduler)"
            } else {
                ""
            },
            roles = escape_html(&n.roles.join(", ")),
            port = escape_html(n.advertise.as_deref().unwrap_or("-")),
            cpu = pct(n.load.cpu_busy),
            mem = pct(n.load.memory_used),
            count = n.load.instances,
            up = text::span(now.saturating_sub(n.started_at_ms)),
            state = escape_html(&drain_state(n.draining, n.load.instances as usize)),
        );
    }
    main.push_str(
        "</table><p>A node is listed while its lease is held: it vanishes when it stops or \
         its lease runs out.</p></section>",
    );
    pages::document("Nodes", Some(csrf), &main)
}

/// `POST /ui/nodes/{name}/drain`: `POST /v1/nodes/{name}/drain`.
pub(super) async fn drain(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(f): Form<Plain>,
) -> Response {
    act(ui, peer, headers, name, f, Method::POST).await
}

/// `POST /ui/nodes/{name}/undrain`: `DELETE /v1/nodes/{name}/drain`.
pub(super) async fn undrain(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(f): Form<Plain>,
) -> Response {
    act(ui, peer, headers, name, f, Method::DELETE).await
}

async fn act(
    ui: Ui,
    peer: Peer,
    headers: HeaderMap,
    name: String,
    f: Plain,
    method: Method,
) -> Response {
    if let Some(resp) = super::refused(&ui, &headers, f.csrf.as_deref()) {
        return resp;
    }
    let Some((token, csrf, _)) = super::session(&ui, &headers) else {
        return super::to_login();
    };
    // The API's own check of the name, so that nothing else reaches its path.
    if let Err(e) = warden_core::name::validate_name("node", &name) {
        let page = pages::error(Some(&csrf), &e.to_string());
        return pages::respond(StatusCode::BAD_REQUEST, page);
    }
    let path = format!("/v1/nodes/{name}/drain");
    let ans = ui.call(&token, &peer, method, &path, None).await;
    if ans.status.is_success() {
        let mut resp = (StatusCode::SEE_OTHER, [(header::LOCATION, "/ui/nodes")]).into_response();
        for (n, v) in pages::headers() {
            resp.headers_mut().insert(n, v);
        }
        return resp;
    }
    if ans.status == StatusCode::UNAUTHORIZED {
        return super::to_login();
    }
    let msg = ans.error();
    match read(&ui, &token, &peer).await {
        Ok((nodes, status)) => {
            pages::respond(ans.status, render(&nodes, &status, &csrf, Some(&msg)))
        }
        Err(_) => pages::respond(ans.status, pages::error(Some(&csrf), &msg)),
    }
}
