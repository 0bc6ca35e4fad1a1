//! Prometheus metrics of the gateway: requests by app and status, time per phase, credential
//! cache results, throttled sign-ins, connections.

use std::time::Duration;

use prometheus::{
    CounterVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry,
};

/// The gateway's metrics, registered in their own registry.
pub struct Metrics {
    pub(crate) registry: Registry,
    requests: IntCounterVec,
    /// Whole request time summed per app: with `requests`, each app's mean latency (the
    /// dashboard's metrics page); a sum, not a histogram, so a request costs one lookup more.
    app_seconds: CounterVec,
    /// `phase_seconds` by [`Phase`], looked up once: every forwarded request observes some.
    phases: [Histogram; 4],
    /// `credential_cache_total` by [`CacheResult`], looked up once: every signed-in request
    /// counts one.
    cache: [IntCounter; 3],
    pub(crate) throttled: IntCounter,
    pub(crate) connections: IntGauge,
    pub(crate) refused_connections: IntCounter,
    pub(crate) request_seconds: Histogram,
    pub(crate) conn_phase: ConnPhases,
    pub(crate) tls: TlsCounters,
}

/// A phase of a request in the gateway (`phase_seconds`'s label).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Phase {
    /// Signing the request in.
    Auth,
    /// From the instance picked until the app's answer.
    Upstream,
    /// Waiting for an instance to start.
    Start,
    /// Waiting for a turn at a password check.
    Queue,
}

/// What the credential cache said of a password check (`credential_cache_total`'s label).
#[derive(Debug, Clone, Copy)]
pub(crate) enum CacheResult {
    /// A verdict of "right" was cached.
    Hit,
    /// A verdict of "wrong" was cached.
    Negative,
    /// Nothing was cached: Argon2id ran.
    Miss,
}

/// Time per connection phase (seed 004 Figure 5), one histogram per phase.
pub(crate) struct ConnPhases {
    pub handshake_full: Histogram,
    pub handshake_resumed: Histogram,
    pub request: Histogram,
    pub service: Histogram,
    pub idle: Histogram,
}

/// TLS handshakes by outcome, and admission control's decisions.
pub(crate) struct TlsCounters {
    pub full: IntCounter,
    pub resumed: IntCounter,
    pub failed: IntCounter,
    /// Handshakes given up before their cryptography: the client had gone, or the gateway was
    /// stopping.
    pub abandoned: IntCounter,
    /// Full handshakes refused by admission control.
    pub refused: IntCounter,
    /// Offers to resume that ended in a full handshake (unknown or expired ticket).
    pub resumption_missed: IntCounter,
}

