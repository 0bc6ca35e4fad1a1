//! The live nodes of the cluster, as their records in the store say (kept current by the
//! store's `Follower`).

use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};

use warden_core::{keys, NodeRecord};
use warden_store::{decode, EventKind, Follower, Listing, Store, StoreError, Update};

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
        let listing = store.list(keys::NODES).await?;
        fill(&nodes, &listing);
        let follower = Follower::from_listing(store, keys::NODES, &listing);
        tokio::spawn(follow(follower, Arc::downgrade(&nodes)));
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

/// Replaces the view with a listing.
fn fill(nodes: &Nodes, listing: &Listing) {
    let fresh: HashMap<String, NodeRecord> = listing
        .entries
        .iter()
        .filter_map(|e| decode::<NodeRecord>(&e.key, &e.value).ok())
        .map(|r| (r.id.clone(), r))
        .collect();
    if let Ok(mut n) = nodes.write() {
        *n = fresh;
    }
}

/// Applies every later change, with the store's [`Follower`], until the directory is dropped.
async fn follow(mut follower: Follower, nodes: Weak<Nodes>) {
    while let Some(update) = follower.next().await {
        let Some(nodes) = nodes.upgrade() else { return };
        let events = match update {
            Update::Listed(listing) => {
                fill(&nodes, &listing);
                continue;
            }
            Update::Changes { events, .. } => events,
        };
        let Ok(mut n) = nodes.write() else { return };
        for ev in events {
            let Some(id) = id_of(&ev.key) else { continue };
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
}
