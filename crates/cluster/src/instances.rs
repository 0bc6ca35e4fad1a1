//! [`ClusterInstances`]: instances on any node of the cluster, for a gateway and an API.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use warden_core::{
    keys, Activity, AppSpec, InstanceAdmin, InstanceError, InstanceRecord, InstanceStream,
    Instances, NodeRecord, Owner, Peers, Unavailable,
};
use warden_store::{decode, Store};

use crate::wire::{Reply, Request};
use crate::{Directory, NodeClient};

/// Instances wherever they run: this node's through the local agent (no hop), every other
/// node's through its node port.
pub struct ClusterInstances {
    me: String,
    local: Option<Arc<dyn InstanceAdmin>>,
    client: NodeClient,
    nodes: Directory,
    /// Which nodes answer this one's pings: a silent one gets no start.
    peers: Arc<Peers>,
    store: Arc<dyn Store>,
    /// Node of each instance handed out by another node, for retire and relabel.
    placed: Mutex<HashMap<String, String>>,
}

/// Most instance ids remembered with their node (a hint; the store is the truth).
const MAX_PLACED: usize = 10_000;

fn unexpected(reply: Reply) -> InstanceError {
    InstanceError::unavailable(
        Unavailable::Unreachable,
        format!("a node answered {reply:?}"),
    )
}

impl ClusterInstances {
    /// Instances for node `me`, whose own agent is `local` (if it runs one).
    pub fn new(
        me: String,
        local: Option<Arc<dyn InstanceAdmin>>,
        client: NodeClient,
        nodes: Directory,
        peers: Arc<Peers>,
        store: Arc<dyn Store>,
    ) -> Self {
        Self {
            me,
            local,
            client,
            nodes,
            peers,
            store,
            placed: Mutex::default(),
        }
    }

    /// Nodes that may start an instance of `spec`, least loaded first (this node first among
    /// equals: no hop), drained ones and silent ones (they answer no ping) left out.
    fn candidates(&self, spec: &AppSpec) -> Vec<NodeRecord> {
        let mut nodes: Vec<NodeRecord> = self
            .nodes
            .all()
            .into_iter()
            .filter(|n| n.runs_instances())
            .filter(|n| {
                if n.id == self.me {
                    self.local.is_some()
                } else {
                    n.advertise.is_some()
                }
            })
            .filter(|n| spec.driver.is_none_or(|d| n.drivers.contains(&d)))
            .filter(|n| !self.peers.silent(&n.id))
            .collect();
        // A drained node takes nothing new, unless every node is drained.
        if nodes.iter().any(|n| !n.draining) {
            nodes.retain(|n| !n.draining);
        }
        nodes.sort_by(|a, b| {
            a.load
                .score()
                .total_cmp(&b.load.score())
                .then((a.id != self.me).cmp(&(b.id != self.me)))
                .then(a.id.cmp(&b.id))
        });
        nodes
    }

    fn node_of(&self, id: &str) -> Option<String> {
        self.placed.lock().ok()?.get(id).cloned()
    }

    fn advertise(&self, node: &str) -> Option<String> {
        self.nodes.get(node)?.advertise
    }

    /// The node running instance `id`, from the store.
    async fn find(&self, id: &str) -> Option<InstanceRecord> {
        let listing = self.store.list(keys::INSTANCES).await.ok()?;
        listing
            .entries
            .iter()
            .filter_map(|e| decode::<InstanceRecord>(&e.key, &e.value).ok())
            .find(|r| r.id == id)
    }

    async fn remote(&self, node: &str, request: Request) -> Result<Reply, InstanceError> {
        let addr = self.advertise(node).ok_or_else(|| {
            InstanceError::unavailable(
                Unavailable::Unreachable,
                format!("node {node} is not live or serves no node port"),
            )
        })?;
        self.client.call(&addr, &request).await
    }

