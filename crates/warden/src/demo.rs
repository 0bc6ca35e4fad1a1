//! `--demo`: a clearance lattice, users at several clearances, and the demo app.
//!
//! When the node has data (`--data`, or a private PostgreSQL), the demo app gets a database
//! too: a `notes` table with a note at UNCLASSIFIED and one at SECRET, so each user's page
//! lists the notes their clearance reads (`warden-demo-app`'s `notes`).
//!
//! Passwords are generated once per data directory and kept in `demo-users.json` (mode 0600);
//! only their Argon2id hashes go into the store.
//!
//! The demo is seeded once: the first start with `--demo` (no `demo-users.json` yet) writes the
//! lattice, the users and the app. Later starts leave them as the operator left them (a deleted
//! user or app stays deleted, a changed password stays changed); they only point the demo app
//! at the instance image beside the running binary if it still runs another binary's
//! `demo-app` (such as `warden demo-app`, which earlier versions registered). Deleting
//! `demo-users.json` seeds anew, with new passwords.

use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use warden_auth::Lattice;
use warden_core::{keys, AppSpec, UserRecord};
use warden_store::Store;

use crate::files;

/// Levels of the demo lattice, lowest first.
pub const LEVELS: [&str; 5] = [
    "UNCLASSIFIED",
    "RESTRICTED",
    "CONFIDENTIAL",
    "SECRET",
    "TOP SECRET",
];

/// A demo user as written to `demo-users.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DemoUser {
    pub name: String,
    pub password: String,
    pub clearance: String,
    pub groups: Vec<String>,
}

fn fresh_users() -> Vec<DemoUser> {
    let user = |name: &str, clearance: &str, groups: &[&str]| DemoUser {
        name: name.into(),
        password: warden_auth::generate_password(),
        clearance: clearance.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    };
    vec![
        user("alice", "SECRET", &["staff"]),
        user("bob", "CONFIDENTIAL", &["staff"]),
        user("carol", "TOP SECRET", &["admin", "staff"]),
        user("dave", "UNCLASSIFIED", &[]),
    ]
}

/// Sets up the demo and returns its users (with passwords, for the welcome message).
pub async fn setup(
    store: &dyn Store,
    data_dir: &Path,
    cost: warden_auth::Argon2Cost,
    clustered: bool,
    data: Option<&crate::data::Data>,
) -> anyhow::Result<Vec<DemoUser>> {
    let path = data_dir.join("demo-users.json");
    // The instance image, not `warden` itself: every instance execs the app's binary, and the
    // small one costs each far less memory (warden-instance's module documentation).
    let exe =
        warden_sandbox::image::instance_image_path().context("cannot register the demo app")?;
    if let Some(text) = files::read_private(&path)? {
        let users: Vec<DemoUser> = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is damaged; delete it and start again to seed the demo anew with new passwords",
                path.display()
            )
        })?;
        return seeded_before(store, users, &exe).await;
    }
    if clustered
        && warden_store::get_json::<AppSpec>(store, &keys::app_spec("demo"))
            .await?
            .is_some()
    {
        // Another node of the cluster seeded it: seeding again would change the passwords
        // that node shows.
        tracing::info!("the demo was seeded by another node; its data dir holds demo-users.json");
        return Ok(Vec::new());
    }
    if warden_store::get_json::<Lattice>(store, keys::LATTICE)
        .await?
        .is_none()
    {
        warden_store::put_json(store, keys::LATTICE, &Lattice::linear(LEVELS), None).await?;
    }
    let users = fresh_users();
    for u in &users {
        let password = u.password.clone();
        let hash =
            tokio::task::spawn_blocking(move || warden_auth::hash_password(&password, &cost))
                .await??;
        let record = UserRecord {
            name: u.name.clone(),
            password_hash: hash,
            clearance: u.clearance.clone(),
            groups: u.groups.clone(),
            generation: warden_core::id::short_id(),
            provider: None,
        };
        warden_store::put_json(store, &keys::user(&u.name), &record, None).await?;
    }
    let mut spec = AppSpec::new("demo", vec![exe.display().to_string(), "demo-app".into()]);
    spec.hosts = vec!["demo.localhost".into()];
    if let Some(d) = data {
        spec.data = seed_notes(store, d).await;
    }
    warden_store::put_json(store, &keys::app_spec("demo"), &spec, None).await?;
    // Written last: a start that fails before this seeds again.
    files::write_private(&path, serde_json::to_string_pretty(&users)?.as_bytes())?;
    tracing::info!("demo seeded: lattice, users and the demo app");
    Ok(users)
}

/// The demo's first notes: (label, text).
const NOTES: [(&str, &str); 2] = [
    (
        "UNCLASSIFIED",
        "Welcome to the demo: every clearance reads this note.",
    ),
    (
        "SECRET",
        "The launch is at dawn: only SECRET and TOP SECRET read this note.",
    ),
];

/// Gives the demo app its database and first notes; whether it has data. Made before the app
/// is stored, as an app created with `--data` is: no instance finds no database.
async fn seed_notes(store: &dyn Store, data: &crate::data::Data) -> bool {
    let lattice = match warden_store::get_json::<Lattice>(store, keys::LATTICE).await {
        Ok(Some((l, _))) => l,
        _ => Lattice::linear(LEVELS),
    };
    match data.seed_notes("demo", lattice, &NOTES).await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "the demo app gets no data: its database could not be made");
            false
        }
    }
}

/// A later start: nothing is written back but the demo app's binary; the users the welcome
/// shows are those that still exist.
async fn seeded_before(
    store: &dyn Store,
    users: Vec<DemoUser>,
    exe: &Path,
) -> anyhow::Result<Vec<DemoUser>> {
    tracing::info!(
        "the demo was seeded before; users, apps and the lattice stay as the operator left them"
    );
    if let Some((mut spec, _)) =
        warden_store::get_json::<AppSpec>(store, &keys::app_spec("demo")).await?
    {
        let exe = exe.display().to_string();
        let runs_demo_app = spec.command.len() == 2 && spec.command[1] == "demo-app";
        if runs_demo_app && spec.command[0] != exe {
            spec.command[0] = exe;
            warden_store::put_json(store, &keys::app_spec("demo"), &spec, None).await?;
        }
    }
    let mut present = Vec::new();
    for u in users {
        if warden_store::get_json::<UserRecord>(store, &keys::user(&u.name))
            .await?
            .is_some()
        {
            present.push(u);
        }
    }
    Ok(present)
}

/// The hidden `warden demo-app` command.
pub async fn run_app() -> anyhow::Result<()> {
    let port: u16 = std::env::var("PORT")
        .context("PORT is not set; the demo app is started by the warden agent")?
        .parse()
        .context("PORT is not a port number")?;
    warden_demo_app::serve(port, warden_demo_app::Identity::from_env()).await?;
    Ok(())
}
