//! The apps the benchmarks measure warden with.

use std::path::Path;

use anyhow::bail;
use serde_json::json;
use warden_test_support::Warden;

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
