//! Running wrk and reading its report.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

/// What one wrk run measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome {
    pub requests_per_sec: f64,
    pub mean_latency_ms: f64,
    pub requests: u64,
    pub non_2xx: u64,
    pub socket_errors: u64,
}

/// Runs `wrk` against `url` for `seconds` with `connections`, each request carrying `headers`,
/// or built by the Lua `script` when given.
pub(crate) fn run(
    url: &str,
    connections: usize,
    seconds: u64,
    headers: &[String],
    script: Option<&Path>,
) -> anyhow::Result<Outcome> {
    let mut cmd = Command::new("wrk");
    cmd.args([
        "-t",
        "2",
        "-c",
        &connections.to_string(),
        "-d",
        &format!("{seconds}s"),
        "--timeout",
        "10s",
    ]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    if let Some(s) = script {
        cmd.arg("-s").arg(s);
    }
    cmd.arg(url);
    let out = cmd
        .output()
        .context("running wrk (install it with `apt-get install wrk`)")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "wrk failed: {}{}",
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse(&text).with_context(|| format!("unexpected wrk output:\n{text}"))
}

fn millis(v: &str) -> Option<f64> {
    let (num, factor) = if let Some(n) = v.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix("m") {
        (n, 60_000.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1000.0)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|n| n * factor)
}

pub(crate) fn parse(text: &str) -> Option<Outcome> {
    let mut o = Outcome {
        requests_per_sec: 0.0,
        mean_latency_ms: 0.0,
        requests: 0,
        non_2xx: 0,
        socket_errors: 0,
    };
    let mut seen = (false, false);
    for line in text.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Latency", avg, ..] => {
                o.mean_latency_ms = millis(avg)?;
                seen.0 = true;
            }
            ["Requests/sec:", v] => {
                o.requests_per_sec = v.parse().ok()?;
                seen.1 = true;
            }
            [n, "requests", "in", ..] => o.requests = n.parse().ok()?,
            ["Non-2xx", "or", "3xx", "responses:", n] => o.non_2xx = n.parse().ok()?,
            ["Socket", "errors:", rest @ ..] => {
                o.socket_errors = rest
                    .iter()
                    .filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok())
                    .sum();
            }
            _ => {}
        }
    }
    (seen.0 && seen.1).then_some(o)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_a_report() {
        let text = "Running 5s test @ http://127.0.0.1:1/\n  2 threads and 50 connections\n  Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency   741.12us  200.00us   5.00ms   90.00%\n    Req/Sec    33.00k     1.00k   35.00k    70.00%\n  330000 requests in 5.00s, 40.00MB read\n  Socket errors: connect 0, read 2, write 0, timeout 1\n  Non-2xx or 3xx responses: 12\nRequests/sec:  66000.50\nTransfer/sec:      8.00MB\n";
        let o = super::parse(text).expect("parses");
        assert!((o.mean_latency_ms - 0.74112).abs() < 1e-9);
        assert_eq!((o.requests, o.non_2xx, o.socket_errors), (330000, 12, 3));
        assert!((o.requests_per_sec - 66000.5).abs() < 1e-9);
    }
}
