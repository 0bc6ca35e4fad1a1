//! Records of users, instances, nodes, sessions and restart state, as stored under the keys of
//! [`crate::keys`].

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::Lifetime;

/// A user who may sign in at the gateway. Stored at `users/<name>`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct UserRecord {
    /// Login name.
    pub name: String,
    /// Argon2id hash in PHC string form (salt and parameters included). Never the password.
    pub password_hash: String,
    /// Clearance label, in the lattice's canonical text form.
    pub clearance: String,
    /// Groups the user belongs to.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Changes whenever the account is created or its password, clearance or groups change:
    /// a session is valid only for the generation it was issued for, so a changed or re-created
    /// account starts with none.
    #[serde(default)]
    pub generation: String,
    /// Set for a person who signs in through an identity provider: which one, and what decided
    /// the clearance. Such a user has no password that can sign in (`password_hash` is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderMark>,
}

/// What an identity provider said about a provider user at their last sign-in or refresh.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ProviderMark {
    /// The provider's id in warden's config.
    pub id: String,
    /// The person's subject (`sub`) at the provider: another person whose name maps to the same
    /// user name is refused, never merged.
    pub subject: String,
    /// The provider's issuer at the person's first sign-in: with `subject`, who holds this
    /// name. A later sign-in under the same provider id from another issuer (the id pointed
    /// elsewhere) is refused, as another `sub` is. Empty in records written before it was kept;
    /// the next sign-in fills it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub issuer: String,
    /// The claims the mapping rules consulted, with the values the provider sent.
    #[serde(default)]
    pub claims: BTreeMap<String, Vec<String>>,
    /// The rules that matched (`claim=value`).
    #[serde(default)]
    pub rules: Vec<String>,
    /// When the provider last said so, milliseconds since the Unix epoch.
    #[serde(default)]
    pub updated_ms: u64,
}

impl fmt::Debug for UserRecord {
    // The hash is not the password, but it is an offline-cracking target: keep it out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserRecord")
            .field("name", &self.name)
            .field("password_hash", &"<redacted>")
            .field("clearance", &self.clearance)
            .field("groups", &self.groups)
            .field("generation", &self.generation)
            .field("provider", &self.provider)
            .finish()
    }
}

/// Life stage of an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    /// Started, not yet accepting connections.
    Starting,
    /// Accepting connections.
    Ready,
    /// Accepting connections, but held back in the warm pool: no request reaches it until the
    /// agent hands it out (and it becomes `ready`).
    Spare,
    /// Being stopped without failing a request: no new request reaches it, those in flight
    /// finish (bounded), then it stops.
    Draining,
}

/// A running instance of an app. Stored at `instances/<app>/<id>` under its agent's lease, so it
/// vanishes when the agent does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct InstanceRecord {
    /// Instance id, unique across the platform.
    pub id: String,
    /// App it runs.
    pub app: String,
    /// Clearance label it serves; only users with exactly this clearance are routed to it.
    pub label: String,
    /// Node whose agent runs it.
    pub node: String,
    /// Address the gateway forwards to; stored as its string form, checked when read.
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub addr: super::InstanceAddr,
    /// Process id on its node.
    pub pid: u32,
    /// Life stage.
    pub state: InstanceState,
    /// Start time, milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// Whom it serves.
    #[serde(default)]
    pub lifetime: Lifetime,
    /// The one user it is reserved for (what `Owner::User` names); `None` for an
    /// instance anyone with its label may get, and for a per-request one. Stored and shown as
    /// `owner`, as before it had this name.
    #[serde(rename = "owner", default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Kept running by the app's desired count (not reaped when idle).
    #[serde(default)]
    pub kept: bool,
    /// The app spec's generation it was started from (`AppSpec::generation`); an instance of
    /// an older one is replaced.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub generation: String,
    /// The release of the app it runs, for an app deployed with `warden push`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<u64>,
}

// === impl InstanceRecord ===

impl InstanceRecord {
    /// The user it is reserved for, empty when none: the form `Owner::user`
    /// gives, which routing and restart keys use.
    pub fn user_key(&self) -> &str {
        self.user.as_deref().unwrap_or("")
    }
}

/// A node's load, published for placement (seed 003 §3.3.2): fractions of the host's own
/// capacity, so that hosts of different sizes compare.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct HostLoad {
    /// Fraction of memory in use (1 - MemAvailable / MemTotal).
    pub memory_used: f64,
    /// Memory available, in bytes (MemAvailable).
    #[serde(default)]
    pub memory_available_bytes: u64,
    /// Share of CPU time spent busy, all cores, smoothed over about ten seconds of one-second
    /// samples.
    #[serde(default)]
    pub cpu_busy: f64,
    /// 1-minute load average divided by the number of cores.
    pub load_per_core: f64,
    /// Instances this node runs.
    pub instances: u32,
}

impl HostLoad {
    /// One number to compare nodes by: the largest of the fractions.
    pub fn score(&self) -> f64 {
        self.memory_used.max(self.load_per_core).max(self.cpu_busy)
    }
}

/// How an app's desired count fares on one node. Stored at `health/<app>/<node>` under the
/// node's lease.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AppHealth {
    /// Per label: the restart state of its kept instances.
    pub labels: BTreeMap<String, LabelHealth>,
}

