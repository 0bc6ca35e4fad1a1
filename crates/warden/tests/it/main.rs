//! warden from outside, through the real binary: one test binary, one module per part of the
//! platform. Every test starts `warden up` on ephemeral ports (see `warden-test-support`), talks
//! to it over real sockets and asserts what a user or an attacker would see.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

/// The `warden` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_warden");

/// The instance image beside it, which runs the demo app and the sandbox's init.
pub const INSTANCE_BIN: &str = env!("CARGO_BIN_EXE_warden-instance");

/// The instance image at a path that `process` instances, which never run as root, can run
/// (see [`warden_test_support::runnable_by_instances`]): for app commands (`APP demo-app`).
pub fn app_bin() -> String {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        warden_test_support::runnable_by_instances(std::path::Path::new(INSTANCE_BIN))
            .display()
            .to_string()
    })
    .clone()
}

/// A directory every uid may write: where apps run as unprivileged uids leave what the test
/// reads.
pub fn open_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    dir
}

/// The sum of the metric lines of `w`'s API that start with `line_start`.
pub fn metric(w: &warden_test_support::Warden, line_start: &str) -> f64 {
    let text = warden_test_support::request("GET", &format!("{}/metrics", w.api), &[], b"").text();
    text.lines()
        .filter(|l| l.starts_with(line_start))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The sandbox probe, an example of this package that `cargo test` builds beside the tests
/// (it never ships): it tries to escape its sandbox and reports each attempt.
pub fn probe() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/it-<hash> → target/<profile>/examples/sandbox-probe
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join("sandbox-probe"))
        .unwrap();
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p warden --examples`",
        path.display()
    );
    path
}

mod api;
mod api_limits;
mod api_only;
mod app_contract;
mod audit;
mod audit_access;
mod audit_closed;
mod audit_cluster;
mod audit_crash;
mod audit_declassified;
mod browser;
mod build_reuse;
mod cli;
mod cluster;
mod cluster_routing;
mod connections;
mod crash_bursts;
mod dashboard;
mod dashboard_ops;
mod dashboard_sso;
mod dashboard_users;
mod data_apps;
mod data_attacks;
mod data_cluster;
mod data_declassify;
mod data_demo;
mod data_faults;
mod data_flask;
mod data_release;
mod data_roles;
mod data_sockets;
mod deploy;
mod ends;
mod env_rules;
mod first_release;
mod frozen_node;
mod gateway;
mod gateway_starts;
mod git_remote;
mod git_remote_holes;
mod healing;
mod idle_memory;
mod install;
mod instance_image;
mod interrupted;
mod isolation;
mod lattice;
mod lifetimes;
mod logs;
mod node_port_flood;
mod oidc;
mod oidc_api;
mod oidc_cluster;
mod oidc_issuer;
mod operators;
mod operators_idp;
mod operators_idp_poll;
mod orphans;
mod packaging;
mod pools;
mod procfile;
mod restart;
mod rollout;
mod routing;
mod run;
mod sandbox;
mod seccomp;
mod security;
mod settings;
mod sign_in_floods;
mod sign_in_page;
mod statics;
mod stdio;
mod stopping;
mod store_backup;
mod store_durability;
mod store_integrity;
mod tls;
mod tls_gone;
mod upgrade;
mod uploads;
mod walking_skeleton;
mod workers;
