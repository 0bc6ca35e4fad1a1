//! Which role each route needs: ONE table, deny by default (a route missing from it is
//! owner-only), checked against the principal's roles and the app the path names.

use warden_core::Role;

/// What a route needs, beyond a valid principal. "The app" is the path's `{name}` under
/// `/v1/apps/{name}`, the app of the instance `/v1/instances/{id}` names, or the `app` of the
/// body that starts an instance (found by `authz::app_of`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// The owner role (everything not in the table).
    Owner,
    /// Any operator: their own session and tokens.
    Any,
    /// A viewer, or a deployer of any app: overviews with no secrets in them.
    Read,
    /// A viewer, or a deployer of the app the path names.
    ReadApp,
    /// A deployer of the app the path names (what may hold secrets: config values, data).
    SecretApp,
    /// A deployer of the app the path names: a change to it.
    DeployApp,
    /// A viewer: reads across every app and user (the audit trail, users, any instance's logs).
    Viewer,
}

/// The table: (method, route template) → what it needs. Routes outside the token check
/// (`/healthz`, `/readyz`, `/metrics`, `/v1/openapi.json`, `/v1/login`, `/v1/login/device`,
/// `/v1/login/device/poll`) never reach it: they make tokens, throttled on their own.
const TABLE: &[(&str, &str, Need)] = &[
    ("GET", "/v1/status", Need::Read),
    ("GET", "/v1/apps", Need::Read),
    ("GET", "/v1/limits", Need::Read),
    ("GET", "/v1/nodes", Need::Read),
    ("GET", "/v1/lattice", Need::Read),
    ("GET", "/v1/instances", Need::Read),
    ("GET", "/v1/apps/{name}", Need::ReadApp),
    ("GET", "/v1/apps/{name}/releases", Need::ReadApp),
    (
        "GET",
        "/v1/apps/{name}/releases/{number}/log",
        Need::ReadApp,
    ),
    ("GET", "/v1/apps/{name}/logs", Need::ReadApp),
    ("GET", "/v1/apps/{name}/ps", Need::ReadApp),
    ("GET", "/v1/apps/{name}/requests", Need::ReadApp),
    ("GET", "/v1/apps/{name}/config", Need::SecretApp),
    ("GET", "/v1/apps/{name}/data", Need::SecretApp),
    ("POST", "/v1/apps/{name}/scale", Need::DeployApp),
    ("POST", "/v1/apps/{name}/releases", Need::DeployApp),
    ("POST", "/v1/apps/{name}/config", Need::DeployApp),
    ("POST", "/v1/apps/{name}/rollback", Need::DeployApp),
    ("POST", "/v1/apps/{name}/restart", Need::DeployApp),
    // `git push`: the push row; even the refs a push may update are for deployers alone.
    ("GET", "/v1/apps/{name}/git/info/refs", Need::DeployApp),
    (
        "POST",
        "/v1/apps/{name}/git/git-receive-pack",
        Need::DeployApp,
    ),
    // A deployer already runs code of their choosing at every label (a push): a one-off
    // command is no more.
    ("POST", "/v1/apps/{name}/run", Need::DeployApp),
    ("GET", "/v1/users", Need::Viewer),
    ("GET", "/v1/users/{name}", Need::Viewer),
    ("GET", "/v1/sessions", Need::Viewer),
    // DELETE /v1/users/{name}/sessions: owner only, as every change of users (no row).
    ("GET", "/v1/audit", Need::Viewer),
    ("GET", "/v1/audit/verify", Need::Viewer),
    ("GET", "/v1/instances/{id}/logs", Need::ReadApp),
    ("POST", "/v1/instances", Need::DeployApp),
    ("DELETE", "/v1/instances/{id}", Need::DeployApp),
    ("POST", "/v1/logout", Need::Any),
    ("GET", "/v1/tokens", Need::Any),
    ("POST", "/v1/tokens", Need::Any),
    ("DELETE", "/v1/tokens/{id}", Need::Any),
    // Identity providers decide who signs in at what clearance: the owner's alone.
    ("GET", "/v1/oidc/providers", Need::Owner),
    ("POST", "/v1/oidc/providers", Need::Owner),
    ("GET", "/v1/oidc/providers/{id}", Need::Owner),
    ("PATCH", "/v1/oidc/providers/{id}", Need::Owner),
    ("DELETE", "/v1/oidc/providers/{id}", Need::Owner),
];

/// What `method` on `route` (a template) needs.
pub(crate) fn need(method: &str, route: &str) -> Need {
    TABLE
        .iter()
        .find(|(m, r, _)| m.eq_ignore_ascii_case(method) && *r == route)
        .map_or(Need::Owner, |(_, _, n)| *n)
}

