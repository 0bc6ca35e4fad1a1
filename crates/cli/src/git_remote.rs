//! `warden git-remote APP`: the URL to `git push` an app to.

use crate::config::Endpoint;

/// Prints the app's git remote on standard output (so that `git remote add warden "$(warden
/// git-remote APP)"` works) and how to use it on standard error.
pub(crate) fn print(endpoint: &Endpoint, app: &str, json: bool) -> anyhow::Result<()> {
    warden_core::validate_name("app", app)?;
    let url = url(&endpoint.api, app);
    if json {
        println!("{}", serde_json::json!({ "app": app, "url": url }));
        return Ok(());
    }
    println!("{url}");
    eprintln!(
        "add it with `git remote add warden {url}`, then `git push warden main`; git asks for a user name (any) and a password: give an operator token (`warden tokens create`), which git's credential store keeps"
    );
    Ok(())
}

/// The remote of `app` at the API `api` (its base URL, `https://` when the API is behind TLS).
fn url(api: &str, app: &str) -> String {
    format!("{}/v1/apps/{app}/git", api.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_remote_is_under_the_apps_path() {
        assert_eq!(
            super::url("https://warden.example.com/", "web"),
            "https://warden.example.com/v1/apps/web/git"
        );
    }
}
