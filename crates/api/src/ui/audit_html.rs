//! The audit page's template: the search form (filled with what was searched, escaped), and
//! the records, every field through [`escape_html`]; the records' section is live.

use std::fmt::Write as _;

use warden_core::audit::Record;

use super::pages::{document, escape_html, message};
use super::text::when as utc;

/// The search form, as `warden audit`'s flags (empty fields: no filter).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub(crate) struct Search {
    pub actor: String,
    pub user: String,
    pub app: String,
    pub label: String,
    pub kind: String,
    pub node: String,
    /// ms since the epoch, or an age (`30s`, `15m`, `2h`, `7d`).
    pub since: String,
    /// As `since`.
    pub until: String,
}

/// The page: the form, and `records` (newest first) or `msg`.
pub(crate) fn page(s: &Search, records: &[Record], csrf: &str, msg: Option<&str>) -> String {
    let mut main = format!("<h1>Audit trail</h1>\n{}\n", message(msg));
    main.push_str("<form method=\"get\" action=\"/ui/audit\" id=\"search\">");
    for (name, label, value) in [
        (
            "actor",
            "Actor (operator:NAME, admin token, or a user)",
            &s.actor,
        ),
        ("user", "User", &s.user),
        ("app", "App", &s.app),
        ("label", "Label", &s.label),
        (
            "kind",
            "Kind (change, sign_in, access, refusal, …)",
            &s.kind,
        ),
        ("node", "Node", &s.node),
        (
            "since",
            "Since (ms since the epoch, or an age: 15m, 2h, 7d)",
            &s.since,
        ),
        ("until", "Until", &s.until),
    ] {
        let _ = write!(
            main,
            "<label>{label} <input type=\"text\" name=\"{name}\" value=\"{}\"></label>",
            escape_html(value)
        );
    }
    main.push_str("<button type=\"submit\">Search</button></form>\n");
    main.push_str(
        "<section id=\"audit\" data-live data-events=\"/ui/audit/events\">\
         <table id=\"audit-table\"><tr><th>When (UTC)</th><th>Node</th><th>#</th><th>Kind</th>\
         <th>Actor</th><th>App</th><th>Record</th></tr>",
    );
    for r in records {
        let e = &r.event;
        let _ = write!(
            main,
            "<tr data-kind=\"{kind}\"><td>{when}</td><td>{node}</td><td>{seq}</td><td>{kind}</td>\
             <td class=\"actor\">{actor}</td><td class=\"app\">{app}</td><td><code>{json}</code></td></tr>",
            kind = escape_html(e.kind()),
            when = utc(r.at_ms),
            node = escape_html(&r.node),
            seq = r.seq,
            actor = escape_html(e.actor().unwrap_or("")),
            app = escape_html(e.app().unwrap_or("")),
            json = escape_html(&serde_json::to_string(e).unwrap_or_default()),
        );
    }
    main.push_str("</table></section>");
    document("Audit trail", Some(csrf), &main)
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_core::audit::Event;

    #[test]
    fn every_field_is_text() {
        let r = Record {
            seq: 1,
            at_ms: 0,
            node: "<b>n</b>".into(),
            event: Event::Change {
                actor: "<img src=x onerror=alert(1)>".into(),
                method: "POST".into(),
                route: "/v1/apps/{name}/scale".into(),
                target: Some("<script>x</script>".into()),
                outcome: "200".into(),
                before: None,
                after: None,
            },
            prev: String::new(),
            hash: String::new(),
        };
        let s = Search {
            actor: "\"><script>".into(),
            ..Search::default()
        };
        let html = page(&s, &[r], "c", None);
        for bad in ["<img", "<b>", "<script>x", "\"><script>"] {
            assert!(!html.contains(bad), "{bad}: {html}");
        }
        assert_eq!(utc(86_400_000 + 3_661_000), "1970-01-02 01:01:01");
    }
}
