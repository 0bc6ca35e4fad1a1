//! The node port over real sockets: a node of the cluster is joined to an instance only while
//! the instance serves the label the node asks for.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;

use async_trait::async_trait;
use tokio::io::AsyncReadExt;
use warden_cluster::{new_ca, serve, NodeClient, NodePortStats, NodeTls};
use warden_core::{
    Activity, AppSpec, InstanceAdmin, InstanceError, InstanceRecord, InstanceStream, Instances,
    Owner,
};

/// One instance, whose label a test may change; remembers the command of the last start.
struct OneInstance {
    record: std::sync::Mutex<InstanceRecord>,
    started: std::sync::Mutex<Vec<String>>,
}

#[async_trait]
impl Instances for OneInstance {
    async fn ensure(
        &self,
        spec: &AppSpec,
        _: &str,
        _: &Owner,
    ) -> Result<InstanceRecord, InstanceError> {
        *self.started.lock().unwrap() = spec.command.clone();
        Ok(self.record.lock().unwrap().clone())
    }
    async fn connect(&self, i: &InstanceRecord) -> std::io::Result<InstanceStream> {
        Ok(InstanceStream::Tcp(
            tokio::net::TcpStream::connect(i.addr.tcp().expect("a TCP instance")).await?,
        ))
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

impl InstanceAdmin for OneInstance {
    fn logs(&self, _: &str, _: usize) -> Result<String, InstanceError> {
        Ok(String::new())
    }
    fn record(&self, id: &str) -> Option<InstanceRecord> {
        let r = self.record.lock().unwrap();
        (id == r.id).then(|| r.clone())
    }
}

/// A node port for `instance` with `store` on a free loopback port; its address, a client
/// node of the same cluster, and the guard that keeps it serving.
async fn node_port(
    instance: Arc<OneInstance>,
    store: Arc<dyn warden_store::Store>,
) -> (String, NodeClient, tokio::sync::watch::Sender<bool>) {
    let (ca_cert, ca_key) = new_ca().unwrap();
    let port = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = port.local_addr().unwrap().to_string();
    let beta = NodeTls::issue(&ca_cert, &ca_key, "beta", &addr).unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let stats = Arc::new(NodePortStats::default());
    let audit = std::sync::Arc::new(warden_core::audit::NoAudit);
    tokio::spawn(serve(
        port, beta, instance, store, stats, None, None, audit, stop,
    ));
    let alpha =
        NodeClient::new(&NodeTls::issue(&ca_cert, &ca_key, "alpha", "127.0.0.1:1").unwrap());
    (addr, alpha, stop_tx)
}

/// An instance record of app web, label SECRET, at `addr`.
fn one_instance(addr: &str) -> Arc<OneInstance> {
    let record: InstanceRecord = serde_json::from_value(serde_json::json!({
        "id": "i1", "app": "web", "label": "SECRET", "node": "beta", "addr": addr,
        "pid": 1, "state": "ready", "started_at_ms": 0,
    }))
    .unwrap();
    Arc::new(OneInstance {
        record: std::sync::Mutex::new(record),
        started: std::sync::Mutex::default(),
    })
}

fn store(dir: &tempfile::TempDir) -> Arc<dyn warden_store::Store> {
    Arc::new(warden_store::EmbeddedStore::open(&dir.path().join("store.redb")).unwrap())
}

#[tokio::test]
async fn a_node_is_joined_to_an_instance_only_for_the_label_it_serves() {
    // The "instance": says hello to whoever connects and keeps what it is sent.
    let app = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app_addr = app.local_addr().unwrap();
    let received = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let got = received.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = app.accept().await.unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut s, b"hello")
                .await
                .unwrap();
            let got = got.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    got.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            });
        }
    });
    let instance = one_instance(&app_addr.to_string());
    let dir = tempfile::tempdir().unwrap();
    let (addr, alpha, _serving) = node_port(instance.clone(), store(&dir)).await;

    let mut joined = alpha.join(&addr, "i1", "SECRET").await.unwrap();
    let mut hello = [0u8; 5];
    joined.read_exact(&mut hello).await.unwrap();
    assert_eq!(&hello, b"hello");

    for (id, label) in [("i1", "UNCLASSIFIED"), ("nope", "SECRET")] {
        let refused = alpha.join(&addr, id, label).await.err().unwrap();
        assert_eq!(
            refused.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "{id} {label}"
        );
    }

    // A request on the joined connection reaches the instance while it serves SECRET...
    tokio::io::AsyncWriteExt::write_all(&mut joined, b"one")
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while received.lock().unwrap().as_slice() != b"one" {
        assert!(
            std::time::Instant::now() < deadline,
            "the first request never arrived"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // ...and once it is relabelled (taint), the node closes the idle connection by itself, so
    // that no gateway reuses it, and nothing more reaches the instance through it.
    instance.record.lock().unwrap().label = "SECRET+A".into();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        joined.read_to_end(&mut rest),
    )
    .await;
    assert!(closed.is_ok(), "the idle connection is closed");
    let _ = tokio::io::AsyncWriteExt::write_all(&mut joined, b"two").await;
    assert_eq!(received.lock().unwrap().as_slice(), b"one");
}

/// A start asked by another node runs the app as the store holds it, whatever spec the asking
/// node sends; an app the store does not hold is not started.
#[tokio::test]
async fn a_node_asks_for_a_start_but_never_chooses_what_runs() {
    let instance = one_instance("127.0.0.1:1");
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir);
    let good = AppSpec::new("web", vec!["/srv/web/run".into()]);
    warden_store::put_json(&*store, &warden_core::keys::app_spec("web"), &good, None)
        .await
        .unwrap();
    let (addr, alpha, _serving) = node_port(instance.clone(), store).await;

    let forged = AppSpec::new("web", vec!["/bin/sh".into(), "-c".into(), "evil".into()]);
    alpha
        .ensure(&addr, &forged, "SECRET", &Owner::Shared)
        .await
        .unwrap();
    assert_eq!(
        *instance.started.lock().unwrap(),
        vec!["/srv/web/run".to_owned()]
    );

    let unknown = AppSpec::new("nope", vec!["/bin/true".into()]);
    let refused = alpha
        .ensure(&addr, &unknown, "SECRET", &Owner::Shared)
        .await;
    assert_eq!(refused, Err(InstanceError::UnknownApp("nope".into())));
}
