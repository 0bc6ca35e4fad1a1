//! Cold and warm first-request latency through the gateway.

use std::path::Path;
use std::time::Instant;

use anyhow::bail;
use warden_test_support::Launch;

use crate::percentile;

pub(crate) fn run(runs: usize, warden: &Path, out: &Path) -> anyhow::Result<()> {
    if !warden.exists() {
        bail!(
            "{} does not exist; build it with `cargo build --release`",
            warden.display()
        );
    }
    std::fs::create_dir_all(out)?;
    let mut rows = vec!["run,cold_ms,warm_ms,direct_ms".to_owned()];
    let (mut cold, mut warm, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        let w = Launch::new(warden).log("info").start();
        crate::apps::demo_as_process(&w, warden)?;
        let pw = w.password("alice");
        let t = Instant::now();
        let first = w.get_as("alice", &pw, "/apps/demo/");
        let c = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let second = w.get_as("alice", &pw, "/apps/demo/");
        let h = t.elapsed().as_secs_f64() * 1e3;
        if first.status != 200
            || second.status != 200
            || first.json()["instance"] != second.json()["instance"]
        {
            bail!(
                "run {run}: unexpected answers {} / {}",
                first.status,
                second.status
            );
        }
        // The floor: the same request straight to the instance, no gateway, no Argon2id.
        let addr = w.api("GET", "/v1/instances", None).json()[0]["addr"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let t = Instant::now();
        let bare = warden_test_support::request("GET", &format!("http://{addr}/"), &[], b"");
        let d = t.elapsed().as_secs_f64() * 1e3;
        if bare.status != 200 {
            bail!("run {run}: the instance answered {} directly", bare.status);
        }
        rows.push(format!("{run},{c:.3},{h:.3},{d:.3}"));
        cold.push(c);
        warm.push(h);
        direct.push(d);
    }
    let csv = out.join("first-request.csv");
    std::fs::write(&csv, rows.join("\n") + "\n")
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", csv.display()))?;
    cold.sort_by(f64::total_cmp);
    warm.sort_by(f64::total_cmp);
    direct.sort_by(f64::total_cmp);
    println!("| request | median ms | p90 ms | min ms | max ms |");
    println!("|---|---|---|---|---|");
    for (name, v) in [
        ("first (cold: start instance)", &cold),
        ("second (warm)", &warm),
        ("direct to the instance (floor)", &direct),
    ] {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} |",
            percentile(v, 0.5),
            percentile(v, 0.9),
            v[0],
            v[v.len() - 1]
        );
    }
    println!("\n{runs} runs; samples in {}", csv.display());
    Ok(())
}
