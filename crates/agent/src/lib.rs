//! The node agent: starts, supervises and stops app instances on this machine.
//!
//! The agent owns the life of instances on its node: it starts them through a driver (a plain
//! process or a sandbox), JIT or from its slot and warm pools, waits until they accept
//! connections, records them in the store under the node's lease, enforces their lifetime
//! (shared per label, per user, per request; idle reaping; per-app and per-node maximums),
//! keeps each app's desired count running with backoff after crashes, publishes the node's
//! load, and kills every instance when it shuts down. It never routes requests and never
//! decides who may see what: the gateway does that, reaching the agent only through
//! [`warden_core::Instances`], which [`Agent`] implements.
//!
//! The parts, each owning its state: `lifecycle` (the instances), `pools` (slots and spare
//! starts), `restarts` (crash backoff), `supervise` (the background duties that tie them
//! together, with the node's lease and record and the cluster's scheduler, both owned by
//! [`warden_cluster`]), [`drivers`] (the ways to run an instance, on top of
//! [`warden_sandbox`], which owns every process they start and every `unsafe` block) and
//! `build` (running a slug's build script in a sandbox and a release's trial outside routing;
//! the slugs' files are [`warden_slugs`]'s; [`Builder`] is what the API gets, through
//! [`warden_core::builds::Builds`]). Every child is a [`warden_sandbox::process::Process`]
//! known to the node's registry, which [`Agent::shutdown`] ends.
//! Instance environments never carry the agent's own environment.
#![forbid(unsafe_code)]

mod build;
pub mod drivers;
mod error;
mod lifecycle;
mod logs;
mod metrics;
mod paths;
mod pools;
mod restarts;
mod supervise;
mod sync;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};
use warden_core::{
    Activity, AppSpec, InstanceAdmin, InstanceError, InstanceRecord, InstanceStream, Instances,
    Owner,
};
use warden_store::Store;

pub use build::Builder;
pub use drivers::sandbox::bridge::BridgeConfig;
pub use error::AgentError;

/// Agent settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// This node's id.
    pub node: String,
    /// Roles this node runs, for its record.
    pub roles: Vec<String>,
    /// This node's node port, for its record.
    pub advertise: Option<String>,
    /// Directory for instance logs.
    pub log_dir: PathBuf,
    /// Directory under which each instance gets its private writable directory.
    pub instance_dir: PathBuf,
    /// Directory of built slugs (releases pushed with `warden push`).
    pub slug_dir: PathBuf,
    /// TTL of the node's lease; records vanish this long after the agent dies.
    pub lease_ttl: Duration,
    /// Most instances this node runs at once.
    pub max_instances: u32,
    /// Size at which an instance's log is cut back to its newer half.
    pub max_log_bytes: u64,
    /// Whether sandbox limits may use cgroups (else rlimits only).
    pub cgroups: bool,
    /// The bridge of network mode `bridged`, set up when an instance first needs it.
    pub bridge: BridgeConfig,
    /// The node's identity key, from which each instance's `WARDEN_INSTANCE_SECRET` is derived.
    pub identity: warden_core::identity::IdentityKey,
    /// Placement by load (seed 003 §3.3.2): a node loaded above the cluster mean by more than
    /// this (a fraction of its capacity) gets no new instances.
    pub start_margin: f64,
    /// A node loaded above the mean by more than this sheds instances to other nodes.
    pub shed_margin: f64,
    /// Read the node's load from this file instead of /proc (see `NodeInfo::load_file`).
    pub load_file: Option<PathBuf>,
    /// Apps' databases, when this node has a data server: instances of apps with `data` get a
    /// socket to theirs.
    pub data: Option<Arc<dyn warden_core::data::DataPlane>>,
}

struct Inner {
    store: Arc<dyn Store>,
    node: Arc<warden_cluster::node::Node>,
    life: Arc<lifecycle::Lifecycle>,
    pools: Arc<pools::Pools>,
    drivers: Arc<drivers::Drivers>,
    paths: paths::Paths,
    slugs: Arc<warden_slugs::Fetcher>,
    metrics: Arc<metrics::Metrics>,
    stopping: watch::Sender<bool>,
    /// Apps' databases, which a push's release phase reaches as the app's owner.
    data: Option<Arc<dyn warden_core::data::DataPlane>>,
}

