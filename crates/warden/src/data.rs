//! Where apps' data lives (`--data`, a private PostgreSQL, or none) and the [`DataPlane`] the
//! agent and the API reach it through, over `warden-data`.

use std::path::Path;
use std::sync::{Arc, RwLock, Weak};

use anyhow::Context;
use warden_auth::lattice::Lattice;
use warden_core::data::{AppData, DataError, DataFuture, DataPlane, DataSocket, TableRows};
use warden_data::proxy::{Heal, Limits, Listener, Pool, ServerAddr, Target};
use warden_data::schema::{self, Admin, DataKey, RoleLogin, SchemaError};
use warden_data::server::{Endpoint, Server, ServerError};

use crate::config::Config;

/// The file in the data dir that holds the data key (hex, mode 0600).
const DATA_KEY_FILE: &str = "data-key";

/// The data server warden uses, its key, the lattice its labels rank by, and the pool every
/// instance's socket shares.
pub struct Data {
    server: Server,
    key: DataKey,
    lattice: RwLock<Lattice>,
    pool: Pool,
    /// Itself, for the sockets' heals, which outlive the call that binds them.
    me: Weak<Data>,
    /// When each role's password was last set again (at most once per [`HEAL_EVERY`]).
    healed: HealLimit,
}

/// The least time between two heals of one role's password: an instance that changes its
/// password in a loop must not have warden run `ALTER ROLE` as fast as its clients log in.
const HEAL_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Per role, when its password was last set again.
#[derive(Default)]
struct HealLimit(std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>);

impl HealLimit {
    /// Whether `role` may be healed at `now`; if so, `now` is its last heal. Entries older
    /// than [`HEAL_EVERY`] are dropped, so the map holds only roles healed lately.
    fn allow(&self, role: &str, now: std::time::Instant) -> bool {
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        last.retain(|_, at| now.saturating_duration_since(*at) < HEAL_EVERY);
        if last.contains_key(role) {
            return false;
        }
        last.insert(role.to_owned(), now);
        true
    }
}

/// The data server the settings name: `--data`'s, a private one under `<data dir>/postgres`
/// when PostgreSQL's server programs are installed, or none (with why). `cluster` is the
/// cluster's secrets on an etcd store (`None` on one node): the data key derives from them.
pub async fn open(
    cfg: &Config,
    cluster: Option<&crate::cluster::Secrets>,
) -> anyhow::Result<Result<Arc<Data>, String>> {
    let server = match &cfg.data {
        Some(url) if url.0 == "none" => return Ok(Err("none (--data none)".into())),
        Some(url) => Server::external(&url.0).context("cannot use --data")?,
        // A private PostgreSQL per node would split an app's data between nodes.
        None if cluster.is_some() => {
            return Ok(Err(
                "none (a cluster keeps apps' data in one PostgreSQL every node reaches: start \
                 each node with --data postgres://ADMIN@HOST/DB)"
                    .into(),
            ))
        }
        None => match Server::private(&cfg.data_dir.join("postgres")).await {
            Ok(s) => s,
            Err(e @ (ServerError::ProgramsMissing(_) | ServerError::TooOld { .. })) => {
                return Ok(Err(format!("none ({e})")));
            }
            // Everything but data still works: say why, and apps with data are refused.
            Err(e) => {
                tracing::error!(error = %e, "the private PostgreSQL did not start; apps cannot have data until it does");
                return Ok(Err(format!(
                    "none (the private PostgreSQL did not start: {e})"
                )));
            }
        },
    };
    let key = match cluster {
        Some(secrets) => cluster_data_key(&secrets.identity_key)?,
        None => data_key(&cfg.data_dir)?,
    };
    Ok(Ok(Arc::new_cyclic(|me| Data {
        server,
        key,
        lattice: RwLock::new(Lattice::default()),
        pool: Pool::new(Limits::default()),
        me: me.clone(),
        healed: HealLimit::default(),
    })))
}

/// HKDF's info for the data key: what sets it apart from every other key derived from the
/// cluster's identity key.
const CLUSTER_DATA_KEY_INFO: &[u8] = b"warden data key v1";

