//! The `RequestLog` seam: the request lines a node's gateway keeps per app (what Heroku's
//! router prints), read by the API of the same process for `warden logs` without the API
//! importing the gateway.
//!
//! A line holds the time, method, path without its query string, status, duration, instance
//! and label: never a query string, header, cookie or user name, which may carry secrets.

use crate::model::utc_text;

/// One request the gateway answered through an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestLine {
    /// When the answer came, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The method, control characters replaced and bounded in length.
    pub method: String,
    /// The path without its query string, control characters replaced and bounded in length.
    pub path: String,
    /// The instance's status code.
    pub status: u16,
    /// From sending to the instance until its answer's head, in milliseconds.
    pub duration_ms: u64,
    /// The instance that answered.
    pub instance: String,
    /// The label the request was served at.
    pub label: String,
}

/// What a gateway kept of one app's requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestLines {
    /// The newest lines asked for, oldest first.
    pub lines: Vec<RequestLine>,
    /// Why lines may be missing (the gateway keeps the lines of a bounded number of apps).
    pub note: Option<String>,
}

/// The request lines of this node's gateway.
pub trait RequestLog: Send + Sync {
    /// The newest `n` request lines of `app` this gateway served, oldest first.
    fn recent(&self, app: &str, n: usize) -> RequestLines;
}

/// `ms` since the Unix epoch as RFC 3339 in UTC with milliseconds: `2026-01-02T03:04:05.678Z`.
pub fn rfc3339_ms(ms: u64) -> String {
    format!("{}.{:03}Z", utc_text(ms).replace(' ', "T"), ms % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_reads_as_rfc3339_with_milliseconds() {
        assert_eq!(rfc3339_ms(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