/// Whether `roles` may call `method` on `route` for `app` (the path's `{name}`, where the
/// route has one); `Err` says which role it needs.
pub(crate) fn check(
    roles: &[Role],
    method: &str,
    route: &str,
    app: Option<&str>,
) -> Result<(), String> {
    let need = need(method, route);
    let deploys = |app: Option<&str>| {
        roles.iter().any(|r| match r {
            Role::Deployer { apps } => app.is_some_and(|a| apps.iter().any(|x| x == a)),
            _ => false,
        })
    };
    let any_deployer = roles.iter().any(|r| matches!(r, Role::Deployer { .. }));
    let viewer = roles.contains(&Role::Viewer);
    let owner = roles.contains(&Role::Owner);
    let ok = owner
        || match need {
            Need::Owner => false,
            Need::Any => true,
            Need::Read => viewer || any_deployer,
            Need::ReadApp => viewer || deploys(app),
            Need::SecretApp | Need::DeployApp => deploys(app),
            Need::Viewer => viewer,
        };
    if ok {
        return Ok(());
    }
    let app = app.unwrap_or("?");
    Err(match need {
        Need::Owner | Need::Any => format!("{method} {route} needs the owner role"),
        Need::Read => format!("{method} {route} needs the viewer, a deployer or the owner role"),
        Need::ReadApp => format!(
            "{method} {route} needs the viewer role, the deployer role of app {app:?}, or the owner role"
        ),
        Need::SecretApp | Need::DeployApp => format!(
            "{method} {route} needs the deployer role of app {app:?} or the owner role"
        ),
        Need::Viewer => format!("{method} {route} needs the viewer or the owner role"),
    } + "; an owner can grant it with `warden operators change`")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ROUTES;

    fn deployer(apps: &[&str]) -> Vec<Role> {
        vec![Role::Deployer {
            apps: apps.iter().map(|a| a.to_string()).collect(),
        }]
    }

    /// Routes no token check guards.
    const OPEN: &[&str] = &[
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/openapi.json",
        "/v1/login",
        "/v1/login/device",
        "/v1/login/device/poll",
    ];

    /// Every route × role: the owner may everything; a viewer every read in the table but
    /// config and data and no change; a deployer of `a` what the table gives it for `a` and
    /// never for `b`.
    #[test]
    fn every_route_against_every_role() {
        let owner = vec![Role::Owner];
        let viewer = vec![Role::Viewer];
        let dep = deployer(&["a"]);
        for (method, route) in ROUTES.iter().filter(|(_, r)| !OPEN.contains(r)) {
            let m = method.to_uppercase();
            let app_scoped = route.starts_with("/v1/apps/{name}")
                || route.starts_with("/v1/instances/{id}")
                || (m == "POST" && *route == "/v1/instances");
            let (a, b) = if app_scoped {
                (Some("a"), Some("b"))
            } else {
                (None, None)
            };
            assert!(check(&owner, &m, route, a).is_ok(), "owner {m} {route}");
            let self_service = route.starts_with("/v1/tokens") || *route == "/v1/logout";
            let secret = route.ends_with("/config")
                || route.ends_with("/data")
                || route.ends_with("/backup")
                || route.starts_with("/v1/operators")
                || route.starts_with("/v1/oidc/")
                // Even the refs a push may update: the push row.
                || route.contains("/git/");
            let viewer_ok = self_service || (m == "GET" && !secret);
            assert_eq!(
                check(&viewer, &m, route, a).is_ok(),
                viewer_ok,
                "viewer {m} {route}"
            );
            let deploy_ok = self_service
                || (app_scoped
                    && (m == "GET"
                        || route.starts_with("/v1/instances")
                        || [
                            "/scale",
                            "/releases",
                            "/config",
                            "/rollback",
                            "/restart",
                            "/git-receive-pack",
                            "/run",
                        ]
                        .iter()
                        .any(|s| route.ends_with(s))
                            && m == "POST"))
                || (m == "GET"
                    && [
                        "/v1/status",
                        "/v1/apps",
                        "/v1/limits",
                        "/v1/nodes",
                        "/v1/lattice",
                        "/v1/instances",
                    ]
                    .contains(route));
            assert_eq!(
                check(&dep, &m, route, a).is_ok(),
                deploy_ok,
                "deployer {m} {route}"
            );
            if app_scoped {
                assert!(
                    check(&dep, &m, route, b).is_err(),
                    "deployer of a: {m} {route} for b"
                );
            }
            assert!(
                check(&[], &m, route, a).is_ok() == self_service,
                "no role {m} {route}"
            );
        }
    }

    #[test]
    fn a_route_missing_from_the_table_is_owner_only() {
        assert_eq!(need("GET", "/v1/somewhere-new"), Need::Owner);
        let e = check(&[Role::Viewer], "GET", "/v1/store/backup", None).unwrap_err();
        assert!(e.contains("needs the owner role"), "{e}");
        let e = check(
            &deployer(&["a"]),
            "POST",
            "/v1/apps/{name}/scale",
            Some("b"),
        )
        .unwrap_err();
        assert!(e.contains("deployer role of app \"b\""), "{e}");
    }
}
