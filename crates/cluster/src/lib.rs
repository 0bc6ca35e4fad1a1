//! The cluster: how nodes reach each other's instances, and how a gateway gets instances on
//! any node.
//!
//! This crate owns the node port (a mutual-TLS listener on every agent node through which other
//! nodes of the cluster reach its instances and ask it to start one), node certificates issued
//! by the cluster CA, the view of live nodes and which of them answer ([`liveness`]), each
//! node's lease and record ([`node`]), the scheduler that places kept instances over the agent
//! nodes ([`schedule`]), and [`ClusterInstances`], the `Instances` a
//! gateway and an API use on a cluster: the local agent for instances of its own node (the
//! direct path, no hop), the node port of the node that runs any other.
//!
//! It must not import a role crate: the local agent is an `Arc<dyn InstanceAdmin>` here, and the
//! gateway only sees `Instances`. Consensus and replication are etcd's; this crate never
//! implements them.
#![forbid(unsafe_code)]

mod audit;
pub mod certs;
pub mod checker;
mod client;
mod directory;
#[cfg(test)]
mod ensure_tests;
mod instances;
pub mod liveness;
mod load;
pub mod node;
mod pending;
mod releases;
pub mod schedule;
mod server;
mod slugs;
pub mod tickets;
mod wire;

pub use audit::{watch_nodes, ClusterAudit};
pub use certs::{new_ca, NodeTls};
pub use checker::{Checker, CheckerStats};
pub use client::NodeClient;
pub use directory::Directory;
pub use instances::ClusterInstances;
pub use liveness::watch_peers;
pub use releases::ReleaseForwarder;
pub use server::{serve, NodePortStats};
pub use slugs::SlugFetcher;
pub use tickets::SharedTickets;

/// ALPN protocol of the node port.
pub const ALPN: &[u8] = b"warden-node/1";
