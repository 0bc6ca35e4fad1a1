//! The store's key layout. Every key is a sequence of `/`-separated tokens; prefix queries match
//! whole tokens only, so `apps/web` finds `apps/web/spec` but never `apps/webshop/spec`.

/// Key of an app's spec.
pub fn app_spec(app: &str) -> String {
    format!("apps/{app}/spec")
}

/// The app whose spec is stored at `key`, if `key` is one made by [`app_spec`].
pub fn app_of_spec(key: &str) -> Option<&str> {
    key.strip_prefix("apps/")?.strip_suffix("/spec")
}

/// The text every key of app `app`'s process types' specs (`apps/<app>~<type>/spec`) begins
/// with, for the store's `list_text_prefix`: no other app's key begins so, since no app's name
/// holds the separator.
pub fn process_specs_start(app: &str) -> String {
    format!("apps/{app}{}", crate::PROCESS_SEP)
}

/// Prefix under which every app's records live.
pub const APPS: &str = "apps";

/// Key of a user record.
pub fn user(name: &str) -> String {
    format!("users/{name}")
}

/// Prefix of all users.
pub const USERS: &str = "users";

/// Key of an operator record (an API principal; not an app user).
pub fn operator(name: &str) -> String {
    format!("operators/{name}")
}

/// Prefix of all operators.
pub const OPERATORS: &str = "operators";

/// Key of an operator's token, by the SHA-256 (hex) of the token; the token is never stored.
pub fn api_token(token_hash: &str) -> String {
    format!("api-tokens/{token_hash}")
}

/// Prefix of all operators' tokens.
pub const API_TOKENS: &str = "api-tokens";

/// A dashboard session, by the SHA-256 (hex) of the id its browser's cookie holds.
pub fn ui_session(id_hash: &str) -> String {
    format!("{UI_SESSIONS}/{id_hash}")
}
/// Prefix of dashboard sessions.
pub const UI_SESSIONS: &str = "ui-sessions";

/// Key of a node record.
pub fn node(id: &str) -> String {
    format!("nodes/{id}")
}

/// Prefix of all nodes.
pub const NODES: &str = "nodes";

/// Key of an instance record.
pub fn instance(app: &str, id: &str) -> String {
    format!("instances/{app}/{id}")
}

/// Prefix of all instances of one app.
pub fn app_instances(app: &str) -> String {
    format!("instances/{app}")
}

/// Prefix of all instances.
pub const INSTANCES: &str = "instances";

/// Key of a login session, by the SHA-256 (hex) of its token; the token itself is never stored.
pub fn session(token_hash: &str) -> String {
    format!("sessions/{token_hash}")
}

/// Prefix of all sessions.
pub const SESSIONS: &str = "sessions";

/// Key of an OpenID Connect sign-in in flight, by the SHA-256 (hex) of its `state`; the state
/// itself is never stored. Any gateway can finish the sign-in another started.
pub fn oidc_flow(state_hash: &str) -> String {
    format!("{OIDC_FLOWS}/{state_hash}")
}

/// Prefix of the OpenID Connect sign-ins in flight (no view watches it: a callback reads its
/// one record and deletes it).
pub const OIDC_FLOWS: &str = "oidc/flows";

/// Key of an identity provider added through the API.
pub fn oidc_provider(id: &str) -> String {
    format!("{OIDC_PROVIDERS}/{id}")
}

/// Prefix of the identity providers added through the API (every gateway follows it).
pub const OIDC_PROVIDERS: &str = "oidc/providers";
/// Key of an operator's device sign-in in flight (`warden login --provider`), by the SHA-256
/// (hex) of the handle the API gave the CLI; the handle itself is never stored.
pub fn oidc_device(handle_hash: &str) -> String {
    format!("{OIDC_DEVICES}/{handle_hash}")
}

/// Key of a dashboard sign-in in flight through a provider (`/ui/login/oidc/<id>`), by the
/// SHA-256 (hex) of its `state`.
pub fn oidc_ui_flow(state_hash: &str) -> String {
    format!("{OIDC_UI_FLOWS}/{state_hash}")
}

/// Prefix of the dashboard's sign-ins in flight (leased; no view watches it).
pub const OIDC_UI_FLOWS: &str = "oidc/ui-flows";

/// Prefix of the device sign-ins in flight (leased; no view watches it).
pub const OIDC_DEVICES: &str = "oidc/devices";

/// Key of the restart state of an app's kept instances on one node.
pub fn health(app: &str, node: &str) -> String {
    format!("health/{app}/{node}")
}

/// Prefix of all restart states.
pub const HEALTH: &str = "health";

/// Key of the placement: how many instances of each app's label each agent node keeps.
/// Written only by the scheduler, by compare-and-swap.
pub const PLACEMENT: &str = "cluster/placement";

/// Key naming the agent node that runs the scheduler, under that node's lease.
pub const SCHEDULER: &str = "cluster/scheduler";

/// Key of a node's drain order (`warden nodes drain`); stays until undrained.
pub fn drain(node: &str) -> String {
    format!("drains/{node}")
}

/// Prefix of all drain orders.
pub const DRAINS: &str = "drains";

/// The node a drain order at `key` is for.
pub fn node_of_drain(key: &str) -> Option<&str> {
    key.strip_prefix("drains/")
}

/// Key of release `number` of `app`; numbers are zero-padded so that keys sort in order.
pub fn release(app: &str, number: u64) -> String {
    format!("releases/{app}/{number:010}")
}

/// Prefix of every release of `app`.
pub fn releases(app: &str) -> String {
    format!("releases/{app}")
}

/// Key of the clearance lattice.
pub const LATTICE: &str = "lattice";

/// True when `key` lies under `prefix` by whole tokens: it equals the prefix or continues it
/// with `/`. The empty prefix matches everything. A trailing `/` on the prefix is ignored.
pub fn under_prefix(prefix: &str, key: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    if prefix.is_empty() {
        return true;
    }
    match key.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// Key of the anchor of a node's audit log: the head of its chain, with a MAC.
pub fn audit_anchor(node: &str) -> String {
    format!("audit/anchors/{node}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_whole_tokens_only() {
        assert!(under_prefix("apps/web", "apps/web/spec"));
        assert!(under_prefix("apps/web", "apps/web"));
        assert!(under_prefix("apps/web/", "apps/web/spec"));
        assert!(!under_prefix("apps/web", "apps/webshop/spec"));
        assert!(!under_prefix("apps/web", "apps"));
        assert!(under_prefix("", "anything"));
        assert_eq!(app_spec("demo"), "apps/demo/spec");
        assert_eq!(app_of_spec(&app_spec("demo")), Some("demo"));
        assert_eq!(app_of_spec(&instance("demo", "x1")), None);
        assert_eq!(app_of_spec("users/demo/spec"), None);
        assert!(under_prefix(
            &app_instances("demo"),
            &instance("demo", "x1")
        ));
    }
}
