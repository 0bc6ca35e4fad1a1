//! Slugs across the cluster: a node that runs a release it did not build fetches the slug's
//! archive from a node that has it, over the node port (mutual TLS, so only nodes of the
//! cluster get slugs). The agent checks the archive against the digest in the app's spec.

use std::path::Path;

use async_trait::async_trait;
use warden_core::builds::{SlugSource, SlugSourceError};

use crate::{Directory, NodeClient};

/// Fetches slugs from the live nodes of the cluster, agent nodes first.
pub struct SlugFetcher {
    client: NodeClient,
    directory: Directory,
    me: String,
}

impl SlugFetcher {
    /// Fetches as `me` (never from itself) through `client`, from the nodes of `directory`.
    pub fn new(client: NodeClient, directory: Directory, me: String) -> Self {
        Self {
            client,
            directory,
            me,
        }
    }
}

#[async_trait]
impl SlugSource for SlugFetcher {
    async fn fetch(&self, slug: &str, into: &Path, max: u64) -> Result<(), SlugSourceError> {
        let mut tried = Vec::new();
        let mut nodes = self.directory.all();
        nodes.sort_by_key(|n| !n.roles.iter().any(|r| r == "api"));
        for node in nodes.iter().filter(|n| n.id != self.me) {
            let Some(addr) = &node.advertise else {
                continue;
            };
            match self.client.fetch_slug(addr, slug, into, max).await {
                Ok(()) => return Ok(()),
                Err(e) => tried.push((node.id.clone(), e)),
            }
        }
        if tried.is_empty() {
            return Err(SlugSourceError::NoNode);
        }
        Err(SlugSourceError::NoneGave(tried))
    }
}