/// A cluster's data key: HKDF-SHA256 of the cluster's identity key (which every node opens
/// from the sealed secrets with the join token), with an info string of its own. Every node
/// derives the same key and nothing new is stored; role passwords are HMACs of it, so two
/// nodes attaching instances of one label set the same password rather than each other's.
/// The identity key itself never leaves warden (instances get HMACs of it, never it), so no
/// instance can derive this key.
fn cluster_data_key(identity_hex: &str) -> anyhow::Result<DataKey> {
    crate::keys::cluster_key(identity_hex, CLUSTER_DATA_KEY_INFO, "the data key").map(DataKey)
}

/// The data key of one node: made once per data dir, mode 0600. Role passwords derive from
/// it, so it must stay with the data dir (a new key means every role's password changes at its
/// next use).
fn data_key(dir: &Path) -> anyhow::Result<DataKey> {
    let path = dir.join(DATA_KEY_FILE);
    let text = crate::files::load_or_create(&path, warden_core::id::secret_token)?;
    let key = crate::keys::decode_key(&text).ok_or_else(|| {
        anyhow::anyhow!(
            "{} is damaged (it must be 64 hex digits); restore it from a backup of the data dir",
            path.display()
        )
    })?;
    Ok(DataKey(key))
}

// === impl Data ===

impl Data {
    /// Stops a private server.
    pub async fn shutdown(self: Arc<Self>) {
        match Arc::try_unwrap(self) {
            Ok(d) => d.server.shutdown().await,
            // Held by the agent or the API a little longer: the private server stops when the
            // last of them lets go (`PrivateServer`'s drop), or with warden's process.
            Err(_) => tracing::debug!("the data server is still held at stop"),
        }
    }

    fn admin(&self) -> Admin<'_> {
        let lattice = self
            .lattice
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Admin::new(&self.server, self.key.clone(), lattice)
    }

    /// `app`'s declassified rows no audit record names yet (see [`schema::Claim`]).
    pub async fn claim_declassified(
        &self,
        app: &str,
    ) -> Result<Option<schema::Claim>, SchemaError> {
        self.admin().claim_declassified(app).await
    }

    /// Ranks labels under `lattice` from now on, and re-ranks every app's labels.
    pub async fn set_lattice(&self, lattice: Lattice) {
        *self.lattice.write().unwrap_or_else(|e| e.into_inner()) = lattice.clone();
        if let Err(e) = self.admin().set_lattice(lattice).await {
            tracing::warn!(error = %e, "re-ranking apps' labels under the new lattice failed");
        }
    }
}

/// The notes of `--demo`'s app (`warden-demo-app`'s `notes`).
impl Data {
    /// Gives `app` a database with a `notes` table, made as a release migration would make it
    /// (owned by the app's owner role, then labelled), and writes each `(label, text)` as that
    /// label's role, so warden's trigger stamps it with the label. `lattice` is the one the
    /// labels belong to (the store's, which the data server may not have followed yet). A note
    /// that cannot be written is logged and left out; the table is the error.
    pub async fn seed_notes(
        &self,
        app: &str,
        lattice: Lattice,
        notes: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        self.set_lattice(lattice).await;
        let admin = self.admin();
        admin.create_app(app).await?;
        let c = self.server.admin(Some(&schema::db_name(app))).await?;
        c.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS public.notes (id serial PRIMARY KEY, body text NOT NULL); \
             ALTER TABLE public.notes OWNER TO {}",
            schema::quote_ident(&schema::owner_role_name(app))
        ))
        .await
        .context("cannot make the notes table")?;
        admin.label_tables(app).await?;
        for (label, text) in notes {
            let written = async {
                let login = admin.label_role(app, label, None).await?;
                let role = schema::quote_ident(&login.role);
                c.batch_execute(&format!("SET SESSION AUTHORIZATION {role}"))
                    .await?;
                let inserted = c
                    .execute("INSERT INTO public.notes (body) VALUES ($1)", &[text])
                    .await;
                c.batch_execute("RESET SESSION AUTHORIZATION").await?;
                inserted?;
                anyhow::Ok(())
            };
            if let Err(e) = written.await {
                tracing::warn!(app, label, error = %e, "a seed note was not written");
            }
        }
        Ok(())
    }
}

