//! Releases: what an app runs after a push, a config change or a rollback.
//!
//! A push uploads a source archive; the API node builds it once into a slug (a directory that
//! holds the app and its dependencies, named by the digest of the source and how it was built)
//! and records a numbered release. Config changes and rollbacks make releases too, reusing a
//! built slug. The app's spec then names the release ([`SpecRelease`]) and the agents run its
//! command in the slug; a release is never changed after it is made, only its status (its phase).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The release an app's spec runs: which slug, under which number. Each node resolves the slug
/// to its own copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SpecRelease {
    /// The release's number.
    pub number: u64,
    /// The slug's id: 64 hex digits.
    pub slug: String,
    /// SHA-256 of the slug's archive, which a node that did not build it fetches and checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<String>,
}

/// How a slug was built from its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum BuildKind {
    /// A Python app: a virtual environment with the app's requirements.
    Python,
    /// A Node app: `npm ci --omit=dev` (or `npm install` without a lock file).
    Node,
    /// Files the gateway serves itself; no instance runs.
    Static,
    /// Nothing to build: the Procfile's command runs as it is (a prebuilt program, a script).
    Procfile,
}

impl BuildKind {
    /// Every kind, as the CLI and API spell them.
    pub const NAMES: &[&str] = &["python", "node", "static", "procfile"];

    /// The kind's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Python => "python",
            Self::Node => "node",
            Self::Static => "static",
            Self::Procfile => "procfile",
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "python" => Some(Self::Python),
            "node" => Some(Self::Node),
            "static" => Some(Self::Static),
            "procfile" => Some(Self::Procfile),
            _ => None,
        }
    }
}

/// What made a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ReleaseSource {
    /// A push of a source archive.
    Push {
        /// SHA-256 of the uploaded archive, hex.
        digest: String,
        /// Where the source came from, as the pusher described it (a directory, a git URL and
        /// commit).
        from: String,
    },
    /// `warden config set` or `unset`: the keys that changed.
    Config {
        /// The changed keys.
        changed: Vec<String>,
    },
    /// `warden rollback`: the release whose slug and config this one runs again.
    Rollback {
        /// The release rolled back to.
        to: u64,
    },
}

/// Where a release stands: the phase its delivery reached, each written to the record before
/// the next begins, so that a node killed at any point leaves a record that says where it
/// stood and the node resumes it (or fails it as interrupted) when it starts again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ReleaseStatus {
    /// A push's upload is kept on disk (its digest known) and waits for its build. Records
    /// written before phases were kept say `building`; found unfinished at start, such a record
    /// has no upload to resume from and fails as interrupted.
    #[serde(alias = "building")]
    Received,
    /// Its slug is built (slug id, kind and command known); its instance is to be tried.
    Built,
    /// One instance of it started and became ready outside all routing.
    Tried,
    /// The app's spec names it: new instances run it; earlier ones are being replaced.
    Switched,
    /// Made the app's release and rolled out: no ready instance ran an older one when its
    /// delivery ended, or the bounded wait for that ended first (it may since have been
    /// replaced).
    Released,
    /// It was not made the app's release, or not by a delivery that finished; [`FailReason`]
    /// says why. The app kept what it served.
    Failed,
}

impl ReleaseStatus {
    /// Whether its delivery has ended: nothing more happens to the release.
    pub fn finished(self) -> bool {
        matches!(self, Self::Released | Self::Failed)
    }
}

/// Why a release failed, for programs; the release's `error` says it for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum FailReason {
    /// The tree does not say how to build or run it.
    DetectFailed,
    /// Its build ran and failed, or ran out of time.
    BuildFailed,
    /// Its instance did not start or did not become ready in time.
    TrialFailed,
    /// Its release command (the Procfile's `release`) exited non-zero or ran out of time, or
    /// made a table warden cannot label.
    ReleaseFailed,
    /// A newer release serves already; this one is not applied.
    Superseded,
    /// The app was removed while the release was being made.
    AppRemoved,
    /// The release does not make a usable app (its spec is invalid, no clearance lattice).
    Refused,
    /// The app's spec kept changing while the release was being applied.
    Conflict,
    /// The node stopped before the release's phase could resume (its upload or slug is gone,
    /// or it was recorded before phases were kept).
    Interrupted,
    /// The node could not do its part (disk, store, no driver).
    Node,
}

/// A numbered release of an app. Stored at `releases/<app>/<number>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Release {
    /// The app.
    pub app: String,
    /// The release's number: 1 for the first, one more for each after.
    pub number: u64,
    /// What made it.
    pub source: ReleaseSource,
    /// The slug it runs, once built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slug: Option<String>,
    /// How the slug was built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<BuildKind>,
    /// The command instances run (the Procfile's `web`), empty for a static site.
    #[serde(default)]
    pub command: Vec<String>,
    /// What the release phase runs (the Procfile's `release`), empty when nothing. A push runs
    /// it once, before its trial; a config change or a rollback carries its slug's but does
    /// not run it (a rollback must not migrate forward).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub release_command: Vec<String>,
    /// The app's config vars as of this release (instances get them as environment); a
    /// rollback restores them.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// Who made it: the principal the API authenticated (`operator:<name>`, or `admin token`
    /// for the break-glass token). Older releases hold what the client said (user@host).
    pub by: String,
    /// When it was made, in ms since the epoch.
    pub at_ms: u64,
    /// Where it stands.
    pub status: ReleaseStatus,
    /// The app did not exist when the release was asked for: this release makes it. (Any
    /// other release needs the app still there, so one deleted meanwhile is not brought
    /// back; a release resumed after a restart knows which it is from this.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub new_app: bool,
    /// The groups the push asked the app to admit (`warden push --group`), set on the app's
    /// spec when the release serves; `None`: the app's groups stay as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<Vec<String>>,
    /// Whether the app has data, as the pushed tree's `app.toml` said (absent when it said
    /// nothing): a release that makes its app makes it so; any other must find the app so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<bool>,
    /// Why it failed, for programs (absent on records written before reasons were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<FailReason>,
    /// Why it failed, with the last lines of output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The node delivering it: the one that took the push (or the config change, the
    /// rollback), which builds it and resumes it when it starts again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The file name, under that node's `uploads/`, of the pushed archive kept until the
    /// release is built or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<String>,
}

/// Whether `s` is a slug id: 64 lowercase hex digits.
pub fn is_slug_id(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record written before phases, reasons and nodes were kept.
    fn old(status: &str) -> String {
        format!(
            r#"{{"app":"a","number":3,"source":{{"type":"push","digest":"d","from":"x"}},"by":"u","at_ms":1,"status":"{status}"}}"#
        )
    }

    #[test]
    fn records_written_before_phases_still_load() {
        let building: Release = serde_json::from_str(&old("building")).expect("building loads");
        // Unfinished, named by no node, with no upload: resumed at start as interrupted.
        assert_eq!(building.status, ReleaseStatus::Received);
        assert!(!building.status.finished());
        assert_eq!((building.node, building.upload), (None, None));
        for (text, status) in [
            ("released", ReleaseStatus::Released),
            ("failed", ReleaseStatus::Failed),
        ] {
            let r: Release = serde_json::from_str(&old(text)).expect("loads");
            assert_eq!((r.status, r.reason), (status, None));
            assert!(r.status.finished());
        }
    }

    #[test]
    fn phases_and_reasons_are_spelled_for_programs() {
        let s = serde_json::to_value(ReleaseStatus::Switched).expect("encodes");
        assert_eq!(s, "switched");
        let r = serde_json::to_value(FailReason::Interrupted).expect("encodes");
        assert_eq!(r, "interrupted");
    }
}
