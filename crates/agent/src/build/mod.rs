//! Running builds and trials through the node's driver: the agent's half of slugs. What a
//! slug is, where it lives, unpacking, recognising, finishing and fetching it are
//! [`warden_slugs`]'s; here a build script runs in a sandbox (`run`) and a release's trial
//! instance starts outside routing (`trial`). [`Builder`] implements
//! [`warden_core::builds::Builds`] for the API.

mod oneoff;
mod release;
mod run;
mod trial;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use warden_core::builds::{
    BuildError, Builds, Built, Output, Prepared, ReleasePhaseError, TrialError,
};
use warden_core::data::DataPlane;
use warden_core::{AppSpec, BuildKind};

use crate::drivers::Drivers;
use crate::paths::Paths;

/// Builds slugs and tries releases on this node.
pub struct Builder {
    drivers: Arc<Drivers>,
    paths: Paths,
    time_limit: Duration,
    max_unpacked: u64,
    /// One lock per slug, shared with the fetcher: two pushes of one tree build it once, and
    /// a fetch never meets a build of the same slug.
    locks: Arc<warden_slugs::Fetcher>,
    /// Apps' databases: a release phase reaches its app's as the owner.
    data: Option<Arc<dyn DataPlane>>,
}

impl Builder {
    pub(crate) fn new(
        drivers: Arc<Drivers>,
        paths: Paths,
        time_limit: Duration,
        max_unpacked: u64,
        locks: Arc<warden_slugs::Fetcher>,
        data: Option<Arc<dyn DataPlane>>,
    ) -> Self {
        Self {
            drivers,
            paths,
            time_limit,
            max_unpacked,
            locks,
            data,
        }
    }

    fn node_error(what: &str, e: impl std::fmt::Display) -> BuildError {
        BuildError::Node(format!("cannot {what}: {e}"))
    }

    /// The built slug `id`, if it is complete.
    fn complete(&self, id: &str, cached: bool) -> Option<Built> {
        warden_slugs::complete(&self.paths.slugs, id, cached)
    }
}

/// Sets its flag when dropped: a blocking task watching the flag stops.
#[derive(Default)]
struct CallOff(Arc<AtomicBool>);

impl Drop for CallOff {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[async_trait]
impl Builds for Builder {
    async fn prepare(
        &self,
        _app: &str,
        archive: &Path,
        digest: &str,
        kind: Option<BuildKind>,
    ) -> Result<Prepared, BuildError> {
        let slugs = self.paths.slugs.clone();
        let max = self.max_unpacked;
        let (archive, digest) = (archive.to_owned(), digest.to_owned());
        // Dropped with this future (the client went away, warden is stopping): the unpack
        // stops at its next read and leaves nothing behind.
        let called_off = CallOff::default();
        let cancel = called_off.0.clone();
        tokio::task::spawn_blocking(move || {
            warden_slugs::unpack_pushed(&slugs, &archive, &digest, kind, max, &cancel)
        })
        .await
        .map_err(|e| Self::node_error("unpack the archive", e))?
        .map(|mut p| {
            if let Some(b) = self.complete(&p.slug, true) {
                if let Some(t) = p.tree.take() {
                    let _ = std::fs::remove_dir_all(t);
                }
                p.built = Some(b);
            }
            p
        })
    }

