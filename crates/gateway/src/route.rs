//! Where a request goes, the same rule for every path: an app by host name, then by
//! `/apps/<name>/`; within an app, its static files or its instances; and whether the user's
//! groups admit them to it.

use warden_core::AppSpec;

use crate::error::GatewayError;
use crate::views::{User, Views};

/// The app a request for `target` (path and query) with Host `host` goes to, and where in
/// `target` the app's own target starts: by host name first, then by `/apps/<name>/`.
pub(crate) fn app_route<'a>(
    views: &'a Views,
    host: Option<&str>,
    target: &'a str,
) -> Option<(&'a str, usize)> {
    let host = host.map(|h| h.rsplit_once(':').map_or(h, |(name, _)| name));
    // Hosts are kept in lower case; most requests send theirs so, and need no copy.
    if let Some(app) = host.and_then(|h| views.hosts.get(lowercase(h).as_ref())) {
        return Some((app.as_str(), 0));
    }
    let path = target.split('?').next().unwrap_or(target);
    let (app, _) = path.strip_prefix("/apps/")?.split_once('/')?;
    Some((app, "/apps/".len() + app.len()))
}

fn lowercase(h: &str) -> std::borrow::Cow<'_, str> {
    if h.bytes().any(|b| b.is_ascii_uppercase()) {
        h.to_ascii_lowercase().into()
    } else {
        h.into()
    }
}

/// The path within the app's static directory that `path_and_query` asks for, if the app has
/// one and the path is under its static prefix.
pub(crate) fn static_path<'a>(spec: &AppSpec, path_and_query: &'a str) -> Option<&'a str> {
    spec.static_dir.as_ref()?;
    let path = path_and_query.split('?').next().unwrap_or("/");
    path.strip_prefix(spec.static_prefix.as_str())
}

/// Whether `user` is in a group `spec` admits (every user, when it names none).
pub(crate) fn admit(spec: &AppSpec, user: &User) -> Result<(), GatewayError> {
    let groups = &user.record.groups;
    if spec.groups.is_empty() || spec.groups.iter().any(|g| groups.contains(g)) {
        return Ok(());
    }
    Err(GatewayError::Forbidden {
        user: user.record.name.clone(),
        app: spec.name.clone(),
        groups: spec.groups.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apps_are_routed_by_host_name_then_by_path() {
        let mut views = Views::default();
        views
            .hosts
            .insert("demo.example".to_owned(), "demo".to_owned());
        assert_eq!(
            app_route(&views, Some("Demo.Example:7700"), "/x?y=1"),
            Some(("demo", 0))
        );
        assert_eq!(
            app_route(&views, Some("other"), "/apps/a/b?c=/d"),
            Some(("a", 7))
        );
        assert_eq!(app_route(&views, None, "/apps/a?x=/y"), None);
        assert_eq!(app_route(&views, None, "/healthz"), None);
    }
}
