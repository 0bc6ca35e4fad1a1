//! The live nodes of the cluster, as their records in the store say (fed by a watch; a broken
//! watch lists again).

use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use warden_core::{keys, NodeRecord};
use warden_store::{decode, EventKind, Store, StoreError};

type Nodes = RwLock<HashMap<String, NodeRecord>>;

/// The live nodes; cheap to clone.
#[derive(Clone)]
pub struct Directory {
    nodes: Arc<Nodes>,
}

fn id_of(key: &str) -> Option<&str> {
    key.strip_prefix(keys::NODES)?.strip_prefix('/')
}

impl Directory {
    /// Lists the nodes and follows their changes until the directory is dropped.
    pub async fn start(store: Arc<dyn Store>) -> Result<Self, StoreError> {
        let nodes = Arc::new(Nodes::default());
        let from = fill(&*store, &nodes).await?;
        tokio::spawn(follow(store, Arc::downgrade(&nodes), from));
        Ok(Self { nodes })
    }

    /// A live node by name.
    pub fn get(&self, id: &str) -> Option<NodeRecord> {
        self.nodes.read().ok()?.get(id).cloned()
    }

    /// Every live node.
    pub fn all(&self) -> Vec<NodeRecord> {
        self.nodes
            .read()
            .map(|n| n.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// Replaces the view with a listing; the revision to watch from.
async fn fill(store: &dyn Store, nodes: &Nodes) -> Result<u64, StoreError> {
    let listing = store.list(keys::NODES).await?;
    let fresh: HashMap<String, NodeRecord> = listing
        .entries
        .iter()
        .filter_map(|e| decode::<NodeRecord>(&e.key, &e.value).ok())
        .map(|r| (r.id.clone(), r))
        .collect();
    if let Ok(mut n) = nodes.write() {
        *n = fresh;
    }
    Ok(listing.revision + 1)
}

async fn follow(store: Arc<dyn Store>, nodes: Weak<Nodes>, mut from: u64) {
    loop {
        if let Ok(mut w) = store.watch(keys::NODES, from).await {
            while let Some(Ok(ev)) = w.next().await {
                let Some(nodes) = nodes.upgrade() else { return };
                from = ev.revision + 1;
                let Some(id) = id_of(&ev.key) else { continue };
                let Ok(mut n) = nodes.write() else { return };
                match ev.kind {
                    EventKind::Put(v) => {
                        if let Ok(r) = decode::<NodeRecord>(&ev.key, &v) {
                            n.insert(id.to_owned(), r);
                        }
                    }
                    EventKind::Delete => {
                        n.remove(id);
                    }
                }
            }
        }
        // The watch broke (or never opened): list again after a pause.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Some(n) = nodes.upgrade() else { return };
        match fill(&*store, &n).await {
            Ok(f) => from = f,
            Err(e) => tracing::warn!(error = %e, "listing the cluster's nodes failed"),
        }
    }
}
