//! The gateway's connection phases and TLS handshakes, summarised from its Prometheus metrics
//! for `warden status` (seed 004 Figure 5: where connections spend their time).

use serde_json::{json, Value};

use crate::table;

/// Phases in the order a connection goes through them.
const PHASES: [&str; 5] = [
    "handshake_full",
    "handshake_resumed",
    "request",
    "service",
    "idle",
];

/// The value of the sample named exactly `series` (name and labels), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// `{"phases": {phase: {count, mean_ms}}, "tls": {...}}` from the metrics text.
pub(crate) fn summary(text: &str) -> Value {
    let metric = "warden_gateway_connection_phase_seconds";
    let mut phases = serde_json::Map::new();
    for p in PHASES {
        let count = sample(text, &format!("{metric}_count{{phase=\"{p}\"}}")).unwrap_or(0.0);
        let sum = sample(text, &format!("{metric}_sum{{phase=\"{p}\"}}")).unwrap_or(0.0);
        let mean_ms = if count > 0.0 {
            sum / count * 1000.0
        } else {
            0.0
        };
        phases.insert(p.into(), json!({ "count": count, "mean_ms": mean_ms }));
    }
    let hs = |r: &str| {
        sample(
            text,
            &format!("warden_gateway_tls_handshakes_total{{result=\"{r}\"}}"),
        )
        .unwrap_or(0.0)
    };
    json!({
        "phases": phases,
        "tls": {
            "full": hs("full"),
            "resumed": hs("resumed"),
            "failed": hs("failed"),
            "refused": sample(text, "warden_gateway_tls_admission_refused_total").unwrap_or(0.0),
        }
    })
}

pub(crate) fn print(g: &Value) {
    let rows = PHASES.iter().map(|p| {
        let v = &g["phases"][p];
        vec![
            (*p).to_owned(),
            format!("{}", v["count"].as_f64().unwrap_or(0.0)),
            format!("{:.3} ms", v["mean_ms"].as_f64().unwrap_or(0.0)),
        ]
    });
    table::print(&["CONNECTION PHASE", "COUNT", "MEAN"], rows);
    let t = &g["tls"];
    let n = |k: &str| t[k].as_f64().unwrap_or(0.0);
    println!(
        "TLS handshakes: {} full, {} resumed, {} failed; {} full handshakes refused by admission control",
        n("full"),
        n("resumed"),
        n("failed"),
        n("refused")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn means_come_from_sum_and_count() {
        let text = "\
warden_gateway_connection_phase_seconds_sum{phase=\"service\"} 0.5
warden_gateway_connection_phase_seconds_count{phase=\"service\"} 4
warden_gateway_tls_handshakes_total{result=\"resumed\"} 7
warden_gateway_tls_admission_refused_total 2
";
        let s = summary(text);
        assert_eq!(s["phases"]["service"]["count"], 4.0);
        assert_eq!(s["phases"]["service"]["mean_ms"], 125.0);
        assert_eq!(s["phases"]["idle"]["count"], 0.0);
        assert_eq!(s["tls"]["resumed"], 7.0);
        assert_eq!(s["tls"]["refused"], 2.0);
    }
}
