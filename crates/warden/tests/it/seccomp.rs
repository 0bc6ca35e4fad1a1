//! The sandbox's seccomp filter and its no-new-privileges flag, each seen from inside on its
//! own: an app without capabilities is refused `mount` by the kernel anyway, and installing a
//! filter can set no-new-privileges as a side effect, so neither guard shows in the escape
//! probe's general lines.

use serde_json::json;
use warden_test_support::Warden;

use crate::{probe, BIN};

#[test]
fn the_seccomp_filter_and_no_new_privileges_each_hold_on_their_own() {
    let w = Warden::demo(BIN);
    let spec =
        json!({ "name": "jail", "driver": "sandbox", "command": [probe().to_str().unwrap()] });
    let r = w.api("POST", "/v1/apps", Some(spec));
    assert_eq!(r.status, 201, "{}", r.text());
    let r = w.get_as("alice", &w.password("alice"), "/apps/jail/");
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["instance"].as_str().unwrap().to_owned();
    let out = w
        .api("GET", &format!("/v1/instances/{id}/logs?lines=200"), None)
        .text();
    // mount(2) with an unreadable argument: EPERM from the filter, EFAULT from the kernel.
    assert!(
        out.contains("probe seccomp-mount: blocked (the filter answers EPERM)"),
        "{out}"
    );
    // The same call through x86_64's x32 table: refused by the filter, whatever the kernel
    // would do with it.
    if cfg!(target_arch = "x86_64") {
        assert!(
            out.contains("probe seccomp-x32: blocked (the filter answers EPERM)"),
            "{out}"
        );
    }
    // Where the kernel refuses a fresh /proc the app cannot read its own status.
    if !out.contains("no /proc inside") {
        assert!(
            out.contains("probe no-new-privs: blocked (NoNewPrivs: 1)"),
            "{out}"
        );
        assert!(
            out.contains("probe seccomp-mode: blocked (Seccomp: 2)"),
            "{out}"
        );
        // Emptied by the sandbox's init, before the app's exec, for it to inherit.
        assert!(
            out.contains("probe capability-sets: blocked (CapPrm: 0000000000000000, CapInh: 0000000000000000, CapBnd: 0000000000000000, CapAmb: 0000000000000000)"),
            "{out}"
        );
    }
}
