//! Where the agent keeps the files of its instances: their logs and their private directories.

use std::path::PathBuf;

/// The agent's directories.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    /// Instance logs, `<app>-<id>.log`.
    pub logs: PathBuf,
    /// One private directory per instance, named by its id.
    pub instances: PathBuf,
    /// Built slugs, one directory per slug id (see `crate::build`).
    pub slugs: PathBuf,
}

impl Paths {
    /// The log file of instance `id` of `app`.
    pub(crate) fn log(&self, app: &str, id: &str) -> PathBuf {
        crate::logs::path(&self.logs, app, id)
    }

    /// The private directory of instance `id`.
    pub(crate) fn instance(&self, id: &str) -> PathBuf {
        self.instances.join(id)
    }

    /// Creates the private directory of instance `id`, mode 0700: what warden puts there for
    /// the instance's start (a sandbox's plan holds its environment) is no one else's.
    pub(crate) fn create_instance(&self, id: &str) -> std::io::Result<PathBuf> {
        let dir = self.instance(id);
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&dir)?;
        Ok(dir)
    }

    /// Removes the private directories that instances of an earlier run of this node left
    /// behind: they died with that run (parent-death signal) or were ended at this start
    /// ([`crate::drivers::leftovers::end_leftovers`], called first), so none is in use. Only
    /// names that are instance ids are touched. Returns how many went.
    pub(crate) fn remove_leftovers(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.instances) else {
            return 0;
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let name = e.file_name();
            let is_id = name.to_str().is_some_and(|n| {
                n.len() == 16
                    && n.bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            });
            if is_id && std::fs::remove_dir_all(e.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }
}