/// Buckets from 50 µs to 10 s: the gateway's own phases are sub-millisecond, starts are tens of
/// milliseconds, Argon2id is tens of milliseconds.
const BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new_custom(Some("warden_gateway".into()), None)?;
        let requests = IntCounterVec::new(
            Opts::new("requests_total", "Requests answered, by app and status"),
            &["app", "status"],
        )?;
        let app_seconds = CounterVec::new(
            Opts::new(
                "app_request_seconds_total",
                "Whole request time in the gateway summed by app (divide by requests_total for the mean)",
            ),
            &["app"],
        )?;
        let phases = HistogramVec::new(
            HistogramOpts::new("phase_seconds", "Time spent per request phase: auth, queue (waiting to verify a password), start (waiting for an instance), upstream (until the app's response head)").buckets(BUCKETS.to_vec()),
            &["phase"],
        )?;
        let cache = IntCounterVec::new(
            Opts::new(
                "credential_cache_total",
                "Password checks by cache result: hit, negative (known wrong), miss (Argon2id ran)",
            ),
            &["result"],
        )?;
        let throttled = IntCounter::new(
            "throttled_total",
            "Sign-ins refused with 429 because of earlier failures",
        )?;
        let connections = IntGauge::new("connections", "Open client connections")?;
        let refused_connections = IntCounter::new(
            "refused_connections_total",
            "Connections refused at the connection limit",
        )?;
        let request_seconds = Histogram::with_opts(
            HistogramOpts::new("request_seconds", "Whole request time in the gateway")
                .buckets(BUCKETS.to_vec()),
        )?;
        let phase_vec = HistogramVec::new(
            HistogramOpts::new("connection_phase_seconds", "Time connections spend per phase: handshake_full, handshake_resumed, request (reading a request, no service), service, idle (keep-alive wait)").buckets(BUCKETS.to_vec()),
            &["phase"],
        )?;
        let conn_phase = ConnPhases {
            handshake_full: phase_vec.with_label_values(&["handshake_full"]),
            handshake_resumed: phase_vec.with_label_values(&["handshake_resumed"]),
            request: phase_vec.with_label_values(&["request"]),
            service: phase_vec.with_label_values(&["service"]),
            idle: phase_vec.with_label_values(&["idle"]),
        };
        let handshakes = IntCounterVec::new(
            Opts::new(
                "tls_handshakes_total",
                "TLS handshakes by result: full, resumed, failed, abandoned (the client left or the gateway stopped before the handshake's cryptography)",
            ),
            &["result"],
        )?;
        let refused = IntCounter::new(
            "tls_admission_refused_total",
            "Full TLS handshakes refused by admission control",
        )?;
        let resumption_missed = IntCounter::new(
            "tls_resumption_missed_total",
            "Handshakes admitted as resumption attempts that ended as full handshakes",
        )?;
        let tls = TlsCounters {
            full: handshakes.with_label_values(&["full"]),
            resumed: handshakes.with_label_values(&["resumed"]),
            failed: handshakes.with_label_values(&["failed"]),
            abandoned: handshakes.with_label_values(&["abandoned"]),
            refused: refused.clone(),
            resumption_missed: resumption_missed.clone(),
        };
        registry.register(Box::new(phase_vec))?;
        registry.register(Box::new(handshakes))?;
        registry.register(Box::new(refused))?;
        registry.register(Box::new(resumption_missed))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(app_seconds.clone()))?;
        registry.register(Box::new(phases.clone()))?;
        registry.register(Box::new(cache.clone()))?;
        registry.register(Box::new(throttled.clone()))?;
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(refused_connections.clone()))?;
        registry.register(Box::new(request_seconds.clone()))?;
        Ok(Self {
            registry,
            requests,
            app_seconds,
            phases: ["auth", "upstream", "start", "queue"].map(|p| phases.with_label_values(&[p])),
            cache: ["hit", "negative", "miss"].map(|r| cache.with_label_values(&[r])),
            throttled,
            connections,
            refused_connections,
            request_seconds,
            conn_phase,
            tls,
        })
    }

    pub(crate) fn request(&self, app: &str, status: u16) {
        // Statuses are three digits (RFC 9110 §15); anything else is written out.
        let (digits, other);
        let status = if (100..1000).contains(&status) {
            digits = status_digits(status);
            std::str::from_utf8(&digits).unwrap_or_default()
        } else {
            other = status.to_string();
            &other
        };
        self.requests.with_label_values(&[app, status]).inc();
    }

    /// A request of `app` answered after `seconds`: the whole-gateway histogram and the app's sum.
    pub(crate) fn request_time(&self, app: &str, seconds: f64) {
        self.request_seconds.observe(seconds);
        self.app_seconds.with_label_values(&[app]).inc_by(seconds);
    }

    pub(crate) fn phase(&self, phase: Phase, d: Duration) {
        self.phases[phase as usize].observe(d.as_secs_f64());
    }

    pub(crate) fn cache(&self, result: CacheResult) {
        self.cache[result as usize].inc();
    }

    /// The metrics in Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus::TextEncoder::new().encode_utf8(&self.registry.gather(), &mut out);
        out
    }
}

/// The three digits of a status in 100..=999, without formatting machinery: the request path
/// writes one per request.
pub(crate) fn status_digits(status: u16) -> [u8; 3] {
    let s = status % 1000;
    [
        b'0' + (s / 100) as u8,
        b'0' + (s / 10 % 10) as u8,
        b'0' + (s % 10) as u8,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_digits_are_the_status() {
        for status in [100, 200, 204, 403, 429, 503, 599, 999] {
            assert_eq!(status_digits(status), status.to_string().as_bytes());
        }
    }
}
