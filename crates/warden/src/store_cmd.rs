//! `warden store`: backing up a running warden's store, and putting a backup back into the
//! data dir of a stopped one.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// `warden store ...`
#[derive(Debug, clap::Subcommand)]
pub enum StoreCommand {
    /// Write a consistent snapshot of a running warden's apps, users and lattice to FILE
    /// (mode 0600: it holds password hashes)
    Backup {
        /// Where to write the backup
        file: PathBuf,
        #[command(flatten)]
        client: warden_cli::ClientArgs,
    },
    /// Read a stopped warden's store file through without writing to it, and say whether it is
    /// sound (exit status 0) or damaged (1, with what to do)
    Check {
        /// The data dir of the warden to check (it must not be running)
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// Put a backup back into the data dir of a stopped warden, after checking its digest, its
    /// MAC under the backup key, and every record. The store file it replaces, if any, is kept
    /// beside it as `store.redb.replaced-<time>`
    Restore {
        /// The backup, as `warden store backup` wrote it
        file: PathBuf,
        /// The data dir of the warden to restore (it must not be running)
        #[arg(long)]
        data_dir: PathBuf,
        /// The backup key of the warden that took the backup (its data dir's `backup-key`);
        /// by default DATA_DIR/backup-key
        #[arg(long)]
        key: Option<PathBuf>,
        /// Restore even a backup whose digest or MAC does not match, or that has none (it may
        /// have been damaged or edited); its records are still checked
        #[arg(long)]
        force: bool,
    },
}

/// Runs a `warden store` command.
pub async fn run(cmd: StoreCommand) -> anyhow::Result<()> {
    match cmd {
        StoreCommand::Backup { file, client } => warden_cli::backup(&client, &file).await,
        StoreCommand::Restore {
            file,
            data_dir,
            key,
            force,
        } => restore(&file, &data_dir, key.as_deref(), force).await,
        StoreCommand::Check { data_dir } => check(&data_dir),
    }
}

/// Proves the store file sound by the code `warden up` runs before it writes to it.
fn check(data_dir: &Path) -> anyhow::Result<()> {
    let path = data_dir.join("store.redb");
    let report = warden_store::embedded::verify::prove(&path)?;
    if !report.damaged.is_empty() {
        for (key, why) in &report.damaged {
            eprintln!("damaged record {key}: {why}");
        }
        anyhow::bail!(
            "{} reads through, but {} of its records are damaged (listed above): warden skips and reports them. Restore a backup with `warden store restore BACKUP --data-dir {}`, or delete and create those records again",
            path.display(),
            report.damaged.len(),
            data_dir.display()
        );
    }
    println!(
        "{} reads through: {} records, every checksum matches{}",
        path.display(),
        report.records,
        if report.recovered {
            " (its last writer did not close it; the next start recovers it)"
        } else {
            ""
        }
    );
    Ok(())
}

/// The backup key: the file given, or the data dir's own; `None` when neither exists.
fn backup_key(data_dir: &Path, given: Option<&Path>) -> anyhow::Result<Option<String>> {
    let path = given.map_or_else(|| data_dir.join(crate::up::BACKUP_KEY_FILE), Path::to_owned);
    match std::fs::read_to_string(&path) {
        Ok(k) if !k.trim().is_empty() => Ok(Some(k.trim().to_owned())),
        Ok(_) => anyhow::bail!("the backup key {} is empty", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && given.is_none() => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read the backup key {}", path.display())),
    }
}

/// Builds a new store file from the backup beside the old one, then swaps it in: a failure
/// at any step leaves the data dir as it was.
async fn restore(
    file: &Path,
    data_dir: &Path,
    key: Option<&Path>,
    force: bool,
) -> anyhow::Result<()> {
    // A mistyped path must not become a new, empty-looking data dir that nothing ever starts on.
    if !data_dir.is_dir() {
        anyhow::bail!(
            "the data dir {} does not exist (or is not a directory): check the path. To restore into a new data dir, create it first (mkdir -m 700 {})",
            data_dir.display(),
            data_dir.display()
        );
    }
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let backup = warden_store::backup::parse(&bytes)
        .with_context(|| format!("{} cannot be restored", file.display()))?;
    let key = backup_key(data_dir, key)?;
    if let Err(e) = warden_store::backup::verify(&backup, key.as_deref().map(str::as_bytes)) {
        if !force {
            anyhow::bail!(
                "{} cannot be restored: {e}. Restore a backup that proves itself, give the backup key of the warden that took it with --key FILE, or, knowing the backup may be damaged or edited, restore it anyway with --force",
                file.display()
            );
        }
        eprintln!(
            "WARNING: restoring {} although {e} (--force); its records are still checked",
            file.display()
        );
    }
    // Every record is checked before anything is built: a damaged one stops the restore here.
    warden_store::backup::records(&backup)
        .with_context(|| format!("{} cannot be restored", file.display()))?;
    let target = data_dir.join("store.redb");
    let building = data_dir.join("store.redb.restoring");
    let _ = std::fs::remove_file(&building);
    // A running warden holds the store file locked: opening it tells. A damaged file is what
    // a restore is for, so that error is no reason to stop.
    if target.exists() {
        if let Err(e) = warden_store::EmbeddedStore::open(&target) {
            if e.to_string().contains("another warden process has it open") {
                anyhow::bail!(
                    "a warden is running on {}: stop it first, then restore",
                    data_dir.display()
                );
            }
        }
    }
    let records = {
        let store = warden_store::EmbeddedStore::open(&building)
            .with_context(|| format!("cannot create {}", building.display()))?;
        warden_store::backup::restore(&store, &backup)
            .await
            .with_context(|| format!("cannot restore {}", file.display()))?
    };
    if target.exists() {
        let kept = data_dir.join(format!(
            "store.redb.replaced-{}",
            warden_core::model::now_ms()
        ));
        std::fs::rename(&target, &kept)
            .with_context(|| format!("cannot move {} aside", target.display()))?;
        println!("the store it replaces is kept as {}", kept.display());
    }
    std::fs::rename(&building, &target)
        .with_context(|| format!("cannot move the restored store into {}", target.display()))?;
    crate::files::protect_store_file(data_dir)?;
    // Restored into a new data dir, the warden keeps sealing backups under the key given.
    let own_key = data_dir.join(crate::up::BACKUP_KEY_FILE);
    if let (Some(k), false) = (&key, own_key.exists()) {
        crate::files::write_private(&own_key, k.as_bytes())?;
        println!("the backup key is kept in {}", own_key.display());
    }
    println!(
        "restored {records} records (store revision {} of the backup) into {}",
        backup.revision,
        target.display()
    );
    Ok(())
}
