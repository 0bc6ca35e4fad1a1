//! The users page's template. Every value through [`escape_html`]; no password field is ever
//! filled in.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use warden_api_types::{SessionView, UserView};

use super::pages::{document, escape_html, message};

/// The users, their sessions at the gateways, and the forms.
pub(crate) fn page(users: &[UserView], sessions: &[SessionView], csrf: &str) -> String {
    let c = escape_html(csrf);
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for s in sessions {
        *count.entry(s.user.as_str()).or_default() += 1;
    }
    let mut main = format!("<h1>Users</h1>\n{}\n", message(None));
    // The table is live (replaced when the store changes); the forms are not, so what an
    // operator types is never wiped by an update.
    main.push_str(
        "<section id=\"users\" data-live><table id=\"users-table\"><tr><th>User</th>\
         <th>Clearance</th><th>Groups</th><th>Provider</th><th>Sessions</th></tr>",
    );
    for u in users {
        let name = escape_html(&u.name);
        let provider = u
            .provider
            .as_ref()
            .map(|p| escape_html(&p.id))
            .unwrap_or_default();
        let _ = write!(
            main,
            "<tr data-user=\"{name}\"><td class=\"name\">{name}</td><td class=\"clearance\">{clearance}</td>\
             <td class=\"groups\">{groups}</td><td class=\"provider\">{provider}</td>\
             <td class=\"sessions\">{sessions}</td></tr>",
            clearance = escape_html(&u.clearance),
            groups = escape_html(&u.groups.join(", ")),
            sessions = count.get(u.name.as_str()).copied().unwrap_or(0),
        );
    }
    main.push_str("</table></section>\n");
    let field = format!("<input type=\"hidden\" name=\"csrf\" value=\"{c}\">");
    let who = "<label>User <input type=\"text\" name=\"name\" required></label>";
    let _ = write!(
        main,
        "<h2>Change a user</h2>\
         <form method=\"post\" action=\"/ui/users/clearance\" id=\"set-clearance\" data-fetch>{field}{who}\
         <label>New clearance <input type=\"text\" name=\"clearance\" required></label>\
         <button type=\"submit\">Set clearance</button></form>\
         <form method=\"post\" action=\"/ui/users/password\" id=\"reset-password\" data-fetch>{field}{who}\
         <label>New password <input type=\"password\" name=\"password\" autocomplete=\"new-password\" required></label>\
         <button type=\"submit\">Reset password</button></form>\
         <form method=\"post\" action=\"/ui/users/end-sessions\" id=\"end-sessions\" data-fetch>{field}{who}\
         <button type=\"submit\">End sessions</button></form>\n\
         <h2>New user</h2><form method=\"post\" action=\"/ui/users\" id=\"create-user\" data-fetch>{field}\
         <label>Name <input type=\"text\" name=\"name\" required></label>\
         <label>Password <input type=\"password\" name=\"password\" autocomplete=\"new-password\" required></label>\
         <label>Clearance <input type=\"text\" name=\"clearance\" required></label>\
         <label>Groups <input type=\"text\" name=\"groups\"></label>\
         <button type=\"submit\">Create user</button></form>"
    );
    document("Users", Some(csrf), &main)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_are_text() {
        let u = UserView {
            name: "<img src=x onerror=alert(1)>".into(),
            clearance: "<b>top</b>".into(),
            groups: vec!["\"><script>".into()],
            provider: None,
        };
        let html = page(&[u], &[], "c");
        assert!(!html.contains("<img") && !html.contains("<b>") && !html.contains("<script>"));
        assert!(
            html.contains("&lt;img src=x onerror=alert(1)&gt;"),
            "{html}"
        );
    }
}
