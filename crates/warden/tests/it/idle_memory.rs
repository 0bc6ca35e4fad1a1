//! What an idle instance costs in memory, through the real binary. The demo app and the
//! sandbox's three init processes are warden's instance image (`warden-instance`), so whatever
//! it does at start, every instance keeps: it allocates with the C library's allocator (as
//! `warden`'s roles but `up` do: mimalloc's arenas and the transparent huge pages it asks for
//! cost every small process megabytes) and never builds clap's command tree (which left a
//! quarter of a MiB of heap in each process); see docs/BENCHMARKS.md, "Idle instances".
//!
//! Measured here is the memory an instance's processes allocated (anonymous mappings: heap,
//! allocator arenas, stacks), proportionally shared, which does not depend on the build's
//! profile as the binary's own pages do; `warden-bench starts --idle-only --check` checks the
//! whole PSS of a release build.

use serde_json::json;
use warden_test_support::Warden;

use crate::{app_bin, BIN};

/// Most anonymous memory an idle demo app instance may hold, in KiB, per driver. A debug build
/// holds about 420 KiB as a plain process and 650 KiB as a sandbox (the app and its three init
/// processes); with mimalloc, 6,500 KiB as a plain process; with clap parsing the agent's
/// commands, 980 and 1,960 KiB.
const BOUND_KIB: [(&str, u64); 2] = [("process", 768), ("sandbox", 1024)];

/// The process group of `pid`, from /proc/<pid>/stat (the field after state and ppid).
fn pgid_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(2)?.parse().ok()
}

/// KiB of anonymous memory (mappings backed by no file: heap, arenas, stacks) of `pid`, as
/// proportional set size.
fn anonymous_pss_kib(pid: u32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let (mut anonymous, mut kib) = (false, 0);
    for line in smaps.lines() {
        if line.starts_with(|c: char| c.is_ascii_digit() || ('a'..='f').contains(&c)) {
            // A mapping: "start-end perms offset dev inode [path]".
            let path = line.split_whitespace().nth(5);
            anonymous = matches!(path, None | Some("[heap]") | Some("[stack]"));
        } else if let Some(v) = line.strip_prefix("Pss:").filter(|_| anonymous) {
            kib += v
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap_or(0);
        }
    }
    kib
}

/// (pid, KiB) of every process in process group `pgid`.
fn group_usage(pgid: u32) -> Vec<(u32, u64)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pgid_of(pid) == Some(pgid))
        .map(|pid| (pid, anonymous_pss_kib(pid)))
        .collect()
}

#[test]
fn an_idle_instance_holds_little_memory_with_either_driver() {
    let w = Warden::demo(BIN);
    let password = w.password("alice");
    for (driver, bound) in BOUND_KIB {
        let app = format!("lean-{driver}");
        w.create_demo_app(&app_bin(), &app, json!({ "driver": driver }));
        // Served: the runtime's threads have run and allocated what a request needs.
        for _ in 0..20 {
            let r = w.get_as("alice", &password, &format!("/apps/{app}/"));
            assert_eq!(r.status, 200, "{}", r.text());
        }
        let leader =
            w.instances()
                .iter()
                .find(|i| i["app"] == app.as_str())
                .and_then(|i| i["pid"].as_u64())
                .unwrap_or_else(|| panic!("no instance of {app} with a pid")) as u32;
        let usage = group_usage(leader);
        let total: u64 = usage.iter().map(|(_, kib)| kib).sum();
        assert!(
            !usage.is_empty() && total <= bound,
            "an idle {driver} instance holds {total} KiB of anonymous memory (pid, KiB: \
             {usage:?}), more than {bound} KiB"
        );
    }
}
