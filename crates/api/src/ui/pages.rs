//! The dashboard's pages: server-rendered HTML, one inline style allowed by its hash, no
//! inline script (the one script is `/ui/live.js`), sent with headers that forbid everything
//! else ([`respond`]).
//!
//! Every value put into a page goes through [`escape_html`], here and nowhere else: an app
//! name, a label, a node, a config value, a log line or an error never reaches a browser as
//! markup.

use std::fmt::Write as _;
use std::sync::LazyLock;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use sha2::{Digest, Sha256};
use warden_api_types::{AppStatus, Status};
use warden_core::{AppSpec, InstanceRecord, Release, ReleaseSource, ReleaseStatus};

use super::text;

/// The one style block of every page, allowed by its hash in the content security policy.
const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:64rem;margin:1rem auto;\
padding:0 1rem;color:#222}h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:1.5rem}\
table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:.25rem .5rem;\
border-bottom:1px solid #ddd;vertical-align:top}label{display:block;margin:.6rem 0}\
input{padding:.35rem}button{padding:.35rem .9rem}nav{display:flex;gap:1rem;align-items:center}\
nav form{margin-left:auto}p.message{padding:.5rem;border-left:4px solid #b00;background:#fee}\
pre{white-space:pre-wrap;background:#f6f6f6;padding:.4rem;margin:0}.bad{color:#b00}";

/// The page, this API's script and its event stream; nothing else, from nowhere else.
static CSP: LazyLock<HeaderValue> = LazyLock::new(|| {
    let hash = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(STYLE));
    let policy = format!(
        "default-src 'none'; style-src 'sha256-{hash}'; script-src 'self'; connect-src 'self'; \
         frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    );
    HeaderValue::from_str(&policy).unwrap_or(HeaderValue::from_static("default-src 'none'"))
});

/// The headers of every dashboard answer (pages, the script, the event stream).
pub(crate) fn headers() -> [(header::HeaderName, HeaderValue); 5] {
    [
        (header::CONTENT_SECURITY_POLICY, CSP.clone()),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        // `same-origin`, not `no-referrer`: under `no-referrer` Chromium sends `Origin: null`
        // with the page's own form POSTs, which the origin check refuses.
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
    ]
}

/// A page as a response.
pub(crate) fn respond(status: StatusCode, html: String) -> Response {
    let mut resp = (status, html).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    for (name, value) in headers() {
        h.insert(name, value);
    }
    resp
}

/// `text` with every character that means something in HTML (text or a quoted attribute)
/// written as a character reference.
pub(crate) fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A whole document: `title` (escaped here) and `main` (escaped by its maker); with
/// `signed_in` (the CSRF field), the navigation, sign-out and the live script.
pub(crate) fn document(title: &str, signed_in: Option<&str>, main: &str) -> String {
    let (nav, script) = match signed_in {
        Some(csrf) => (
            format!(
                "<nav><a href=\"/ui/\">Overview</a><a href=\"/ui/users\">Users</a><a href=\"/ui/audit\">Audit</a><a href=\"/ui/metrics\">Metrics</a><form method=\"post\" action=\"/ui/logout\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
                 <button type=\"submit\">Sign out</button></form></nav>",
                csrf = escape_html(csrf)
            ),
            "<script src=\"/ui/live.js\" defer></script>",
        ),
        None => (String::new(), ""),
    };
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · warden</title><style>{STYLE}</style>{script}</head>\
         <body>{nav}<main>\n{main}\n</main></body></html>\n",
        title = escape_html(title),
    )
}

/// The message paragraph, which the live script replaces after a form it sent (empty: none).
pub(crate) fn message(m: Option<&str>) -> String {
    match m {
        Some(m) => format!(
            "<p class=\"message\" id=\"message\" data-live role=\"alert\">{}</p>",
            escape_html(m)
        ),
        None => "<p id=\"message\" data-live hidden></p>".into(),
    }
}

/// The sign-in page.
pub(crate) fn login(csrf: &str, msg: Option<&str>, providers: &[(String, String)]) -> String {
    let csrf = escape_html(csrf);
    // A link per identity provider (`id`, `label`): a GET that begins its sign-in.
    let sso: String = providers
        .iter()
        .map(|(id, label)| {
            format!(
                "<p><a class=\"provider\" id=\"oidc-{id}\" href=\"/ui/login/oidc/{id}\">Sign in with {label}</a></p>",
                id = escape_html(id),
                label = escape_html(label)
            )
        })
        .collect();
    let main = format!(
        "<h1>warden dashboard</h1>\n{msg}\n{sso}\n\
         <form method=\"post\" action=\"/ui/login\" id=\"password\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <label>Operator <input type=\"text\" name=\"name\" autocomplete=\"username\" required autofocus></label>\
         <label>Password <input type=\"password\" name=\"password\" autocomplete=\"current-password\" required></label>\
         <button type=\"submit\">Sign in</button></form>\n\
         <h2>Break-glass admin token</h2>\
         <form method=\"post\" action=\"/ui/login\" id=\"token\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <label>Token <input type=\"password\" name=\"token\" autocomplete=\"off\" required></label>\
         <button type=\"submit\">Sign in with the token</button></form>",
        msg = message(msg),
    );
    document("Sign in", None, &main)
}

/// The page a provider sign-in ends on: it moves on to `next` by itself (the `Refresh`
/// header), with a link for a browser that does not.
pub(crate) fn signed_in(next: &str) -> String {
    let main = format!(
        "<h1>Signed in</h1>\n<p><a href=\"{next}\">Continue to the dashboard</a></p>",
        next = escape_html(next)
    );
    document("Signed in", None, &main)
}

/// A page that only says what went wrong.
pub(crate) fn error(csrf: Option<&str>, msg: &str) -> String {
    let main = format!("<h1>Refused</h1>\n{}", message(Some(msg)));
    document("Refused", csrf, &main)
}

fn counts(m: &std::collections::BTreeMap<String, impl std::fmt::Display>) -> String {
    m.iter()
        .map(|(k, v)| format!("{}: {v}", escape_html(k)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn app_link(name: &str) -> String {
    let n = escape_html(name);
    format!("<a href=\"/ui/apps/{n}\">{n}</a>")
}

/// The overview: what `GET /v1/status` says, as it says it.
pub(crate) fn overview(s: &Status, csrf: &str) -> String {
    let mut main = String::from("<h1>Overview</h1>\n<section id=\"nodes\" data-live><h2><a href=\"/ui/nodes\">Nodes</a></h2><table><tr><th>Node</th><th>Roles</th><th>Load</th><th>Drained</th><th>Instances</th></tr>");
    for n in &s.by_node {
        let on: Vec<String> = n
            .instances
            .iter()
            .map(|(app, labels)| format!("{} ({})", escape_html(app), counts(labels)))
            .collect();
        let _ = write!(
            main,
            "<tr data-node=\"{name}\"><td>{name}{sched}</td><td>{roles}</td><td><span class=\"reading\">{load:.2}</span></td><td>{drained}</td><td>{on}</td></tr>",
            name = escape_html(&n.name),
            sched = if s.scheduler.as_deref() == Some(n.name.as_str()) { " (scheduler)" } else { "" },
            roles = escape_html(&n.roles.join(", ")),
            load = n.load,
            drained = if n.draining { "draining" } else { "no" },
            on = on.join("; "),
        );
    }
    main.push_str("</table></section>\n<section id=\"apps\" data-live><h2>Apps</h2><table id=\"apps-table\"><tr><th>App</th><th>Label</th><th>Desired</th><th>Ready</th><th>State</th></tr>");
    for a in &s.apps {
        for (label, desired, ready) in label_rows(a) {
            let _ = write!(
                main,
                "<tr data-app=\"{app}\" data-label=\"{l}\"><td>{link}</td><td>{l}</td><td class=\"desired\">{desired}</td><td class=\"ready\">{ready}</td><td>{state}</td></tr>",
                app = escape_html(&a.name),
                link = app_link(&a.name),
                l = escape_html(&label),
                state = state(a, &label, desired, ready),
            );
        }
    }
    main.push_str("</table></section>\n");
    // Not the store's revision: it moves with every heartbeat, and the page's live stream
    // (which says "change" only when the page differs) would refresh it every second.
    let _ = write!(
        main,
        "<section id=\"store\" data-live><h2>Store and readiness</h2><p>{nodes} node(s), {users} user(s); audit: {audit}; data: {data}</p>",
        nodes = s.nodes,
        users = s.users,
        audit = escape_html(s.audit.as_deref().unwrap_or("unknown")),
        data = escape_html(s.data.as_deref().unwrap_or("none")),
    );
    for d in &s.damaged {
        let _ = write!(
            main,
            "<p class=\"bad\">damaged: {} — {}</p>",
            escape_html(&d.key),
            escape_html(&d.reason)
        );
    }
    main.push_str("</section>");
    document("Overview", Some(csrf), &main)
}

/// Each label an app wants or runs: (label, desired, ready).
pub(crate) fn label_rows(a: &AppStatus) -> Vec<(String, u32, usize)> {
    let mut labels: std::collections::BTreeSet<&String> = a.desired.keys().collect();
    labels.extend(a.instances.keys());
    labels
        .into_iter()
        .map(|l| {
            let d = a.desired.get(l).copied().unwrap_or(0);
            (l.clone(), d, a.ready.get(l).copied().unwrap_or(0))
        })
        .collect()
}

pub(crate) fn state(a: &AppStatus, label: &str, desired: u32, ready: usize) -> &'static str {
    if a.crash_loops
        .iter()
        .any(|c| c.label == label && c.health.crash_loop)
    {
        "crash-looping"
    } else if ready != desired as usize || a.moving.iter().any(|m| m.label == label) {
        "converging"
    } else {
        "steady"
    }
}

/// What the app page shows, each part read through the JSON API.
pub(crate) struct AppPage {
    /// `GET /v1/apps/{name}`: config values already hidden from who may not see them.
    pub spec: AppSpec,
    /// The app's part of `GET /v1/status`.
    pub status: Option<AppStatus>,
    /// `GET /v1/instances`, of this app.
    pub instances: Vec<InstanceRecord>,
    /// `GET /v1/apps/{name}/releases`.
    pub releases: Vec<Release>,
    /// The newest release's build and delivery output.
    pub build: Option<Build>,
}

/// An app: labels, instances per node, releases, config keys and the scale form.
pub(crate) fn app(p: &AppPage, csrf: &str, msg: Option<&str>) -> String {
    let name = escape_html(&p.spec.name);
    let mut main = format!("<h1>App {name}</h1>\n{}\n", message(msg));
    main.push_str("<section id=\"labels\" data-live><h2>Labels</h2><table id=\"labels-table\"><tr><th>Label</th><th>Desired</th><th>Ready</th><th>State</th></tr>");
    if let Some(a) = &p.status {
        for (label, desired, ready) in label_rows(a) {
            let _ = write!(
                main,
                "<tr data-label=\"{l}\"><td>{l}</td><td class=\"desired\">{desired}</td><td class=\"ready\">{ready}</td><td>{state}</td></tr>",
                l = escape_html(&label),
                state = state(a, &label, desired, ready),
            );
        }
        for c in &a.crash_loops {
            let _ = write!(
                main,
                "<tr class=\"crash\"><td colspan=\"4\">{l} on {n}: {crashes} crash(es), last exit {exit}<pre>{lines}</pre></td></tr>",
                l = escape_html(&c.label),
                n = escape_html(&c.node),
                crashes = c.health.crashes,
                exit = escape_html(&c.health.last_exit),
                lines = escape_html(&super::text::plain(&c.health.last_lines)),
            );
        }
    }
    let _ = write!(
        main,
        "</table>\n<form method=\"post\" action=\"/ui/apps/{name}/scale\" id=\"scale\" data-fetch>\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <label>Label <input type=\"text\" name=\"label\" required></label>\
         <label>Instances <input type=\"number\" name=\"count\" min=\"0\" required></label>\
         <button type=\"submit\">Scale</button></form></section>\n",
        csrf = escape_html(csrf),
    );
    let _ = writeln!(
        main,
        "<p><a href=\"/ui/apps/{name}/instances\" id=\"instances-link\">Instances, uptime and last lines</a></p>"
    );
    main.push_str("<section id=\"instances\" data-live><h2>Instances</h2><table><tr><th>Node</th><th>Label</th><th>State</th><th>Release</th><th>Id</th></tr>");
    let mut instances: Vec<&InstanceRecord> = p.instances.iter().collect();
    instances.sort_by(|a, b| (&a.node, &a.label, &a.id).cmp(&(&b.node, &b.label, &b.id)));
    for i in instances {
        let _ = write!(
            main,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape_html(&i.node),
            escape_html(&i.label),
            escape_html(&word(&i.state)),
            i.release.map(|r| r.to_string()).unwrap_or_default(),
            escape_html(&i.id),
        );
    }
    main.push_str("</table></section>\n");
    main.push_str(&releases(p, csrf));
    main.push_str("\n<section id=\"config\"><h2>Config</h2><table id=\"config-table\"><tr><th>Key</th><th>Value</th></tr>");
    for (k, v) in &p.spec.env {
        let _ = write!(
            main,
            "<tr><td>{}</td><td><code>{}</code></td></tr>",
            escape_html(k),
            escape_html(v)
        );
    }
    main.push_str("</table></section>");
    document(&format!("App {}", p.spec.name), Some(csrf), &main)
}

/// An enum as its API spells it (`"crash_loop"` without the quotes).
pub(crate) fn word(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v)
        .unwrap_or_default()
        .trim_matches('"')
        .to_owned()
}

/// A release's build and delivery output, as a page shows it.
pub(crate) struct Build {
    pub(crate) number: u64,
    pub(crate) status: ReleaseStatus,
    /// Its end, without terminal escapes (not yet escaped for HTML).
    pub(crate) text: String,
    /// Whether earlier output was cut.
    pub(crate) cut: bool,
}

/// What made a release, as `warden releases` says it.
fn source(r: &Release) -> String {
    match &r.source {
        ReleaseSource::Push { from, .. } => format!("push {from}"),
        ReleaseSource::Config { changed } => format!("config {}", changed.join(",")),
        ReleaseSource::Rollback { to } => format!("rollback to {to}"),
    }
}

/// A POST form of one button, to `action` with `to` and `from` (the release serving as the
/// page was shown: a rollback is refused if another serves when it is confirmed).
fn button(action: &str, csrf: &str, to: u64, from: u64, class: &str, label: &str) -> String {
    format!(
        "<form method=\"post\" action=\"{action}\" class=\"{class}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <input type=\"hidden\" name=\"to\" value=\"{to}\">\
         <input type=\"hidden\" name=\"from\" value=\"{from}\">\
         <button type=\"submit\">{label}</button></form>",
        csrf = escape_html(csrf),
    )
}

/// The releases section (newest first, with their actions) and the build output section.
pub(super) fn releases(p: &AppPage, csrf: &str) -> String {
    let name = escape_html(&p.spec.name);
    let serving = p.spec.release.as_ref().map(|r| r.number);
    let mut out = String::from(
        "<section id=\"releases\" data-live><h2>Releases</h2><table id=\"releases-table\">\
         <tr><th>#</th><th>Status</th><th>Source</th><th>By</th><th>When (UTC)</th><th></th></tr>",
    );
    for r in p.releases.iter().rev() {
        let action = match serving {
            Some(s) if s == r.number => {
                let restart = format!("/ui/apps/{name}/restart");
                format!(
                    "serving {}",
                    button(&restart, csrf, r.number, s, "restart", "Restart")
                )
            }
            Some(s) if r.status == ReleaseStatus::Released && r.number < s => {
                let rollback = format!("/ui/apps/{name}/rollback");
                let label = format!("Roll back to {}", r.number);
                button(&rollback, csrf, r.number, s, "rollback", &label)
            }
            _ => String::new(),
        };
        let _ = write!(
            out,
            "<tr data-release=\"{n}\"><td>{n}</td><td class=\"status\">{status}</td><td>{source}</td>\
             <td class=\"by\">{by}</td><td>{at}</td><td>{action}</td></tr>",
            n = r.number,
            status = escape_html(&word(&r.status)),
            source = escape_html(&text::plain(&source(r))),
            by = escape_html(&text::plain(&r.by)),
            at = text::when(r.at_ms),
        );
    }
    out.push_str("</table></section>\n");
    // The stream of this page: store changes, and this app's release output as it grows.
    let _ = write!(
        out,
        "<section id=\"build\" data-live data-events=\"/ui/events?app={name}\"><h2>Build output</h2>"
    );
    match &p.build {
        Some(b) => {
            let _ = write!(
                out,
                "<p>Release {n} ({status}){cut}</p><pre id=\"build-output\">{text}</pre>",
                n = b.number,
                status = escape_html(&word(&b.status)),
                cut = if b.cut {
                    "; earlier output cut, `warden logs APP --release N` prints it all"
                } else {
                    ""
                },
                text = escape_html(&b.text),
            );
        }
        None => out.push_str("<p>No release output.</p>"),
    }
    out.push_str("</section>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_values_is_text_and_the_page_has_no_inline_script() {
        assert_eq!(
            escape_html("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
        let page = error(Some("c"), "<img src=x onerror=alert(1)>");
        assert!(!page.contains("<img"), "{page}");
        assert!(!page.contains("<script>"), "{page}");
    }
}
