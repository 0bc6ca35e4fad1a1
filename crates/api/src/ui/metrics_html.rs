//! The metrics page's template: per app, the last interval's figures and a small SVG chart of
//! each over the kept samples. SVG made here from numbers only; names through [`escape_html`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use super::pages::{document, escape_html, message};

/// An app's counters at one moment: requests, server errors (5xx), seconds summed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Counts {
    pub requests: f64,
    pub errors: f64,
    pub seconds: f64,
}

/// The counters of every app at one moment.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub at: Instant,
    pub apps: BTreeMap<String, Counts>,
}

/// Per interval between two samples: (requests/s, errors/s, mean latency in ms).
fn rates(samples: &[Sample], app: &str) -> Vec<(f64, f64, f64)> {
    samples
        .windows(2)
        .map(|w| {
            let zero = Counts::default();
            let a = w[0].apps.get(app).unwrap_or(&zero);
            let b = w[1].apps.get(app).unwrap_or(&zero);
            let secs = w[1].at.duration_since(w[0].at).as_secs_f64().max(0.001);
            let n = (b.requests - a.requests).max(0.0);
            let ms = if n > 0.0 {
                (b.seconds - a.seconds).max(0.0) / n * 1000.0
            } else {
                0.0
            };
            (n / secs, (b.errors - a.errors).max(0.0) / secs, ms)
        })
        .collect()
}

/// A sparkline of `values` (120 × 30), scaled to their maximum.
fn chart(values: &[f64], what: &str) -> String {
    let max = values.iter().copied().fold(0.0_f64, f64::max);
    let n = values.len().max(2) - 1;
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let x = i as f64 * 120.0 / n as f64;
            let y = if max > 0.0 {
                29.0 - v / max * 28.0
            } else {
                29.0
            };
            format!("{x:.1},{y:.1}")
        })
        .collect();
    format!(
        "<svg viewBox=\"0 0 120 30\" width=\"120\" height=\"30\" role=\"img\" aria-label=\"{what}, last minute\">\
         <polyline points=\"{}\" fill=\"none\" stroke=\"#36c\" stroke-width=\"1.5\"/></svg>",
        points.join(" ")
    )
}

/// The page: one row per app of `apps`.
pub(crate) fn page(apps: &[String], samples: &[Sample], csrf: &str) -> String {
    let mut main = format!(
        "<h1>Metrics</h1>\n{}\n<p>From this node's gateway counters, sampled each second while \
         this page is open.</p>\n",
        message(None)
    );
    main.push_str(
        "<section id=\"metrics\" data-live data-events=\"/ui/metrics/events\">\
         <table id=\"metrics-table\"><tr><th>App</th><th>Requests/s</th><th></th>\
         <th>Errors (5xx)/s</th><th></th><th>Mean latency (ms)</th><th></th></tr>",
    );
    for app in apps {
        let r = rates(samples, app);
        let last = r.last().copied().unwrap_or_default();
        let total = samples
            .last()
            .and_then(|s| s.apps.get(app))
            .map_or(0.0, |c| c.requests);
        let col = |f: fn(&(f64, f64, f64)) -> f64| r.iter().map(f).collect::<Vec<_>>();
        let _ = write!(
            main,
            "<tr data-app=\"{name}\" data-total=\"{total}\"><td>{name}</td>\
             <td class=\"rps\">{:.1}</td><td>{}</td><td class=\"errors\">{:.1}</td><td>{}</td>\
             <td class=\"latency\">{:.1}</td><td>{}</td></tr>",
            last.0,
            chart(&col(|t| t.0), "requests per second"),
            last.1,
            chart(&col(|t| t.1), "errors per second"),
            last.2,
            chart(&col(|t| t.2), "mean latency"),
            name = escape_html(app),
        );
    }
    main.push_str("</table></section>");
    document("Metrics", Some(csrf), &main)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    #[test]
    fn rates_per_interval_and_a_chart_of_numbers() {
        let t = Instant::now();
        let s = |at: u64, requests: f64, errors: f64, seconds: f64| Sample {
            at: t + Duration::from_secs(at),
            apps: BTreeMap::from([(
                "demo".to_owned(),
                Counts {
                    requests,
                    errors,
                    seconds,
                },
            )]),
        };
        let samples = [s(0, 10.0, 0.0, 1.0), s(2, 30.0, 4.0, 2.0)];
        assert_eq!(rates(&samples, "demo"), vec![(10.0, 2.0, 50.0)]);
        let html = page(&["<b>x</b>".into()], &samples, "c");
        assert!(
            !html.contains("<b>x") && html.contains("&lt;b&gt;x"),
            "{html}"
        );
        assert!(chart(&[0.0, 2.0], "r").contains("points=\"0.0,29.0 120.0,1.0\""));
    }
}