/// Handle to the agent; cheap to clone.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

// === impl Agent ===

impl Agent {
    /// Registers the node under a fresh lease and starts the background duties (lease renewal
    /// with the node's load, stopping instances of deleted apps, desired counts, idle reaping,
    /// pools).
    pub async fn start(store: Arc<dyn Store>, config: AgentConfig) -> Result<Self, AgentError> {
        // Every sandbox's init runs the instance image: without it, say so now, not at the
        // first instance start.
        warden_sandbox::image::instance_image()?;
        // Logs are warden's alone; the instances directory is passable but not listable, so a
        // `process` instance under its own uid reaches its own directory (mode 0700, its uid's)
        // and cannot find or enter any other.
        // Slugs likewise: instances of a release reach their slug's tree by its id.
        for (dir, mode) in [
            (&config.log_dir, 0o700),
            (&config.instance_dir, 0o711),
            (&config.slug_dir, 0o711),
        ] {
            std::fs::create_dir_all(dir)
                .and_then(|()| {
                    std::fs::set_permissions(
                        dir,
                        std::os::unix::fs::PermissionsExt::from_mode(mode),
                    )
                })
                .map_err(|source| AgentError::Directory {
                    path: dir.clone(),
                    source,
                })?;
        }
        let metrics = Arc::new(metrics::Metrics::new()?);
        let cgroups = if config.cgroups {
            drivers::sandbox::cgroup::Cgroups::detect()
        } else {
            drivers::sandbox::cgroup::Cgroups::off("turned off with warden up --cgroups off")
        };
        tracing::info!(limits = cgroups.summary(), "sandbox limits");
        let children = warden_sandbox::process::Children::new();
        let drivers = Arc::new(drivers::Drivers::new(
            drivers::sandbox::SandboxDriver::new(config.bridge.clone(), cgroups, children.clone()),
            config.identity.clone(),
            children,
        ));
        let (default, why) = drivers.default();
        tracing::info!(driver = ?default, why, "apps that name no driver run with this one");
        let info = warden_cluster::node::NodeInfo {
            id: config.node.clone(),
            roles: config.roles.clone(),
            advertise: config.advertise.clone(),
            drivers: match default {
                warden_core::DriverKind::Sandbox => vec![default, warden_core::DriverKind::Process],
                warden_core::DriverKind::Process => vec![default],
            },
            limits: drivers.sandbox().limits().to_owned(),
            load_file: config.load_file.clone(),
        };
        let node = Arc::new(
            warden_cluster::node::Node::register(store.clone(), info, config.lease_ttl).await?,
        );
        let paths = paths::Paths {
            logs: config.log_dir.clone(),
            instances: config.instance_dir.clone(),
            // Absolute: a slug is an instance's working directory, and sandbox-init runs in
            // the instance's own directory.
            slugs: std::path::absolute(&config.slug_dir)
                .unwrap_or_else(|_| config.slug_dir.clone()),
        };
        let swept = warden_slugs::sweep(&paths.slugs);
        if swept > 0 {
            tracing::info!(swept, "removed what interrupted builds and fetches left");
        }
        // Before anything starts: what a killed run left running ends first, then its files go.
        let instances = paths.instances.clone();
        let ended =
            tokio::task::spawn_blocking(move || drivers::leftovers::end_leftovers(&instances))
                .await
                .unwrap_or(0);
        if ended > 0 {
            tracing::warn!(
                ended,
                "ended instances that an earlier run of this agent left running"
            );
        }
        let leftovers = paths.remove_leftovers();
        if leftovers > 0 {
            tracing::info!(
                leftovers,
                "removed the directories of instances from before a crash"
            );
        }
        let (stopping, stopping_rx) = watch::channel(false);
        let (refill_tx, refill_rx) = mpsc::unbounded_channel();
        let pools = Arc::new(pools::Pools::new(
            drivers.clone(),
            paths.clone(),
            metrics.clone(),
            refill_tx,
        ));
        let restarts = Arc::new(restarts::Restarts::default());
        let slugs = Arc::new(warden_slugs::Fetcher::default());
        let life = lifecycle::Lifecycle::new(lifecycle::Deps {
            store: store.clone(),
            node: node.clone(),
            paths: paths.clone(),
            max_instances: config.max_instances,
            drivers: drivers.clone(),
            pools: pools.clone(),
            restarts: restarts.clone(),
            metrics: metrics.clone(),
            stopping: stopping_rx.clone(),
            slugs: slugs.clone(),
            data: config.data.clone(),
        });
        node.publish(0).await?;
        node.remove_stale_records().await?;

        let scheduler = Arc::new(warden_cluster::schedule::Scheduler::new(
            store.clone(),
            node.clone(),
            warden_cluster::schedule::rules(config.start_margin, config.shed_margin),
            stopping_rx.clone(),
        ));
        Arc::new(supervise::Supervisor {
            store: store.clone(),
            node: node.clone(),
            life: life.clone(),
            pools: pools.clone(),
            restarts,
            max_log_bytes: config.max_log_bytes,
            stopping: stopping_rx,
            placement: std::sync::Mutex::new(None),
            assigning: std::sync::Mutex::new(()),
            replacing: std::sync::Mutex::default(),
            scheduler,
        })
        .spawn(refill_rx);
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                node,
                life,
                pools,
                drivers,
                paths,
                slugs,
                metrics,
                stopping,
                data: config.data.clone(),
            }),
        })
    }

    /// The builder of slugs on this node: builds run at most `time_limit` and unpack at most
    /// `max_unpacked` bytes.
    pub fn builder(&self, time_limit: Duration, max_unpacked: u64) -> Builder {
        Builder::new(
            self.inner.drivers.clone(),
            self.inner.paths.clone(),
            time_limit,
            max_unpacked,
            self.inner.slugs.clone(),
            self.inner.data.clone(),
        )
    }

    /// Where this node gets release slugs it did not build (another node of its cluster).
    pub fn set_slug_source(&self, source: Arc<dyn warden_core::builds::SlugSource>) {
        self.inner.slugs.set_source(source);
    }

    /// The directory of this node's slugs, which its node port serves to other nodes.
    pub fn slug_dir(&self) -> PathBuf {
        self.inner.paths.slugs.clone()
    }

    /// This node's id.
    pub fn node(&self) -> &str {
        self.inner.node.id()
    }

    /// A ready instance of `spec`'s app for `label` and `owner`; see [`Instances::ensure`].
    pub async fn ensure(
        &self,
        spec: &AppSpec,
        label: &str,
        owner: &Owner,
    ) -> Result<InstanceRecord, InstanceError> {
        self.inner.life.ensure(spec, label, owner).await
    }

    /// The driver of apps that name none on this node (the sandbox wherever the node can make
    /// one), and why.
    pub fn default_driver(&self) -> (warden_core::DriverKind, &str) {
        self.inner.drivers.default()
    }

    /// Instances running on this node.
    pub fn instances(&self) -> Vec<InstanceRecord> {
        self.inner.life.instances()
    }

    /// The agent's metrics in Prometheus text format.
    pub fn render_metrics(&self) -> String {
        let m = &self.inner.metrics;
        m.pool.reset();
        for (app, n) in self.inner.pools.slot_levels() {
            m.pool.with_label_values(&[app.as_str(), "", "slot"]).set(n);
        }
        for ((app, label), n) in self.inner.life.spare_levels() {
            m.pool
                .with_label_values(&[app.as_str(), label.as_str(), "spare"])
                .set(n);
        }
        m.render()
    }

    /// On a cluster with another agent node, moves this node's instances there (at most 30 s)
    /// so that stopping fails no request. Call it while the node still serves: its node port
    /// carries requests to the instances until each has drained.
    pub async fn drain_for_stop(&self) {
        supervise::drain_before_stop(&*self.inner.store, &self.inner.node, &self.inner.life).await;
    }

    /// Stops every instance, removes the node's records and ends its lease.
    pub async fn shutdown(&self) {
        let _ = self.inner.stopping.send(true);
        self.inner.pools.drain_slots(None);
        let stopped = self.inner.life.stop_all().await;
        // What no instance record names (builds, trials, slots not yet ended) gets the same
        // SIGTERM and grace: a build or trial ended here leaves its release to resume at the
        // next start.
        let ended = self
            .inner
            .drivers
            .children()
            .end_all(lifecycle::STOP_GRACE)
            .await;
        if ended > 0 {
            tracing::info!(
                ended,
                "ended the builds, trials and sandboxes still running"
            );
        }
        self.inner.drivers.sandbox().shutdown();
        self.inner.node.deregister().await;
        tracing::info!(node = %self.node(), stopped, "agent stopped");
    }
}