    /// Sends `request` about instance `id` to its node in the background, once.
    fn tell(self: &Arc<Self>, id: &str, request: Request) {
        // Where it runs is read now: the caller may forget the instance right after.
        let (this, id, node) = (self.clone(), id.to_owned(), self.node_of(id));
        tokio::spawn(async move {
            if let Err(e) = this.send_to(node, &id, request).await {
                tracing::warn!(instance = %id, error = %e, "telling the instance's node failed");
            }
        });
    }

    async fn send_about(&self, id: &str, request: Request) -> Result<(), InstanceError> {
        self.send_to(self.node_of(id), id, request).await
    }

    /// Sends `request` to `node`, or (not known) to the node the store says runs `id`.
    async fn send_to(
        &self,
        node: Option<String>,
        id: &str,
        request: Request,
    ) -> Result<(), InstanceError> {
        let node = match node {
            Some(n) => n,
            None => {
                self.find(id)
                    .await
                    .ok_or_else(|| InstanceError::UnknownInstance(id.to_owned()))?
                    .node
            }
        };
        match self.remote(&node, request).await? {
            Reply::Err(e) => Err(e),
            _ => Ok(()),
        }
    }

    /// Relabels a tainted instance on another node, trying until its node has it or the
    /// instance is gone; a node that cannot be reached for half a minute is asked to kill it
    /// instead, and the failure is logged as the security event it is.
    fn relabel_remote(self: &Arc<Self>, id: &str, label: &str) {
        let (this, id, label) = (self.clone(), id.to_owned(), label.to_owned());
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            let mut pause = Duration::from_millis(50);
            loop {
                let request = Request::Relabel {
                    id: id.clone(),
                    label: label.clone(),
                };
                match this.send_about(&id, request).await {
                    Ok(()) | Err(InstanceError::UnknownInstance(_)) => return,
                    Err(e) if tokio::time::Instant::now() >= deadline => {
                        tracing::error!(instance = %id, error = %e, "a tainted instance on another node could not be relabelled; killing it");
                        if let Err(e) = this.send_about(&id, Request::Kill { id: id.clone() }).await
                        {
                            tracing::error!(instance = %id, error = %e, "a tainted instance on another node could be neither relabelled nor killed; other gateways may route its old label to it until its node sees the taint");
                        }
                        return;
                    }
                    Err(_) => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(2));
                    }
                }
            }
        });
    }

    fn forget(&self, id: &str) {
        if let Ok(mut p) = self.placed.lock() {
            p.remove(id);
        }
    }
}

impl ClusterInstances {
    /// As the `Instances` a gateway uses, and the administration an API uses.
    pub fn into_instances(self) -> Arc<dyn InstanceAdmin> {
        Arc::new(Shared(Arc::new(self)))
    }
}

/// `Instances` takes `&self`; the background calls need an owned handle.
struct Shared(Arc<ClusterInstances>);

