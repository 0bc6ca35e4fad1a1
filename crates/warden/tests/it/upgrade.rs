//! A warden whose binary is replaced on disk while it runs, as a package upgrade does, goes on
//! starting sandboxes: its helpers run from the running image, not from the path.

use serde_json::json;
use warden_test_support::Launch;

use crate::BIN;

#[test]
fn replacing_the_binary_on_disk_leaves_sandbox_starts_working() {
    let dir = tempfile::tempdir().unwrap();
    let installed = dir.path().join("warden");
    if std::fs::hard_link(BIN, &installed).is_err() {
        std::fs::copy(BIN, &installed).unwrap();
    }
    let w = Launch::new(&installed).start();

    // The upgrade: another program renamed over the path; the running file is gone from it.
    let next = dir.path().join("warden.new");
    std::fs::write(
        &next,
        "#!/bin/sh\necho 'this is not the warden that runs' >&2\nexit 3\n",
    )
    .unwrap();
    std::fs::set_permissions(&next, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::rename(&next, &installed).unwrap();

    w.create_demo_app(BIN, "after", json!({ "driver": "sandbox" }));
    let r = w.get_as("alice", &w.password("alice"), "/apps/after/");
    assert_eq!(
        r.status,
        200,
        "a sandbox starts after the upgrade: {}",
        r.text()
    );
}