#[async_trait]
impl Instances for Agent {
    async fn ensure(
        &self,
        spec: &AppSpec,
        label: &str,
        owner: &Owner,
    ) -> Result<InstanceRecord, InstanceError> {
        Agent::ensure(self, spec, label, owner).await
    }

    /// Resolved at the moment of use, as the node port does for other nodes: the agent's own
    /// record must still say the label and user the caller routes (a view can be a relabel or
    /// an exit behind), and its address is the one dialled (a gone instance's port may be
    /// another's by now).
    async fn connect(&self, instance: &InstanceRecord) -> std::io::Result<InstanceStream> {
        let (addr, owner, first) = match self.inner.life.dial(&instance.id) {
            Some((r, owner, first)) if r.label == instance.label && r.user == instance.user => {
                (r.addr, owner, first)
            }
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    format!(
                        "instance {} no longer serves label {} here",
                        instance.id, instance.label
                    ),
                ))
            }
        };
        let stream = match first {
            // Made by the sandbox's init while the instance started, for this request.
            Some(conn) => {
                conn.set_nonblocking(true)?;
                tokio::net::TcpStream::from_std(conn)?
            }
            None => warden_sandbox::connect(&addr).await?,
        };
        // A `process` instance's port is the host's: whoever listens there now must be the
        // instance (`lifecycle::peer_owner`). Refused, the request goes to another instance.
        if let Some(uid) = owner {
            let refused = |why: String| {
                std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    format!("instance {}: {why}", instance.id),
                )
            };
            use lifecycle::peer_owner::{check, Check};
            match check(&stream, uid) {
                Check::Own => {}
                Check::Gone => return Err(refused("nothing listens on its port".into())),
                Check::Unknown(why) => return Err(refused(why)),
                // Its port is not its own any more: it cannot serve again, and a new instance
                // takes another port.
                Check::Foreign(why) => {
                    self.inner.life.kill_soon(instance.id.clone());
                    return Err(refused(why));
                }
            }
        }
        Ok(InstanceStream::Tcp(stream))
    }

    /// Nothing to do here: the monitor of a local instance sees its exit itself. A cluster
    /// implementation tells the checker.
    fn refused(&self, _instance: &InstanceRecord) {}

    fn retire(&self, id: &str) {
        self.inner.life.retire(id);
    }

    fn on_relabel(&self, hook: warden_core::RelabelHook) {
        self.inner.life.on_relabel(hook);
    }

    fn relabel(&self, id: &str, label: &str) {
        match self.inner.life.relabel(id, label) {
            Ok(()) => {}
            Err(e @ AgentError::DataTaint(_)) => {
                tracing::warn!(instance = %id, error = %e, "stopping a tainted instance of a data app");
                let life = self.inner.life.clone();
                let id = id.to_owned();
                tokio::spawn(async move {
                    let _ = life.kill(&id).await;
                });
            }
            Err(e) => {
                // Gone already: it serves nobody.
                tracing::debug!(instance = %id, error = %e, "relabelling a tainted instance");
            }
        }
    }

    async fn kill(&self, id: &str) -> Result<(), InstanceError> {
        Ok(self.inner.life.kill(id).await?)
    }

    fn activity(&self, id: &str) -> Option<Arc<Activity>> {
        self.inner.life.activity(id)
    }
}

impl InstanceAdmin for Agent {
    fn record(&self, id: &str) -> Option<InstanceRecord> {
        self.inner.life.record(id)
    }

    fn own_records(&self) -> Vec<InstanceRecord> {
        self.inner.life.instances()
    }

    fn logs(&self, id: &str, lines: usize) -> Result<String, InstanceError> {
        Ok(self.inner.life.logs(id, lines)?)
    }

    fn log_written(&self, id: &str) -> Option<std::time::SystemTime> {
        self.inner.life.log_written(id)
    }
}