/// Restart state of one label's kept instances on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct LabelHealth {
    /// Crashes in a row without an instance staying up.
    pub crashes: u32,
    /// True once the crashes in a row reach the crash-loop threshold.
    pub crash_loop: bool,
    /// How the last instance ended.
    pub last_exit: String,
    /// The last lines the crashed instance printed.
    pub last_lines: String,
    /// The crashed instance's id; empty when the start failed before it had one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_instance: String,
    /// When the next start is allowed, milliseconds since the Unix epoch.
    pub next_start_ms: u64,
}

/// A node of the cluster, whatever roles it runs. Stored at `nodes/<id>` under the node's lease,
/// refreshed every second.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeRecord {
    /// Node id.
    pub id: String,
    /// Host name of the machine.
    pub hostname: String,
    /// Process id of the warden process hosting the agent.
    pub pid: u32,
    /// Start time, milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// Host load, refreshed with the lease.
    #[serde(default)]
    pub load: HostLoad,
    /// What enforces sandbox limits on this node, e.g. `cgroup v1 (memory, pids, cpu)` or
    /// `rlimits only (why)`.
    #[serde(default)]
    pub limits: String,
    /// Roles the node runs: `gateway`, `agent`, `api`.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Where other nodes of the cluster reach this one (its node port), if it serves one.
    #[serde(default)]
    pub advertise: Option<String>,
    /// Drivers this node can run instances with (empty on a node without the agent role).
    #[serde(default)]
    pub drivers: Vec<crate::DriverKind>,
    /// True while the node is drained (by `warden nodes drain`, or stopping): nothing new is
    /// placed on it and its instances move elsewhere.
    #[serde(default)]
    pub draining: bool,
}

impl NodeRecord {
    /// Whether the node runs instances (records from before roles were published do).
    pub fn runs_instances(&self) -> bool {
        self.roles.is_empty() || self.roles.iter().any(|r| r == "agent")
    }
}

/// A login session. Stored at `sessions/<sha256 of token>` under a lease that ends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SessionRecord {
    /// User the session belongs to.
    pub user: String,
    /// The user's [`UserRecord::generation`] when the session began.
    #[serde(default)]
    pub generation: String,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// Expiry time, milliseconds since the Unix epoch.
    pub expires_ms: u64,
    /// For a session from an identity provider: what keeps it in step with the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderSession>,
}

/// The provider side of a session that began with an OpenID Connect sign-in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ProviderSession {
    /// The provider's id in warden's config.
    pub id: String,
    /// The person's subject at the provider: a refresh must name the same one.
    pub subject: String,
    /// The provider's issuer at sign-in: a session whose provider id now names another issuer
    /// (changed through the API, or removed and added again) ends before anything of it, its
    /// refresh token above all, goes to that issuer. Empty in records from before it was kept,
    /// which end the same way.
    #[serde(default)]
    pub issuer: String,
    /// The refresh token, sealed (ChaCha20-Poly1305 under the gateway's OIDC key, bound to
    /// this session's key); absent when the provider gave none, and the session then ends at
    /// `refresh_at_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_sealed: Option<String>,
    /// When the provider's word runs out (the ID or access token's expiry): the next request
    /// after it refreshes first.
    pub refresh_at_ms: u64,
}

/// An OpenID Connect sign-in in flight, at [`crate::keys::oidc_flow`], under a lease of a
/// few minutes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcFlowRecord {
    /// The provider's id.
    pub provider: String,
    /// The provider's issuer when the sign-in began: the callback refuses the record when the
    /// provider id now names another issuer, before the code and verifier go anywhere.
    #[serde(default)]
    pub issuer: String,
    /// The PKCE verifier and nonce, sealed together, bound to this record's key.
    pub sealed: String,
    /// SHA-256 (hex) of the flow cookie set on the browser that began it: another browser
    /// cannot finish it.
    pub binding: String,
    /// Where to go after signing in (already checked to be this gateway's own path).
    pub next: String,
    /// When it began, milliseconds since the Unix epoch; the callback refuses it after the
    /// flow's time even if the lease has not yet cleared it.
    pub created_ms: u64,
}

/// Milliseconds since the Unix epoch, for record timestamps.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A time in ms since the epoch as UTC `YYYY-MM-DD HH:MM:SS`: how the CLI and the dashboard
/// print release, audit and token times.
pub fn utc_text(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(utc_text(0), "1970-01-01 00:00:00");
        assert_eq!(utc_text(1_795_000_000_000), "2026-11-18 11:06:40");
    }

    #[test]
    fn user_debug_hides_hash() {
        let u = UserRecord {
            name: "a".into(),
            password_hash: "$argon2id$secret".into(),
            clearance: "SECRET".into(),
            groups: vec![],
            generation: String::new(),
            provider: None,
        };
        assert!(!format!("{u:?}").contains("argon2id"));
    }

    #[test]
    fn an_instance_record_keeps_owner_as_its_stored_name() {
        let stored = serde_json::json!({
            "id": "i1", "app": "web", "label": "L", "node": "n", "addr": "127.0.0.1:1",
            "pid": 1, "state": "ready", "started_at_ms": 0, "lifetime": "per_user",
            "owner": "ann", "kept": false,
        });
        let r: InstanceRecord = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!(r.user.as_deref(), Some("ann"));
        assert_eq!(r.user_key(), crate::Owner::User("ann".into()).user());
        assert_eq!(serde_json::to_value(&r).unwrap(), stored);
        let shared = InstanceRecord { user: None, ..r };
        assert_eq!(shared.user_key(), "");
        assert!(serde_json::to_value(&shared)
            .unwrap()
            .get("owner")
            .is_none());
    }
}
