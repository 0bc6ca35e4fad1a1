//! The node port over real sockets: a node of the cluster is joined to an instance only while
//! the instance serves the label the node asks for.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;

use async_trait::async_trait;
use tokio::io::AsyncReadExt;
use warden_cluster::{new_ca, serve, NodeClient, NodePortStats, NodeTls};
use warden_core::{
    Activity, AppSpec, InstanceError, InstanceRecord, InstanceStream, Instances, Owner,
};

/// One instance, at `addr`, serving `label`.
struct OneInstance {
    record: InstanceRecord,
}

#[async_trait]
impl Instances for OneInstance {
    async fn ensure(
        &self,
        _: &AppSpec,
        _: &str,
        _: &Owner,
    ) -> Result<InstanceRecord, InstanceError> {
        Ok(self.record.clone())
    }
    async fn connect(&self, i: &InstanceRecord) -> std::io::Result<InstanceStream> {
        Ok(InstanceStream::Tcp(
            tokio::net::TcpStream::connect(&i.addr).await?,
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
    fn logs(&self, _: &str, _: usize) -> Result<String, InstanceError> {
        Ok(String::new())
    }
    fn record(&self, id: &str) -> Option<InstanceRecord> {
        (id == self.record.id).then(|| self.record.clone())
    }
}

#[tokio::test]
async fn a_node_is_joined_to_an_instance_only_for_the_label_it_serves() {
    // The "instance": says hello to whoever connects.
    let app = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app_addr = app.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = app.accept().await.unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut s, b"hello")
                .await
                .unwrap();
        }
    });
    let record: InstanceRecord = serde_json::from_value(serde_json::json!({
        "id": "i1", "app": "web", "label": "SECRET", "node": "beta", "addr": app_addr.to_string(),
        "pid": 1, "state": "ready", "started_at_ms": 0,
    }))
    .unwrap();

    let (ca_cert, ca_key) = new_ca().unwrap();
    let port = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = port.local_addr().unwrap().to_string();
    let beta = NodeTls::issue(&ca_cert, &ca_key, "beta", &addr).unwrap();
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let stats = Arc::new(NodePortStats::default());
    tokio::spawn(serve(
        port,
        beta,
        Arc::new(OneInstance { record }),
        stats.clone(),
        stop,
    ));
    let alpha =
        NodeClient::new(&NodeTls::issue(&ca_cert, &ca_key, "alpha", "127.0.0.1:1").unwrap());

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
}