fn data_error(e: impl std::fmt::Display) -> DataError {
    DataError(e.to_string())
}

impl DataPlane for Data {
    fn describe(&self) -> String {
        format!("{:?}", self.server)
    }

    fn create_app<'a>(&'a self, app: &'a str) -> DataFuture<'a, ()> {
        Box::pin(async move {
            self.admin().create_app(app).await.map_err(data_error)?;
            Ok(())
        })
    }

    fn drop_app<'a>(&'a self, app: &'a str) -> DataFuture<'a, ()> {
        Box::pin(async move {
            self.admin().drop_app(app).await.map_err(data_error)?;
            // Its pooled connections are dead (the drop forced them out) and its bound goes.
            let server = server_addr(&self.server.endpoint());
            self.pool.forget(&server, &schema::db_name(app));
            Ok(())
        })
    }

    fn declassifier<'a>(&'a self, app: &'a str, to_label: Option<&'a str>) -> DataFuture<'a, ()> {
        Box::pin(async move {
            self.admin()
                .declassifier(app, to_label)
                .await
                .map_err(data_error)
        })
    }

    fn show<'a>(&'a self, app: &'a str) -> DataFuture<'a, AppData> {
        Box::pin(async move {
            let shown = self.admin().show(app).await.map_err(data_error)?;
            Ok(AppData {
                size_bytes: shown.size_bytes,
                tables: shown
                    .tables
                    .into_iter()
                    .map(|t| TableRows {
                        name: t.name,
                        rows_per_label: t.rows_per_label.into_iter().collect(),
                    })
                    .collect(),
                declassify_to: shown.declassify_to,
                declassified_writes: shown.declassified_writes,
            })
        })
    }

    fn attach<'a>(
        &'a self,
        app: &'a str,
        label: &'a str,
        owner: Option<&'a str>,
        socket: &'a Path,
    ) -> DataFuture<'a, DataSocket> {
        Box::pin(async move {
            let admin = self.admin();
            // Tables the app's owner made outside a release phase are labelled before any
            // instance reaches them (idempotent). A table that cannot be labelled (a release
            // phase failed on it) does not stop the app: no label role has any privilege on
            // an unlabelled table (the owner's guard refuses grants on one), so instances go
            // on with the tables that are labelled. Skipped when every table is labelled
            // already: labelling locks every table, which would queue all the app's sessions
            // behind one instance's long transaction at each start.
            let labelled = admin.all_labelled(app).await.map_err(data_error)?;
            match match labelled {
                true => Ok(Vec::new()),
                false => admin.label_tables(app).await,
            } {
                Ok(_) => {}
                Err(e @ SchemaError::Unlabellable { .. }) => {
                    tracing::warn!(app, error = %e, "a table stays unlabelled and unreachable to instances until a release fixes it");
                }
                Err(e) => return Err(data_error(e)),
            }
            let login = admin
                .label_role(app, label, owner)
                .await
                .map_err(data_error)?;
            self.bind(&login, socket)
        })
    }

    fn attach_owner<'a>(&'a self, app: &'a str, socket: &'a Path) -> DataFuture<'a, DataSocket> {
        Box::pin(async move {
            let login = self.admin().owner_role(app).await.map_err(data_error)?;
            self.bind(&login, socket)
        })
    }

    fn label_tables<'a>(&'a self, app: &'a str) -> DataFuture<'a, Vec<String>> {
        Box::pin(async move {
            let admin = self.admin();
            // The release phase's labelling, after its command exited: a statement of the
            // command still running in its backend must not change the schema meanwhile.
            admin.end_owner_sessions(app).await.map_err(data_error)?;
            admin.label_tables(app).await.map_err(data_error)
        })
    }
}

