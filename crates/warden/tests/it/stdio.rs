//! What an instance's standard descriptors are, seen from inside by a program that does not
//! repair them itself (a shell; Rust's runtime would reopen a closed stdin on /dev/null before
//! `main` and hide the fault).

use serde_json::json;
use warden_test_support::Warden;

use crate::{probe, BIN};

/// Prints what the shell's own descriptor 0 is, then serves as the probe. With 0 closed, the
/// pipe of the command substitution takes it, as an app's first socket would.
const REPORT: &str = r#"echo "stdin is $(readlink /proc/$$/fd/0)"; exec "$APP""#;

#[test]
fn instances_of_both_drivers_start_with_stdin_on_dev_null() {
    let w = Warden::demo(BIN);
    let probe = warden_test_support::runnable_by_instances(&probe());
    let dir = probe.parent().unwrap().to_str().unwrap().to_owned();
    for (name, driver) in [("jail", "sandbox"), ("plain", "process")] {
        // The sandbox shows the workdir, where the shell finds the probe.
        let spec = json!({
            "name": name,
            "driver": driver,
            "command": ["/bin/sh", "-c", REPORT],
            "workdir": dir,
            "env": { "APP": probe.to_str().unwrap() },
        });
        let r = w.api("POST", "/v1/apps", Some(spec));
        assert_eq!(r.status, 201, "{}", r.text());
        let r = w.get_as("alice", &w.password("alice"), &format!("/apps/{name}/"));
        assert_eq!(r.status, 200, "{driver}: {}", r.text());
        let id = r.json()["instance"].as_str().unwrap().to_owned();
        let out = w
            .api("GET", &format!("/v1/instances/{id}/logs?lines=200"), None)
            .text();
        assert!(
            out.contains("stdin is /dev/null\n"),
            "{driver} instance:\n{out}"
        );
    }
}
