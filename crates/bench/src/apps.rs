//! The apps the benchmarks measure warden with.

use std::path::Path;

use anyhow::bail;
use serde_json::json;
use warden_test_support::Warden;

/// The app the start and idle benchmarks register.
pub(crate) const APP: &str = "bench";

/// The instance image beside `warden`, which the agent runs for each instance and which is the
/// demo app: what app commands name.
pub(crate) fn instance_image(warden: &Path) -> std::path::PathBuf {
    warden.with_file_name("warden-instance")
}

/// Registers the demo app again as a plain process, as the peers' upstream is: the gateway
/// benchmarks compare proxies, and the CPU of a process instance is its own (a sandbox's app
/// runs below a helper, in a pid namespace of its own). `warden up --demo` registers it for
/// the node's default driver, the sandbox where the node can make one.
pub(crate) fn demo_as_process(w: &Warden, warden: &Path) -> anyhow::Result<()> {
    let r = w.api("DELETE", "/v1/apps/demo", None);
    if r.status != 204 {
        bail!("could not remove the demo app: {}", r.text());
    }
    let exe = warden_test_support::runnable_by_instances(warden)
        .display()
        .to_string();
    let spec = json!({
        "name": "demo",
        "driver": "process",
        "command": [exe, "demo-app"],
        "hosts": ["demo.localhost"],
    });
    let r = w.api("POST", "/v1/apps", Some(spec));
    if r.status != 201 {
        bail!("could not register the demo app as a process: {}", r.text());
    }
    Ok(())
}