impl Data {
    /// A socket at `socket` that logs in as `login`, open to the uid of the process it is
    /// made for.
    fn bind(&self, login: &RoleLogin, socket: &Path) -> Result<DataSocket, DataError> {
        let target = Target {
            role: login.role.clone(),
            password: login.password().to_owned(),
            server: server_addr(&login.endpoint),
            database: login.dbname.clone(),
        };
        let listener =
            Listener::bind_healing(socket, target, self.pool.clone(), Some(self.heal(login)))
                .map_err(data_error)?;
        // A sandboxed instance runs as another uid: connecting needs write permission on the
        // socket; its directory (0700 in the instance's own) is what guards it.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(listener.path(), std::fs::Permissions::from_mode(0o777))
            .map_err(data_error)?;
        Ok(DataSocket(Box::new(listener)))
    }

    /// Sets `login`'s role to warden's password again when PostgreSQL refuses it: a role may
    /// change its own password, and one instance must not lock the others of its label out.
    fn heal(&self, login: &RoleLogin) -> Heal {
        let (me, role) = (self.me.clone(), login.role.clone());
        Arc::new(move || {
            let (me, role) = (me.clone(), role.clone());
            Box::pin(async move {
                let Some(data) = me.upgrade() else {
                    return Err("warden's data plane is stopping".to_owned());
                };
                // Healed lately (by this socket or another of the role's): the login is tried
                // again with the password set then, and fails if it was changed since.
                if !data.healed.allow(&role, std::time::Instant::now()) {
                    return Ok(());
                }
                let reset = data.admin().reset_role(&role).await;
                reset.map_err(|e| e.to_string())
            })
        })
    }
}

/// Where the proxy reaches the server at `endpoint`.
fn server_addr(endpoint: &Endpoint) -> ServerAddr {
    match endpoint {
        Endpoint::Socket { dir, port } => ServerAddr::Unix {
            dir: dir.clone(),
            port: *port,
        },
        Endpoint::Tcp { host, port } => ServerAddr::Tcp(format!("{host}:{port}")),
    }
}

/// Gives the data server the lattice stored at `lattice` at start and at every change, so
/// labels' ranks in every app's database follow it.
pub async fn follow_lattice(
    store: Arc<dyn warden_store::Store>,
    data: Arc<Data>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut follower = warden_store::Follower::new(store, warden_core::keys::LATTICE);
    loop {
        let update = tokio::select! {
            u = follower.next() => u,
            _ = stop.changed() => return,
        };
        let Some(update) = update else { return };
        let values: Vec<Vec<u8>> = match update {
            warden_store::Update::Listed(l) => l
                .entries
                .into_iter()
                .filter(|e| e.key == warden_core::keys::LATTICE)
                .map(|e| e.value)
                .collect(),
            warden_store::Update::Changes { events, .. } => events
                .into_iter()
                .filter(|e| e.key == warden_core::keys::LATTICE)
                .filter_map(|e| match e.kind {
                    warden_store::EventKind::Put(v) => Some(v),
                    warden_store::EventKind::Delete => None,
                })
                .collect(),
        };
        for value in values {
            match serde_json::from_slice::<warden_auth::lattice::Lattice>(&value) {
                Ok(l) => data.set_lattice(l).await,
                Err(e) => tracing::warn!(error = %e, "the stored lattice does not read"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One heal per role per 5 s; other roles are not held up by it.
    #[test]
    fn a_roles_password_is_healed_at_most_once_per_five_seconds() {
        let limit = HealLimit::default();
        let t0 = std::time::Instant::now();
        assert!(limit.allow("a", t0));
        assert!(!limit.allow("a", t0 + std::time::Duration::from_secs(4)));
        assert!(limit.allow("b", t0 + std::time::Duration::from_secs(4)));
        assert!(limit.allow("a", t0 + HEAL_EVERY));
        assert!(!limit.allow("a", t0 + HEAL_EVERY));
    }

    #[test]
    fn every_node_derives_the_same_data_key_from_the_clusters_and_no_other() {
        let identity = "11".repeat(32);
        let a = cluster_data_key(&identity).unwrap();
        assert_eq!(a.0, cluster_data_key(&format!("{identity}\n")).unwrap().0);
        assert_ne!(a.0, [0x11; 32], "derived, not the identity key itself");
        assert_ne!(a.0, cluster_data_key(&"12".repeat(32)).unwrap().0);
        assert!(cluster_data_key("not hex").is_err());
    }
}
