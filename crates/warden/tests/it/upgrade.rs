//! A warden whose binaries are replaced on disk while it runs, as a package upgrade does, goes
//! on starting sandboxes: its helpers and the sandbox's init run from the images it opened at
//! its start, not from their paths.

use serde_json::json;
use warden_test_support::Launch;

use crate::{BIN, INSTANCE_BIN};

#[test]
fn replacing_the_binary_on_disk_leaves_sandbox_starts_working() {
    let dir = tempfile::tempdir().unwrap();
    let installed = [(BIN, "warden"), (INSTANCE_BIN, "warden-instance")].map(|(built, name)| {
        let path = dir.path().join(name);
        if std::fs::hard_link(built, &path).is_err() {
            std::fs::copy(built, &path).unwrap();
        }
        path
    });
    let w = Launch::new(&installed[0]).start();

    // The upgrade: another program renamed over each path; the running files are gone from them.
    for path in &installed {
        let next = path.with_extension("new");
        std::fs::write(
            &next,
            "#!/bin/sh\necho 'this is not the warden that runs' >&2\nexit 3\n",
        )
        .unwrap();
        std::fs::set_permissions(&next, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        std::fs::rename(&next, path).unwrap();
    }

    w.create_demo_app(BIN, "after", json!({ "driver": "sandbox" }));
    let r = w.get_as("alice", &w.password("alice"), "/apps/after/");
    assert_eq!(
        r.status,
        200,
        "a sandbox starts after the upgrade: {}",
        r.text()
    );
}