    async fn build(&self, prepared: Prepared, out: Output) -> Result<Built, BuildError> {
        if let Some(b) = prepared.built {
            return Ok(b);
        }
        let Some(scratch) = prepared.tree else {
            return Err(BuildError::Node("nothing was unpacked to build".into()));
        };
        let id = prepared.slug.clone();
        let gate = self.locks.gate(&id);
        let _building = gate.lock().await;
        let previous = prepared.previous.filter(|p| *p != id);
        let result = self
            .build_locked(&id, &scratch, prepared.kind, previous, &out)
            .await;
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&scratch)).await;
        result
    }

    async fn trial(&self, spec: &AppSpec, label: &str) -> Result<(), TrialError> {
        trial::trial(
            &self.drivers,
            &self.paths,
            self.data.as_deref(),
            spec,
            label,
        )
        .await
    }

    async fn release_phase(
        &self,
        spec: &AppSpec,
        command: &[String],
        out: Output,
    ) -> Result<(), ReleasePhaseError> {
        let run = release::ReleaseRun {
            drivers: &self.drivers,
            paths: &self.paths,
            data: self.data.as_deref(),
            limit: self.time_limit,
        };
        run.run(spec, command, &out).await
    }

    async fn one_off(
        &self,
        spec: &AppSpec,
        label: &str,
        command: &[String],
    ) -> Result<warden_core::oneoff::OneOff, warden_core::oneoff::OneOffError> {
        // On a cluster the release may have been built on another node: fetched as an
        // instance's start fetches it.
        if let Some(release) = &spec.release {
            self.locks
                .ensure(&self.paths.slugs, release)
                .await
                .map_err(|e| warden_core::oneoff::OneOffError::Node(e.to_string()))?;
        }
        oneoff::start(
            self.drivers.clone(),
            &self.paths,
            self.data.clone(),
            spec,
            label,
            command,
        )
        .await
    }

    fn built(&self, slug: &str) -> Option<Built> {
        self.complete(slug, true)
    }
}

impl Builder {
    async fn build_locked(
        &self,
        id: &str,
        scratch: &Path,
        kind: BuildKind,
        previous: Option<String>,
        out: &Output,
    ) -> Result<Built, BuildError> {
        if let Some(b) = self.complete(id, true) {
            return Ok(b);
        }
        let slugs = self.paths.slugs.clone();
        let (tree, recipe) = warden_slugs::place(&slugs, id, scratch, kind)?;
        let reused = match previous {
            Some(p) => {
                let (slugs, tree, kind) = (slugs.clone(), tree.clone(), recipe.kind);
                // A complete slug is sealed and never written again, and the serving
                // release's is never swept; its gate is not taken (two builds each holding
                // their own and waiting for the other's would never end). A copy that fails
                // leaves a build from nothing.
                tokio::task::spawn_blocking(move || warden_slugs::reuse(&slugs, &p, &tree, kind))
                    .await
                    .ok()
                    .flatten()
            }
            None => None,
        };
        if let Err(e) = self.run_recipe(&recipe, &tree, reused, out).await {
            warden_slugs::discard(&slugs, id);
            return Err(e);
        }
        let id = id.to_owned();
        tokio::task::spawn_blocking(move || warden_slugs::complete_build(&slugs, &id, &recipe))
            .await
            .map_err(|e| Self::node_error("pack the slug", e))?
    }

    async fn run_recipe(
        &self,
        recipe: &warden_slugs::Recipe,
        tree: &Path,
        reused: Option<warden_slugs::Reuse>,
        out: &Output,
    ) -> Result<(), BuildError> {
        if recipe.script.is_some() {
            out(&format!("-----> building a {} app", recipe.kind.name()));
        }
        match reused {
            Some(warden_slugs::Reuse::Unchanged) => out(
                "-----> the dependencies are those of the serving release (the files naming them are unchanged): nothing to install",
            ),
            Some(warden_slugs::Reuse::Changed) => out(
                "-----> starting from the serving release's dependencies: installing what changed",
            ),
            None => {}
        }
        let script = match reused {
            Some(warden_slugs::Reuse::Unchanged) => None,
            _ => recipe.script.as_ref(),
        };
        if let Some(script) = script {
            run::run_script(
                &self.drivers,
                &self.paths,
                "build",
                tree,
                script,
                self.time_limit,
                out,
            )
            .await?;
        } else if reused.is_none() {
            out(&format!(
                "-----> a {} app: nothing to build",
                recipe.kind.name()
            ));
        }
        let tree2 = tree.to_owned();
        // The build's processes died with its sandbox: nothing but warden writes the tree now.
        tokio::task::spawn_blocking(move || warden_slugs::finish_tree(&tree2))
            .await
            .map_err(|e| Self::node_error("finish the slug", e))?
            .map_err(|e| Self::node_error("finish the slug", e))
    }
}
