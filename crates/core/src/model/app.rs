//! An app's spec: how to run it and who may reach it, with the checks serde cannot express.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Balance, DriverKind, Lifetime, Limits, NetworkMode, StartPath};
use crate::name::{validate_name, NameError};

/// Default time the gateway waits for a new instance to accept connections.
pub const DEFAULT_START_TIMEOUT_MS: u64 = 10_000;
/// Longest start timeout an app may ask for.
pub const MAX_START_TIMEOUT_MS: u64 = 120_000;

/// How to run an app and who may reach it. Stored at `apps/<name>/spec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AppSpec {
    /// The app's name: the gateway serves it under `/apps/<name>/`.
    pub name: String,
    /// Program and arguments. The program finds its port in the `PORT` env var and must listen on
    /// 127.0.0.1 at that port.
    pub command: Vec<String>,
    /// Extra environment for every instance.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory of instances; the agent's own when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Host names whose requests go to this app (matched against the Host header, port ignored).
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Groups allowed to use the app; empty means every authenticated user.
    #[serde(default)]
    pub groups: Vec<String>,
    /// How long the gateway holds a request while a new instance starts, in milliseconds.
    #[serde(default = "default_start_timeout_ms")]
    pub start_timeout_ms: u64,
    /// How the gateway spreads requests over the ready instances of one label.
    #[serde(default)]
    pub balance: Balance,
    /// Directory of static files the gateway serves itself, without starting an instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_dir: Option<String>,
    /// Path prefix (within the app) under which `static_dir` is served.
    #[serde(default = "default_static_prefix")]
    pub static_prefix: String,
    /// How instances are run: a sandbox or a plain process. Left out, the node's default:
    /// the sandbox wherever the node can make one (see [`AppSpec::driver_on`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<DriverKind>,
    /// Whom one instance serves: everyone with one label, one user, or one request.
    #[serde(default)]
    pub lifetime: Lifetime,
    /// An instance that has served no request for this long is stopped; 0 keeps it.
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// Most instances of this app one node runs at once; 0 means only the node's own limit.
    #[serde(default)]
    pub max_instances: u32,
    /// Shared instances kept running per label, replaced when they crash.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub desired: BTreeMap<String, u32>,
    /// Resource limits of each instance (enforced by the sandbox driver).
    #[serde(default)]
    pub limits: Limits,
    /// How a request that finds no instance gets one: started from nothing (`jit`), from a
    /// prepared sandbox (`slot`), or handed a spare that is already running (`warm`).
    #[serde(default)]
    pub start: StartPath,
    /// Prepared sandboxes each node keeps ready for this app when `start` is `slot`.
    #[serde(default = "default_slots")]
    pub slots: u32,
    /// Spare running instances each node keeps per label when `start` is `warm`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub warm: BTreeMap<String, u32>,
    /// Path the agent asks with `GET` until it answers 2xx or 3xx before an instance counts as
    /// ready; when absent, accepting a connection is enough.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_path: Option<String>,
    /// What a sandboxed instance's network namespace holds besides loopback.
    #[serde(default)]
    pub network: NetworkMode,
    /// Lets a sandboxed app use io_uring, which the sandbox denies by default: its kernel
    /// surface is why Docker's and ChromeOS's sandboxes deny it too.
    #[serde(default)]
    pub io_uring: bool,
    /// The app has a database of its own (`warden apps create --data`): every instance gets
    /// `DATABASE_URL` to a socket that logs in as its label's role. Needs a data server.
    #[serde(default)]
    pub data: bool,
    /// Marks the app a declassifier (seed 002's certified code path; an admin's act): its
    /// instances whose label dominates this one may write rows at it, each such write recorded
    /// in the database's `warden.declassified`. Needs `data`; canonical under the lattice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declassify_to: Option<String>,
    /// The release the app runs (`warden push`): instances run `command` in the release's slug,
    /// which each node resolves to its own copy, so `workdir` stays unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<super::SpecRelease>,
    /// Restarts asked for (`warden apps restart`), of the app and of single labels: each
    /// replaces the instances it names with fresh ones of the same release. Changed only
    /// through `POST /v1/apps/{name}/restart`.
    #[serde(default, skip_serializing_if = "super::Restarts::is_none")]
    pub restarts: super::Restarts,
    /// Set on a derived spec (`<app>~<type>`): it runs a non-web process type of the
    /// Procfile of `app`'s release. Written only by the release's delivery (and `apps scale`
    /// for its counts); the gateway never routes to it, and its instances listen on nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<super::ProcessOf>,
}

