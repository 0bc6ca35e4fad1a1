//! Where a node keeps built slugs, how slugs missing here are fetched,, and what an instance of a release runs: the spec with the
//! slug as its working directory and the slug's own bin directories first on its PATH.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use warden_core::{AppSpec, BuildKind};

use warden_core::INSTANCE_PATH;

/// File beside a slug's tree: how it was built and what it runs.
pub(crate) const MARK: &str = "slug.json";
/// File beside a slug's tree holding its archive's SHA-256, written last: the slug is
/// complete when it is there.
pub(crate) const DIGEST: &str = warden_core::builds::slug_files::DIGEST;

/// What [`MARK`] holds.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Mark {
    pub kind: BuildKind,
    pub command: Vec<String>,
    /// The release phase's command; absent from slugs built before it was kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub release: Vec<String>,
    /// The other process types' commands; absent (`None`) from slugs built before they were
    /// kept, whose Procfile is then read again ([`crate::complete`]), so that such a slug,
    /// reused by an unchanged push, a config change or a rollback, does not take its types
    /// away. Always written, `{}` for none.
    #[serde(default)]
    pub processes: Option<std::collections::BTreeMap<String, Vec<String>>>,
    /// The interpreter its dependencies were installed for (see [`crate::reuse`]); absent
    /// from slugs built before it was kept, and for kinds without dependencies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub built_with: Option<String>,
}

/// The tree of slug `id` under `slugs`.
pub fn tree(slugs: &Path, id: &str) -> PathBuf {
    slugs.join(id).join("app")
}

/// The mark of slug `id` and its archive's digest, if it is complete here.
pub(crate) fn mark(slugs: &Path, id: &str) -> Option<(Mark, String)> {
    if !warden_core::model::is_slug_id(id) {
        return None;
    }
    let digest = std::fs::read_to_string(slugs.join(id).join(DIGEST)).ok()?;
    let bytes = std::fs::read(slugs.join(id).join(MARK)).ok()?;
    Some((
        serde_json::from_slice(&bytes).ok()?,
        digest.trim().to_owned(),
    ))
}

/// What an instance of `spec` runs on this node: `spec` itself, or for a release the spec in
/// its slug, with the slug's virtual environment and node_modules/.bin first on PATH (unless
/// the app sets PATH itself).
pub fn run_spec<'a>(slugs: &Path, spec: &'a AppSpec) -> Result<Cow<'a, AppSpec>, SlugError> {
    let Some(release) = &spec.release else {
        return Ok(Cow::Borrowed(spec));
    };
    if mark(slugs, &release.slug).is_none() {
        return Err(SlugError::NoSlug {
            slug: release.slug.clone(),
        });
    }
    let tree = tree(slugs, &release.slug);
    let t = tree.display();
    let mut run = spec.clone();
    run.workdir = Some(t.to_string());
    run.env
        .entry("PATH".into())
        .or_insert_with(|| format!("{t}/.venv/bin:{t}/node_modules/.bin:{INSTANCE_PATH}"));
    Ok(Cow::Owned(run))
}

