//! `ClusterInstances::ensure` acts on why a node could not start an instance: it asks the next
//! node only when the error says another node may do better.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use warden_core::{
    keys, Activity, AppSpec, InstanceAdmin, InstanceError, InstanceRecord, InstanceStream,
    Instances, Owner, Unavailable,
};
use warden_store::Store;

use crate::{ClusterInstances, Directory, NodeClient, NodeTls};

/// This node's agent, answering every start with `answer`.
struct Refusing {
    answer: InstanceError,
    asked: Mutex<usize>,
}

#[async_trait]
impl Instances for Refusing {
    async fn ensure(
        &self,
        _: &AppSpec,
        _: &str,
        _: &Owner,
    ) -> Result<InstanceRecord, InstanceError> {
        *self.asked.lock().unwrap() += 1;
        Err(self.answer.clone())
    }
    async fn connect(&self, _: &InstanceRecord) -> std::io::Result<InstanceStream> {
        Err(std::io::ErrorKind::ConnectionRefused.into())
    }
    fn refused(&self, _: &InstanceRecord) {}
    fn retire(&self, _: &str) {}
    fn relabel(&self, _: &str, _: &str) {}
    async fn kill(&self, _: &str) -> Result<(), InstanceError> {
        Ok(())
    }
    fn activity(&self, _: &str) -> Option<Arc<Activity>> {
        None
    }
}

impl InstanceAdmin for Refusing {
    fn record(&self, _: &str) -> Option<InstanceRecord> {
        None
    }
    fn logs(&self, _: &str, _: usize) -> Result<String, InstanceError> {
        Ok(String::new())
    }
}

/// Node `id` as its record says, every one equally loaded (so this node, "alpha", is asked
/// first), its port at `advertise`.
fn record(id: &str, advertise: &str) -> serde_json::Value {
    serde_json::json!({
        "id": id, "hostname": "here", "pid": 1, "started_at_ms": 0,
        "roles": ["agent"], "advertise": advertise, "drivers": ["process", "sandbox"],
    })
}

/// Asks a cluster of alpha (whose agent answers `answer`) and beta (whose port nobody listens
/// on) for an instance; returns the error, once alpha's agent was asked exactly once.
async fn start_with(answer: InstanceError) -> InstanceError {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(warden_store::EmbeddedStore::open(&dir.path().join("store.redb")).unwrap());
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = closed.local_addr().unwrap().to_string();
    drop(closed);
    for (id, addr) in [("alpha", "127.0.0.1:1"), ("beta", dead.as_str())] {
        warden_store::put_json(&*store, &keys::node(id), &record(id, addr), None)
            .await
            .unwrap();
    }
    let (ca, key) = crate::new_ca().unwrap();
    let tls = NodeTls::issue(&ca, &key, "alpha", "127.0.0.1:1").unwrap();
    let local = Arc::new(Refusing {
        answer,
        asked: Mutex::new(0),
    });
    let nodes = Directory::start(store.clone()).await.unwrap();
    let cluster = ClusterInstances::new(
        "alpha".into(),
        Some(local.clone()),
        NodeClient::new(&tls),
        nodes,
        Arc::new(warden_core::Peers::default()),
        store,
    )
    .into_instances();
    let spec = AppSpec::new("demo", vec!["./demo".into()]);
    let e = cluster
        .ensure(&spec, "public", &Owner::Shared)
        .await
        .expect_err("no node starts it");
    assert_eq!(*local.asked.lock().unwrap(), 1, "this node is asked first");
    e
}

#[tokio::test]
async fn a_store_that_fails_ends_the_start_at_the_first_node() {
    let down = InstanceError::unavailable(Unavailable::Store, "the store is down");
    assert_eq!(start_with(down.clone()).await, down, "beta is never asked");
}

#[tokio::test]
async fn a_full_node_sends_the_start_on_to_the_next() {
    let full = InstanceError::unavailable(Unavailable::Limit, "this node is full");
    let e = start_with(full).await;
    // Beta was asked: its port did not answer, and that is the last word.
    let InstanceError::Unavailable { reason, detail } = e else {
        panic!("{e:?}");
    };
    assert_eq!(reason, Unavailable::Unreachable, "{detail}");
    assert!(detail.contains("did not answer"), "{detail}");
}
