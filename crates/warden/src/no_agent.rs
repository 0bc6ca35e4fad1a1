//! The instances source of a process that runs no agent (`warden up --roles gateway,api`):
//! it reaches instances whose records name a TCP address, and says plainly that it can start
//! none. It is the gateway's data path; with no agent, the API has no instances source at all.
//! Its [`warden_core::InstanceAdmin`] (no instance is ever here) is for the node port a node
//! without an agent serves on a cluster, for its audit log: an instance request there finds
//! nothing.

use async_trait::async_trait;
use warden_core::{
    AppSpec, InstanceAdmin, InstanceError, InstanceRecord, InstanceStream, Instances, Owner,
    Unavailable,
};

/// No agent in this process.
pub struct NoAgent;

fn no_agent() -> InstanceError {
    InstanceError::unavailable(
        Unavailable::NoAgent,
        "no agent runs in this process; start warden with the agent role (warden up --roles …,agent)",
    )
}

#[async_trait]
impl Instances for NoAgent {
    async fn ensure(
        &self,
        _spec: &AppSpec,
        _label: &str,
        _owner: &Owner,
    ) -> Result<InstanceRecord, InstanceError> {
        Err(no_agent())
    }

    async fn connect(&self, instance: &InstanceRecord) -> std::io::Result<InstanceStream> {
        warden_sandbox::connect(&instance.addr)
            .await
            .map(InstanceStream::Tcp)
    }

    /// No instance of this process's own to stop: every one it reached runs elsewhere.
    fn retire(&self, _id: &str) {}

    fn relabel(&self, _id: &str, _label: &str) {}

    async fn kill(&self, _id: &str) -> Result<(), InstanceError> {
        Err(no_agent())
    }
}

/// No instance runs here: a node port's requests for one find none.
impl InstanceAdmin for NoAgent {
    fn record(&self, _id: &str) -> Option<InstanceRecord> {
        None
    }

    fn logs(&self, _id: &str, _lines: usize) -> Result<String, InstanceError> {
        Err(no_agent())
    }
}