/// Longest health path an app may name.
pub const MAX_HEALTH_PATH: usize = 1024;

/// Most prepared sandboxes or spare instances per app and label one node keeps.
pub const MAX_POOL: u32 = 256;

/// Largest app spec, encoded: specs travel in node-port messages (1 MiB at most) and in every
/// view.
pub const MAX_SPEC_BYTES: usize = 256 * 1024;

/// Most instances an app's desired count keeps for one label, across the cluster.
pub const MAX_DESIRED: u32 = 10_000;

fn default_slots() -> u32 {
    2
}

/// Default idle timeout: ten minutes.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 600_000;

fn default_idle_timeout_ms() -> u64 {
    DEFAULT_IDLE_TIMEOUT_MS
}

fn default_static_prefix() -> String {
    "/static/".into()
}

fn default_start_timeout_ms() -> u64 {
    DEFAULT_START_TIMEOUT_MS
}

/// Why an app spec was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A name in the spec is malformed.
    #[error(transparent)]
    Name(#[from] NameError),
    /// The command is empty.
    #[error("command is empty; give the program to run and its arguments, e.g. [\"./server\", \"--quiet\"]")]
    EmptyCommand,
    /// The start timeout is out of range.
    #[error("start_timeout_ms is {0}; use a value from 1 to {MAX_START_TIMEOUT_MS}")]
    StartTimeout(u64),
    /// A host name is not usable.
    #[error("host {0:?} is not a plain host name (letters, digits, '-' and '.')")]
    BadHost(String),
    /// The static settings are not usable.
    #[error("{0}")]
    Static(String),
    /// Lifetime and desired counts contradict each other.
    #[error("{0}")]
    Lifetime(String),
    /// A resource limit is out of range.
    #[error("{0}")]
    Limits(String),
    /// The start path and its pool sizes do not fit together.
    #[error("{0}")]
    Pool(String),
    /// The network mode does not fit the driver.
    #[error("{0}")]
    Network(String),
    /// The health path cannot be put in a request line.
    #[error("{0}")]
    Health(String),
    /// The release settings do not fit.
    #[error("{0}")]
    Release(String),
    /// An environment variable cannot be set.
    #[error(transparent)]
    Env(#[from] super::EnvError),
    /// A derived spec does not fit the process type it names.
    #[error("{0}")]
    Process(String),
    /// An argument of the command holds a NUL byte, which `execve` cannot pass.
    #[error("argument {0} of the command holds a NUL byte, which a program's arguments cannot carry; remove it")]
    NulInCommand(usize),
}

// === impl AppSpec ===

impl AppSpec {
    /// What an instance of this spec with `label` runs, as a short hex digest: its command,
    /// working directory, environment, limits, driver, network, whom it serves and how it
    /// starts (a slot pool makes the sandbox the driver), and the restarts asked for of the app
    /// and of `label`. Instances started from another generation are replaced (rolled out)
    /// when it changes; the other fields (hosts, groups, counts, static files, timeouts) take
    /// effect without a restart. The label `""` names what every label shares.
    pub fn generation(&self, label: &str) -> String {
        use sha2::Digest;
        let bytes = serde_json::to_vec(&(
            &self.command,
            &self.workdir,
            &self.env,
            &self.limits,
            self.driver,
            self.network,
            self.io_uring,
            self.lifetime,
            self.start,
            self.release.as_ref().map(|r| &r.slug),
        ))
        .unwrap_or_default();
        let mut digest = sha2::Sha256::new();
        digest.update(&bytes);
        if let Some((app, label)) = self.restarts.of(label) {
            digest.update(format!(" restarts {app} {label}"));
        }
        let digest = digest.finalize();
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The driver instances of this app run with on a node whose default is `node_default`:
    /// the one the spec names; else the sandbox when the app needs one (a bridged network, a
    /// slot pool); else the node's default.
    pub fn driver_on(&self, node_default: DriverKind) -> DriverKind {
        match self.driver {
            Some(d) => d,
            None if self.network == NetworkMode::Bridged || self.start == StartPath::Slot => {
                DriverKind::Sandbox
            }
            None => node_default,
        }
    }

    /// A spec with every optional setting at its default.
    pub fn new(name: impl Into<String>, command: Vec<String>) -> Self {
        Self {
            name: name.into(),
            command,
            env: BTreeMap::new(),
            workdir: None,
            hosts: Vec::new(),
            groups: Vec::new(),
            start_timeout_ms: default_start_timeout_ms(),
            balance: Balance::default(),
            static_dir: None,
            static_prefix: default_static_prefix(),
            driver: None,
            lifetime: Lifetime::default(),
            idle_timeout_ms: default_idle_timeout_ms(),
            max_instances: 0,
            desired: BTreeMap::new(),
            limits: Limits::default(),
            start: StartPath::default(),
            slots: default_slots(),
            warm: BTreeMap::new(),
            health_path: None,
            network: NetworkMode::default(),
            io_uring: false,
            data: false,
            declassify_to: None,
            release: None,
            restarts: super::Restarts::default(),
            process: None,
        }
    }

    /// Whether the app has nothing to run or serve yet: no command, no static files and no
    /// release. Such an app exists (its config can be set, a failed first push leaves it, it
    /// can be removed) and awaits its first push; the gateway answers 503 saying so and no
    /// agent starts an instance of it.
    pub fn awaits_release(&self) -> bool {
        self.command.is_empty() && self.static_dir.is_none() && self.release.is_none()
    }

    /// Checks the invariants serde cannot express.
    pub fn validate(&self) -> Result<(), SpecError> {
        match &self.process {
            None => validate_name("app", &self.name)?,
            Some(p) => p.validate(self)?,
        }
        // A static site runs nothing: every path is a file the gateway serves.
        let static_only =
            self.command.is_empty() && self.static_dir.is_some() && self.static_prefix == "/";
        if !static_only
            && !self.awaits_release()
            && self.command.first().is_none_or(|c| c.is_empty())
        {
            return Err(SpecError::EmptyCommand);
        }
        if let Some(i) = self.command.iter().position(|a| a.contains('\0')) {
            return Err(SpecError::NulInCommand(i));
        }
        super::validate_env(&self.env)?;
        if let Some(r) = &self.release {
            if !super::is_slug_id(&r.slug) {
                return Err(SpecError::Release(format!(
                    "release.slug {:?} is not a slug id (64 hex digits)",
                    r.slug
                )));
            }
            if self.workdir.is_some() {
                return Err(SpecError::Release(
                    "an app that runs a release runs in its slug; remove workdir".into(),
                ));
            }
        }
        if self.start_timeout_ms == 0 || self.start_timeout_ms > MAX_START_TIMEOUT_MS {
            return Err(SpecError::StartTimeout(self.start_timeout_ms));
        }
        for g in &self.groups {
            validate_name("group", g)?;
        }
        if !(self.static_prefix.starts_with('/') && self.static_prefix.ends_with('/')) {
            return Err(SpecError::Static(format!(
                "static_prefix {:?} must start and end with '/', e.g. \"/static/\"",
                self.static_prefix
            )));
        }
        if let Some(dir) = &self.static_dir {
            if !std::path::Path::new(dir).is_absolute() {
                return Err(SpecError::Static(format!(
                    "static_dir {dir:?} must be an absolute path"
                )));
            }
        }
        let size = serde_json::to_vec(self).map_or(0, |v| v.len());
        if size > MAX_SPEC_BYTES {
            return Err(SpecError::Lifetime(format!(
                "the app's spec is {size} bytes; keep it under {MAX_SPEC_BYTES} (a large environment belongs in a file the app reads)"
            )));
        }
        if let Some((label, n)) = self.desired.iter().find(|(_, n)| **n > MAX_DESIRED) {
            return Err(SpecError::Lifetime(format!(
                "desired[{label:?}] is {n}; keep at most {MAX_DESIRED} instances of a label"
            )));
        }
        if self.lifetime != Lifetime::Shared && !self.desired.is_empty() {
            return Err(SpecError::Lifetime(
                "desired counts keep shared instances running; remove `desired` or use lifetime \"shared\"".into(),
            ));
        }
        if self.limits.memory_mb < 16 || self.limits.processes == 0 {
            return Err(SpecError::Limits(format!(
                "limits: memory_mb must be at least 16 and processes at least 1 (got {} and {})",
                self.limits.memory_mb, self.limits.processes
            )));
        }
        if self.limits.millicpus != 0 && !(10..=1_000_000).contains(&self.limits.millicpus) {
            return Err(SpecError::Limits(format!(
                "limits: millicpus is thousandths of a core, from 10 (1% of a core) to 1000000, or 0 for no cap (got {})",
                self.limits.millicpus
            )));
        }
        self.validate_pools()?;
        if self.network == NetworkMode::Bridged && self.driver == Some(DriverKind::Process) {
            return Err(SpecError::Network(
                "network \"bridged\" gives a sandbox its own veth pair and needs driver \"sandbox\"; a \"process\" instance already shares the host's network".into(),
            ));
        }
        if let Some(path) = &self.health_path {
            let ok = path.starts_with('/')
                && path.len() <= MAX_HEALTH_PATH
                && path.bytes().all(|b| b.is_ascii_graphic());
            if !ok {
                return Err(SpecError::Health(format!(
                    "health_path {path:?} must start with '/' and hold at most {MAX_HEALTH_PATH} printable characters without spaces, e.g. \"/healthz\""
                )));
            }
        }
        for h in &self.hosts {
            let ok = !h.is_empty()
                && h.len() <= 253
                && h.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
            if !ok {
                return Err(SpecError::BadHost(h.clone()));
            }
        }
        Ok(())
    }
}

impl AppSpec {
    fn validate_pools(&self) -> Result<(), SpecError> {
        let too_big = |what: &str, n: u32| {
            SpecError::Pool(format!("{what} is {n}; use at most {MAX_POOL} per node"))
        };
        if self.slots > MAX_POOL {
            return Err(too_big("slots", self.slots));
        }
        if let Some((label, n)) = self.warm.iter().find(|(_, n)| **n > MAX_POOL) {
            return Err(too_big(&format!("warm[{label:?}]"), *n));
        }
        match self.start {
            StartPath::Jit => Ok(()),
            // A spare is made before its user is known, and a per-user app's database login
            // is its user's from the start (it reads only that user's rows).
            StartPath::Warm if self.data && self.lifetime == Lifetime::PerUser => Err(SpecError::Pool(
                "start \"warm\" makes spares before their user is known, and a per-user app with data logs in to its database as its user; use start \"jit\" for lifetime \"per_user\" with data".into(),
            )),
            StartPath::Slot if self.driver == Some(DriverKind::Process) => Err(SpecError::Pool(
                "start \"slot\" prepares sandboxes and needs driver \"sandbox\"; use start \"jit\" or \"warm\" with driver \"process\"".into(),
            )),
            StartPath::Slot if self.slots == 0 => Err(SpecError::Pool(
                "start \"slot\" needs at least one slot; set slots to 1 or more".into(),
            )),
            StartPath::Warm if self.warm.values().all(|n| *n == 0) => Err(SpecError::Pool(
                "start \"warm\" needs spare counts per label, e.g. warm: {\"public\": 1}".into(),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> AppSpec {
        serde_json::from_str(r#"{"name":"demo","command":["./demo"]}"#).expect("valid spec")
    }

    #[test]
    fn new_matches_the_serde_defaults() {
        assert_eq!(AppSpec::new("demo", vec!["./demo".into()]), spec());
    }

    #[test]
    fn bridged_network_needs_the_sandbox_driver() {
        let mut s = spec();
        s.network = NetworkMode::Bridged;
        s.driver = Some(DriverKind::Process);
        assert!(matches!(s.validate(), Err(SpecError::Network(_))));
        s.driver = Some(DriverKind::Sandbox);
        assert_eq!(s.validate(), Ok(()));
        s.driver = None;
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.driver_on(DriverKind::Process), DriverKind::Sandbox);
    }

    #[test]
    fn an_app_without_a_driver_takes_the_nodes_default() {
        let mut s = spec();
        assert_eq!(s.driver_on(DriverKind::Sandbox), DriverKind::Sandbox);
        assert_eq!(s.driver_on(DriverKind::Process), DriverKind::Process);
        s.driver = Some(DriverKind::Process);
        assert_eq!(s.driver_on(DriverKind::Sandbox), DriverKind::Process);
    }

    #[test]
    fn health_paths_must_fit_a_request_line() {
        let mut s = spec();
        for ok in ["/healthz", "/_health?deep=1"] {
            s.health_path = Some(ok.into());
            assert_eq!(s.validate(), Ok(()), "{ok}");
        }
        for bad in ["healthz", "/a b", "/a\r\nX: y", ""] {
            s.health_path = Some(bad.into());
            assert!(matches!(s.validate(), Err(SpecError::Health(_))), "{bad:?}");
        }
        s.health_path = Some(format!("/{}", "a".repeat(MAX_HEALTH_PATH)));
        assert!(matches!(s.validate(), Err(SpecError::Health(_))));
    }

    #[test]
    fn a_per_user_app_with_data_keeps_no_spares() {
        let mut s = spec();
        s.start = StartPath::Warm;
        s.warm = [("public".to_owned(), 1)].into();
        s.data = true;
        s.lifetime = Lifetime::PerUser;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("per_user"), "{e}");
        s.lifetime = Lifetime::Shared;
        assert!(s.validate().is_ok());
        s.lifetime = Lifetime::PerUser;
        s.data = false;
        assert!(s.validate().is_ok());
    }

    #[test]
    fn desired_counts_need_shared_instances() {
        let mut s = spec();
        s.desired.insert("PUBLIC".into(), 2);
        assert!(s.validate().is_ok());
        s.lifetime = Lifetime::PerUser;
        assert!(matches!(s.validate(), Err(SpecError::Lifetime(_))));
    }

    #[test]
    fn spec_defaults_and_validation() {
        let s = spec();
        assert_eq!(s.start_timeout_ms, DEFAULT_START_TIMEOUT_MS);
        assert!(s.validate().is_ok());
        // No command at all: an app awaiting its first push. An empty program is refused.
        let mut awaiting = s.clone();
        awaiting.command.clear();
        assert!(awaiting.awaits_release() && awaiting.validate().is_ok());
        let mut bad = s.clone();
        bad.command = vec![String::new()];
        assert_eq!(bad.validate(), Err(SpecError::EmptyCommand));
        let mut bad = s.clone();
        bad.start_timeout_ms = 0;
        assert_eq!(bad.validate(), Err(SpecError::StartTimeout(0)));
        let mut bad = s;
        bad.hosts = vec!["a b".into()];
        assert!(matches!(bad.validate(), Err(SpecError::BadHost(_))));
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = serde_json::from_str::<AppSpec>(r#"{"name":"d","command":["x"],"comand":1}"#)
            .expect_err("unknown field");
        assert!(err.to_string().contains("comand"), "{err}");
    }
}