/// Removes what interrupted builds and fetches left under `slugs` (scratch trees, slugs
/// without their digest); run at start, when none is under way. Returns how many went.
pub fn sweep(slugs: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(slugs) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let scratch = name.starts_with(".unpack-") || name.starts_with(".fetch-");
        let unfinished = warden_core::model::is_slug_id(&name) && !e.path().join(DIGEST).is_file();
        if (scratch || unfinished) && std::fs::remove_dir_all(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Brings slugs this node did not build from a node that has them (see
/// `warden_core::builds::SlugSource`), once per slug, checked against the digest the app's
/// spec names.
#[derive(Default)]
pub struct Fetcher {
    source: std::sync::OnceLock<std::sync::Arc<dyn warden_core::builds::SlugSource>>,
    /// One lock per slug id, for fetches and builds alike; never removed (one small entry per
    /// slug the node has ever had), so that no two holders of one id's lock exist.
    gates: std::sync::Mutex<Gates>,
}

type Gates = std::collections::HashMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>;

/// Largest slug archive a node fetches.
const MAX_FETCH: u64 = 16 << 30;

impl Fetcher {
    /// The lock of slug `id`: whoever builds or fetches it holds it.
    pub fn gate(&self, id: &str) -> std::sync::Arc<tokio::sync::Mutex<()>> {
        self.gates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(id.to_owned())
            .or_default()
            .clone()
    }

    /// Where slugs come from; set once, when the node joins its cluster.
    pub fn set_source(&self, source: std::sync::Arc<dyn warden_core::builds::SlugSource>) {
        let _ = self.source.set(source);
    }

    /// Makes sure the slug of `release` is on this node, fetching it if it is not.
    pub async fn ensure(
        &self,
        slugs: &Path,
        release: &warden_core::SpecRelease,
    ) -> Result<(), SlugError> {
        if mark(slugs, &release.slug).is_some() {
            return Ok(());
        }
        let missing = || SlugError::NoSlug {
            slug: release.slug.clone(),
        };
        let (Some(source), Some(digest)) = (self.source.get(), &release.archive) else {
            return Err(missing());
        };
        let gate = self.gate(&release.slug);
        let _one = gate.lock().await;
        if mark(slugs, &release.slug).is_some() {
            return Ok(());
        }
        let result = self.fetch(&**source, slugs, &release.slug, digest).await;
        result.map_err(|source| SlugError::Fetch {
            slug: release.slug.clone(),
            source: Box::new(source),
        })
    }

    async fn fetch(
        &self,
        source: &dyn warden_core::builds::SlugSource,
        slugs: &Path,
        id: &str,
        digest: &str,
    ) -> Result<(), FetchError> {
        let dir = |path: &Path| {
            let path = path.to_owned();
            move |source| FetchError::Directory { path, source }
        };
        std::fs::create_dir_all(slugs).map_err(dir(slugs))?;
        let scratch = slugs.join(format!(".fetch-{}", warden_core::id::short_id()));
        std::fs::create_dir(&scratch).map_err(dir(&scratch))?;
        let file = scratch.join(crate::archive::FILE);
        let result = async {
            source.fetch(id, &file, MAX_FETCH).await?;
            let (scratch2, digest, home) = (scratch.clone(), digest.to_owned(), slugs.join(id));
            tokio::task::spawn_blocking(move || install(&scratch2, &digest, &home)).await?
        }
        .await;
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&scratch);
        } else {
            tracing::info!(slug = %id, "fetched a release's slug from another node");
        }
        result
    }
}

/// Checks the archive fetched into `scratch` against `digest`, unpacks it there and moves the
/// slug to `home`, complete (its digest file written last).
fn install(scratch: &Path, digest: &str, home: &Path) -> Result<(), FetchError> {
    let file = scratch.join(crate::archive::FILE);
    let got = crate::archive::sha256_file(&file).map_err(FetchError::Hash)?;
    if got != digest {
        return Err(FetchError::Digest {
            got,
            want: digest.to_owned(),
        });
    }
    crate::unpack::unpack(
        &file,
        scratch,
        MAX_FETCH * 8,
        true,
        &std::sync::atomic::AtomicBool::new(false),
    )
    .map_err(FetchError::Unpack)?;
    let mark = scratch.join(DIGEST);
    std::fs::write(&mark, digest).map_err(|source| FetchError::Directory { path: mark, source })?;
    let _ = std::fs::remove_dir_all(home);
    std::fs::rename(scratch, home).map_err(|source| FetchError::Directory {
        path: home.to_owned(),
        source,
    })
}

/// Why the slug of a release is not there to run.
#[derive(Debug, thiserror::Error)]
pub enum SlugError {
    /// The release's slug is not on this node.
    #[error("the release's slug {slug} is not on this node; push the app again through an API node that can reach it")]
    NoSlug {
        /// The slug's id.
        slug: String,
    },
    /// The release's slug could not be fetched from another node.
    #[error("cannot fetch the release's slug {slug}: {source}")]
    Fetch {
        /// The slug's id.
        slug: String,
        /// Why.
        source: Box<FetchError>,
    },
}

/// Why a slug could not be brought from another node.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No node gave the archive.
    #[error(transparent)]
    Source(#[from] warden_core::builds::SlugSourceError),
    /// A file or directory of the slug could not be made on this node.
    #[error("cannot write {}: {source}; give warden room and write access in its data dir", path.display())]
    Directory {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The fetched archive could not be read back.
    #[error("cannot read the fetched archive: {0}")]
    Hash(#[source] std::io::Error),
    /// The fetched archive is not the one the app's spec names.
    #[error("the fetched slug's digest is {got}, not {want}; the node that sent it holds a damaged or different slug")]
    Digest {
        /// What the archive hashes to.
        got: String,
        /// What the spec names.
        want: String,
    },
    /// The fetched archive could not be unpacked.
    #[error("cannot unpack the fetched slug: {0}")]
    Unpack(#[source] warden_core::builds::BuildError),
    /// The task checking and unpacking it failed (a bug, or the runtime stopping).
    #[error("checking the fetched slug stopped: {0}")]
    Task(#[from] tokio::task::JoinError),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out the bytes it holds as any slug's archive.
    struct Source(Vec<u8>);

    #[async_trait::async_trait]
    impl warden_core::builds::SlugSource for Source {
        async fn fetch(
            &self,
            _slug: &str,
            into: &Path,
            _max: u64,
        ) -> Result<(), warden_core::builds::SlugSourceError> {
            std::fs::write(into, &self.0).expect("write the archive");
            Ok(())
        }
    }

    /// A built slug's archive (mark and tree), and its digest.
    fn archive() -> (Vec<u8>, String) {
        let home = tempfile::tempdir().expect("dir");
        std::fs::create_dir(home.path().join("app")).expect("app");
        std::fs::write(home.path().join("app/server.py"), "print(1)").expect("write");
        std::os::unix::fs::symlink("/usr/bin/python3", home.path().join("app/python"))
            .expect("link");
        let mark = Mark {
            kind: BuildKind::Procfile,
            command: vec!["python3".into(), "server.py".into()],
            release: Vec::new(),
            processes: None,
            built_with: None,
        };
        std::fs::write(
            home.path().join(MARK),
            serde_json::to_vec(&mark).expect("json"),
        )
        .expect("write");
        let digest = crate::archive::pack(home.path()).expect("pack");
        (
            std::fs::read(home.path().join(crate::archive::FILE)).expect("read"),
            digest,
        )
    }

    fn release(digest: &str) -> warden_core::SpecRelease {
        warden_core::SpecRelease {
            number: 1,
            slug: "ab".repeat(32),
            archive: Some(digest.to_owned()),
        }
    }

    #[tokio::test]
    async fn a_fetched_slug_is_kept_only_when_its_digest_matches() {
        let (bytes, digest) = archive();
        let slugs = tempfile::tempdir().expect("dir");
        let f = Fetcher::default();
        let none = f.ensure(slugs.path(), &release(&digest)).await;
        assert!(
            matches!(none, Err(SlugError::NoSlug { .. })),
            "no source, no slug"
        );

        let mut tampered = bytes.clone();
        let last = tampered.len() - 9;
        tampered[last] ^= 1;
        f.set_source(std::sync::Arc::new(Source(tampered)));
        let err = f
            .ensure(slugs.path(), &release(&digest))
            .await
            .expect_err("tampered");
        assert!(
            matches!(&err, SlugError::Fetch { source, .. } if matches!(**source, FetchError::Digest { .. })),
            "{err}"
        );
        assert!(err.to_string().contains("digest"), "{err}");
        assert!(mark(slugs.path(), &"ab".repeat(32)).is_none());

        let good = Fetcher::default();
        good.set_source(std::sync::Arc::new(Source(bytes)));
        good.ensure(slugs.path(), &release(&digest))
            .await
            .expect("fetched");
        let (m, d) = mark(slugs.path(), &"ab".repeat(32)).expect("complete");
        assert_eq!((m.kind, d), (BuildKind::Procfile, digest));
        let tree = tree(slugs.path(), &"ab".repeat(32));
        assert!(tree.join("server.py").is_file());
        assert_eq!(
            std::fs::read_link(tree.join("python")).expect("link"),
            Path::new("/usr/bin/python3")
        );
        // Nothing of the failed try is left behind.
        let left: Vec<_> = std::fs::read_dir(slugs.path())
            .expect("list")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 1, "{left:?}");
    }
}