#[async_trait]
impl Instances for Shared {
    async fn ensure(
        &self,
        spec: &AppSpec,
        label: &str,
        owner: &Owner,
    ) -> Result<InstanceRecord, InstanceError> {
        let this = &self.0;
        let candidates = this.candidates(spec);
        let mut last = None;
        for node in &candidates {
            let outcome = if node.id == this.me {
                match &this.local {
                    Some(l) => l.ensure(spec, label, owner).await,
                    None => continue,
                }
            } else {
                match this.advertise(&node.id) {
                    // A node that goes silent during the start is passed over at once.
                    Some(addr) => tokio::select! {
                        r = this.client.ensure(&addr, spec, label, owner) => r,
                        () = this.peers.silenced(&node.id, Duration::ZERO) => Err(
                            InstanceError::unavailable(
                                Unavailable::Unreachable,
                                format!("node {} stopped answering", node.id),
                            ),
                        ),
                    },
                    None => Err(InstanceError::unavailable(
                        Unavailable::Unreachable,
                        format!("node {} serves no node port", node.id),
                    )),
                }
            };
            match outcome {
                Ok(r) => {
                    if r.node != this.me {
                        if let Ok(mut p) = this.placed.lock() {
                            // Only a hint (the store says where an instance runs): bounded.
                            if p.len() >= MAX_PLACED {
                                p.clear();
                            }
                            p.insert(r.id.clone(), r.node.clone());
                        }
                    }
                    return Ok(r);
                }
                // A node that is full, stopping or gone is passed over for the next one; what
                // no node does better (the store is down, the app fails) stops here.
                Err(e) if e.elsewhere() => {
                    tracing::info!(node = %node.id, app = %spec.name, error = %e, "node passed over for a start");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(match last {
            Some(InstanceError::Unavailable { reason, detail }) => InstanceError::unavailable(
                reason,
                format!("no node could start an instance of {}: {detail}", spec.name),
            ),
            Some(e) => e,
            None => InstanceError::unavailable(
                Unavailable::NoAgent,
                format!(
                    "no live node runs an agent{} for app {}",
                    spec.driver
                        .map(|d| format!(" with driver {d:?}"))
                        .unwrap_or_default(),
                    spec.name
                ),
            ),
        })
    }

    async fn connect(&self, instance: &InstanceRecord) -> std::io::Result<InstanceStream> {
        let this = &self.0;
        if instance.node == this.me {
            if let Some(l) = &this.local {
                return l.connect(instance).await;
            }
        }
        let addr = this.advertise(&instance.node).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                format!("node {} of instance {} is gone", instance.node, instance.id),
            )
        })?;
        Ok(InstanceStream::Remote(
            this.client
                .join(&addr, &instance.id, &instance.label)
                .await?,
        ))
    }

    fn refused(&self, instance: &InstanceRecord) {
        if let Some(l) = &self.0.local {
            if instance.node == self.0.me {
                l.refused(instance);
            }
        }
    }

    fn retire(&self, id: &str) {
        match &self.0.local {
            Some(l) if l.record(id).is_some() => l.retire(id),
            _ => {
                self.0.tell(id, Request::Retire { id: id.to_owned() });
                self.0.forget(id);
            }
        }
    }

    fn on_relabel(&self, hook: warden_core::RelabelHook) {
        if let Some(l) = &self.0.local {
            l.on_relabel(hook);
        }
    }

    fn relabel(&self, id: &str, label: &str) {
        match &self.0.local {
            Some(l) if l.record(id).is_some() => l.relabel(id, label),
            _ => self.0.relabel_remote(id, label),
        }
    }

    async fn kill(&self, id: &str) -> Result<(), InstanceError> {
        let this = &self.0;
        if let Some(l) = &this.local {
            if l.record(id).is_some() {
                return l.kill(id).await;
            }
        }
        let record = this
            .find(id)
            .await
            .ok_or_else(|| InstanceError::UnknownInstance(id.to_owned()))?;
        match this
            .remote(&record.node, Request::Kill { id: id.to_owned() })
            .await?
        {
            Reply::Ok => Ok(()),
            Reply::Err(e) => Err(e),
            other => Err(unexpected(other)),
        }
    }

    fn activity(&self, id: &str) -> Option<Arc<Activity>> {
        self.0.local.as_ref()?.activity(id)
    }
}

impl InstanceAdmin for Shared {
    fn log_written(&self, id: &str) -> Option<std::time::SystemTime> {
        self.0.local.as_ref()?.log_written(id)
    }

    fn logs(&self, id: &str, lines: usize) -> Result<String, InstanceError> {
        match &self.0.local {
            Some(l) if l.record(id).is_some() => l.logs(id, lines),
            _ => Err(InstanceError::unavailable(
                Unavailable::NotHere,
                format!(
                    "instance {id} does not run on node {}; ask the API of the node that runs it \
                     (`warden instances list` shows the node)",
                    self.0.me
                ),
            )),
        }
    }

    fn record(&self, id: &str) -> Option<InstanceRecord> {
        self.0.local.as_ref()?.record(id)
    }

    fn own_records(&self) -> Vec<InstanceRecord> {
        self.0
            .local
            .as_ref()
            .map(|l| l.own_records())
            .unwrap_or_default()
    }
}
