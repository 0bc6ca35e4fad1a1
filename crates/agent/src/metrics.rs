//! Prometheus metrics of the agent: how long starts take by start path, how long a slot takes
//! to prepare, and how full the pools are.

use std::time::Duration;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

/// Buckets from 100 µs to 30 s: a warm hand-out is sub-millisecond, a sandbox start is
/// milliseconds, a slow app's start is seconds.
const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// The agent's metrics, in their own registry.
pub(crate) struct Metrics {
    registry: Registry,
    /// `start_seconds` of each start path, resolved once: a start counts itself before its
    /// request goes on, so the label lookup stays off that path.
    starts: [Histogram; 3],
    pub(crate) slot_prepare: Histogram,
    pub(crate) pool: IntGaugeVec,
    oom_kills: IntCounterVec,
    /// `ready_seen_total` told, then polled.
    seen_ready: [IntCounter; 2],
}

/// How a new instance came to be.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Path {
    Jit,
    Slot,
    Warm,
}

impl Metrics {
    pub(crate) fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("warden_agent".into()), None)?;
        let starts = HistogramVec::new(
            HistogramOpts::new(
                "start_seconds",
                "Time from deciding to start an instance until it accepts a connection, by start path: jit (everything), slot (a prepared sandbox starts only the app), warm (a running spare is handed out)",
            )
            .buckets(BUCKETS.to_vec()),
            &["path"],
        )?;
        let slot_prepare = Histogram::with_opts(
            HistogramOpts::new(
                "slot_prepare_seconds",
                "Time to prepare one sandbox slot (namespaces, mounts, loopback) until it waits for its app",
            )
            .buckets(BUCKETS.to_vec()),
        )?;
        let pool = IntGaugeVec::new(
            Opts::new(
                "pool_ready",
                "Prepared slots and spare instances waiting on this node, by app, label and kind",
            ),
            &["app", "label", "kind"],
        )?;
        let oom_kills = IntCounterVec::new(
            Opts::new(
                "oom_killed_instances_total",
                "Sandboxed instances in which the kernel's out-of-memory killer stopped a process at the instance's memory limit, counted when the instance exits, by app",
            ),
            &["app"],
        )?;
        let seen_ready = IntCounterVec::new(
            Opts::new(
                "ready_seen_total",
                "Started instances that listen, by how the agent saw them accept: told (a sandbox's init said so as the app began listening) or polled (the agent's own connection attempts)",
            ),
            &["how"],
        )?;
        registry.register(Box::new(seen_ready.clone()))?;
        registry.register(Box::new(starts.clone()))?;
        registry.register(Box::new(slot_prepare.clone()))?;
        registry.register(Box::new(pool.clone()))?;
        registry.register(Box::new(oom_kills.clone()))?;
        let starts = ["jit", "slot", "warm"].map(|p| starts.with_label_values(&[p]));
        let seen_ready = ["told", "polled"].map(|h| seen_ready.with_label_values(&[h]));
        Ok(Self {
            registry,
            starts,
            slot_prepare,
            pool,
            oom_kills,
            seen_ready,
        })
    }

    /// A started instance was seen accepting: `told` by its sandbox's init, else polled.
    pub(crate) fn seen_ready(&self, told: bool) {
        self.seen_ready[usize::from(!told)].inc();
    }

    pub(crate) fn started(&self, path: Path, took: Duration) {
        let i = match path {
            Path::Jit => 0,
            Path::Slot => 1,
            Path::Warm => 2,
        };
        self.starts[i].observe(took.as_secs_f64());
    }

    pub(crate) fn oom_killed(&self, app: &str) {
        self.oom_kills.with_label_values(&[app]).inc();
    }

    pub(crate) fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = prometheus::TextEncoder::new();
        if let Err(e) = prometheus::Encoder::encode(&encoder, &self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "encoding the agent's metrics failed");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}
