//! An app's database, its roles, and the row security that labels every row.
//!
//! One database per app (`warden_app_<name>`); roles are global in PostgreSQL, so their names
//! carry a hash of what they stand for: the owner `wo_<h>` (runs the release migration, owns
//! the app's tables) and one role per (app, label[, user]) `wl_<h>`. Every role logs in, is
//! NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT and a member of
//! nothing, and has a password derived as HMAC-SHA256(data key, role name), never stored:
//! PostgreSQL is given only a SCRAM-SHA-256 verifier computed here.
//!
//! SQL is made only from validated names and ids: identifiers through [`quote_ident`], values
//! as bound parameters. No password, verifier or key is logged or put in an error.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;
use warden_auth::lattice::{Lattice, LatticeError};

use crate::server::{Endpoint, Server, ServerError};

mod conns;
mod declassified;
mod label;
mod names;
mod sql;

use names::{check_name, check_user, hex, is_warden_role, quote_literal};
pub use names::{db_name, label_role_name, owner_role_name, quote_ident};

pub use declassified::{Claim, Declassified};
pub use label::{AppData, TableData};

/// The 32-byte key every role password is derived from.
#[derive(Clone)]
pub struct DataKey(pub [u8; 32]);

/// How a role logs in: what the proxy needs to authenticate on an instance's behalf.
#[derive(Clone)]
pub struct RoleLogin {
    /// The PostgreSQL role.
    pub role: String,
    /// The app's database.
    pub dbname: String,
    /// Where the server is.
    pub endpoint: Endpoint,
    password: String,
}

/// Why an app's database or roles could not be made or changed.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// An app or user name warden would not put in a name.
    #[error("{0:?} is not a usable app or user name: use lowercase letters, digits and '-'")]
    BadName(String),
    /// A label does not fit the lattice.
    #[error("label refused: {0}")]
    Label(#[from] LatticeError),
    /// The app has no database.
    #[error("app {0:?} has no database; create it first")]
    NoApp(String),
    /// A table warden cannot label; the release that made it fails.
    #[error("table {table:?} cannot be labelled: {reason}")]
    Unlabellable {
        /// The table.
        table: String,
        /// Why, and what to change.
        reason: String,
    },
    /// Reaching the server failed.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// The owner's sessions did not end when told to.
    #[error("the sessions of app {0:?}'s owner role did not end within 10 s; try again")]
    OwnerBusy(String),
    /// PostgreSQL refused a statement.
    #[error("{what}: {}", pg_message(source))]
    Sql {
        /// What warden was doing.
        what: String,
        /// PostgreSQL's answer.
        source: tokio_postgres::Error,
    },
}

/// Server connections one role may hold: one app cannot take every connection of the server
/// (the proxy keeps up to 32 idle per target).
pub const CONNECTION_LIMIT: i32 = 32;
/// Server connections all of one app's roles may hold together (PostgreSQL's per-database
/// limit; warden's admin, a superuser, is not held to it): under a private server's 100, so
/// one app cannot take every connection.
pub const APP_CONNECTION_LIMIT: i32 = 48;
/// A transaction left idle this long is ended, so a stalled instance holds no locks for long.
/// A role's default only: the instance may `SET` it for its own session.
const IDLE_IN_TRANSACTION: &str = "60s";
/// Temporary files one session may write (sorts, hashes); only a superuser may raise it.
const TEMP_FILE_LIMIT: &str = "1GB";

/// Administers apps' databases on one server, with the data key and the current lattice.
pub struct Admin<'a> {
    server: &'a Server,
    key: DataKey,
    lattice: Lattice,
    /// Its admin connections, reused by its later calls.
    conns: conns::Conns,
}

// === impl Admin ===

impl<'a> Admin<'a> {
    /// An administrator of `server`'s app databases.
    pub fn new(server: &'a Server, key: DataKey, lattice: Lattice) -> Self {
        Self {
            server,
            key,
            lattice,
            conns: conns::Conns::default(),
        }
    }

    /// The lattice labels are ranked by.
    pub fn lattice(&self) -> &Lattice {
        &self.lattice
    }

    /// Makes the app's database (if new), its owner role, the `warden` schema, and the
    /// revocations every app database carries. Idempotent.
    pub async fn create_app(&self, app: &str) -> Result<RoleLogin, SchemaError> {
        check_name(app)?;
        let db = db_name(app);
        let owner = owner_role_name(app);
        let admin = self.conns.get(self.server, None).await?;
        let exists = admin
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&db])
            .await
            .map_err(sql("looking up the app's database"))?
            .is_some();
        if !exists {
            match admin
                .batch_execute(&format!("CREATE DATABASE {}", quote_ident(&db)))
                .await
            {
                Ok(()) => {}
                // Another node made it first.
                Err(e) if e.code() == Some(&SqlState::DUPLICATE_DATABASE) => {}
                Err(e) => return Err(sql("creating the app's database")(e)),
            }
        }
        self.ensure_role(&admin, &owner).await?;
        ensure_definer(&admin).await?;
        let qdb = quote_ident(&db);
        let mut stmts = format!(
            "REVOKE ALL ON DATABASE {qdb} FROM PUBLIC;\
             GRANT CONNECT ON DATABASE {qdb} TO {};\
             ALTER DATABASE {qdb} CONNECTION LIMIT {APP_CONNECTION_LIMIT};",
            quote_ident(&owner)
        );
        if matches!(self.server, Server::Private(_)) {
            // On a server that is warden's alone, no role reaches the other databases (where
            // PUBLIC may connect and make temporary tables: a channel between labels).
            stmts.push_str(
                "REVOKE CONNECT, TEMPORARY ON DATABASE postgres FROM PUBLIC;\
                 REVOKE CONNECT, TEMPORARY ON DATABASE template1 FROM PUBLIC;",
            );
        }
        admin
            .batch_execute(&stmts)
            .await
            .map_err(sql("limiting who connects to the app's database"))?;
        let c = self.conns.get(self.server, Some(&db)).await?;
        c.batch_execute(sql::WARDEN_SCHEMA)
            .await
            .map_err(sql("making the warden schema"))?;
        c.batch_execute(sql::GUARD)
            .await
            .map_err(sql("making the owner's guard"))?;
        c.batch_execute(sql::DEFINER_GRANTS)
            .await
            .map_err(sql("handing warden's functions to their definer role"))?;
        c.batch_execute(sql::REVOKE_FUNCTIONS)
            .await
            .map_err(sql("revoking functions from PUBLIC"))?;
        c.batch_execute(sql::DECLASSIFIED_AUDIT).await.map_err(sql(
            "making warden.declassified readable by the audit trail",
        ))?;
        let q = quote_ident(&owner);
        c.batch_execute(&format!(
            "ALTER SCHEMA public OWNER TO {q};\
             ALTER DEFAULT PRIVILEGES FOR ROLE {q} REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;"
        ))
        .await
        .map_err(sql("giving the owner the app's schema"))?;
        Ok(self.login(&owner, db))
    }

    /// Drops the app's database and every role made for it.
    pub async fn drop_app(&self, app: &str) -> Result<(), SchemaError> {
        check_name(app)?;
        let db = db_name(app);
        let admin = self.server.admin(None).await?;
        let mut roles = vec![owner_role_name(app)];
        if let Ok(c) = self.server.admin(Some(&db)).await {
            if let Ok(rows) = c.query("SELECT role::text FROM warden.roles", &[]).await {
                roles.extend(rows.iter().map(|r| r.get::<_, String>(0)));
            }
        }
        admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                quote_ident(&db)
            ))
            .await
            .map_err(sql("dropping the app's database"))?;
        for role in roles {
            if !is_warden_role(&role) {
                continue;
            }
            admin
                .batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(&role)))
                .await
                .map_err(sql("dropping the app's roles"))?;
        }
        Ok(())
    }

    /// The owner role's login (the release migration runs as it).
    pub async fn owner_role(&self, app: &str) -> Result<RoleLogin, SchemaError> {
        check_name(app)?;
        let owner = owner_role_name(app);
        let admin = self.conns.get(self.server, None).await?;
        self.ensure_role(&admin, &owner).await?;
        Ok(self.login(&owner, db_name(app)))
    }

    /// The role of `label` (and `user`, for `per_user` instances) in `app`, made on first use:
    /// it may connect to the app's database only, and reach each labelled table.
    pub async fn label_role(
        &self,
        app: &str,
        label: &str,
        user: Option<&str>,
    ) -> Result<RoleLogin, SchemaError> {
        // Every step is idempotent, so a step refused for a concurrent catalog change (another
        // instance of the app set up at the same moment, on this node or another) is tried
        // again from the start, a few times with a short random pause.
        let mut tries = 0;
        loop {
            match self.label_role_once(app, label, user).await {
                Err(e) if e.concurrent_update() && tries < 8 => {
                    tries += 1;
                    let pause = 5 + rand::random::<u64>() % (10 * tries);
                    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
                }
                done => return done,
            }
        }
    }

    async fn label_role_once(
        &self,
        app: &str,
        label: &str,
        user: Option<&str>,
    ) -> Result<RoleLogin, SchemaError> {
        check_name(app)?;
        if let Some(u) = user {
            check_user(u)?;
        }
        let canonical = self.lattice.canonical(label)?;
        let role = label_role_name(app, &canonical, user);
        let db = db_name(app);
        let c = self.app_client(app).await?;
        let label_id = label::ensure_label(&c, &self.lattice, &canonical).await?;
        let admin = self.conns.get(self.server, None).await?;
        self.ensure_role(&admin, &role).await?;
        admin
            .batch_execute(&format!(
                "GRANT CONNECT ON DATABASE {} TO {}",
                quote_ident(&db),
                quote_ident(&role)
            ))
            .await
            .map_err(sql("letting the role connect"))?;
        c.execute(
            "INSERT INTO warden.roles (role, label_id, owner) VALUES ($1::text::name, $2, $3) \
             ON CONFLICT (role) DO UPDATE SET label_id = EXCLUDED.label_id, owner = EXCLUDED.owner",
            &[&role, &label_id, &user],
        )
        .await
        .map_err(sql("recording the role's label"))?;
        label::grant_labelled(&c, std::slice::from_ref(&role)).await?;
        Ok(self.login(&role, db))
    }

    /// Sets `role` (one of warden's: an owner or label role) to warden's password,
    /// attributes and settings again: what the proxy asks when PostgreSQL refused the
    /// password, which the role itself may have changed (`ALTER ROLE CURRENT_USER PASSWORD`).
    /// A role that is not there any more (its app removed) is not made again.
    pub async fn reset_role(&self, role: &str) -> Result<(), SchemaError> {
        if !is_warden_role(role) {
            return Err(SchemaError::BadName(role.to_owned()));
        }
        let admin = self.conns.get(self.server, None).await?;
        let exists = admin
            .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
            .await
            .map_err(sql("looking up a role"))?
            .is_some();
        match exists {
            true => self.ensure_role(&admin, role).await,
            false => Ok(()),
        }
    }

    /// Labels every table of the app's schema after a release migration: label columns (rows
    /// already there get the lattice's lowest label), forced row security, warden's policies
    /// and stamping trigger, and grants to every label role. Fails naming the table on a
    /// unique key not scoped by label (one without `warden_label`, other than a one-column
    /// serial, identity or `gen_random_uuid()` primary key), a policy warden did not make, or a SECURITY DEFINER
    /// function. Returns the tables labelled.
    pub async fn label_tables(&self, app: &str) -> Result<Vec<String>, SchemaError> {
        self.app_client(app).await?;
        // A connection of its own, closed after: labelling is one transaction, which a shared
        // connection would mix other callers' statements into.
        let c = self.server.admin(Some(&db_name(app))).await?;
        let owner = self.login(&owner_role_name(app), db_name(app));
        label::label_tables(&c, &self.lattice, &owner).await
    }

    /// Whether every table of `app`'s schema is labelled already (a lock-free read of the
    /// catalogs): an instance's start skips [`Admin::label_tables`] when it is.
    pub async fn all_labelled(&self, app: &str) -> Result<bool, SchemaError> {
        let c = self.app_client(app).await?;
        label::all_labelled(&c).await
    }

    /// Ends every session of `app`'s owner role and waits (bounded) until none is left: a
    /// release command's statement goes on in its backend after the command exits (closing
    /// the socket does not stop it), and must not change the schema while or after warden
    /// labels it. For the release phase, after its command exits and before labelling.
    pub async fn end_owner_sessions(&self, app: &str) -> Result<(), SchemaError> {
        check_name(app)?;
        let admin = self.conns.get(self.server, None).await?;
        if conns::end_sessions(&admin, &owner_role_name(app)).await? {
            return Ok(());
        }
        Err(SchemaError::OwnerBusy(app.to_owned()))
    }

    /// Re-ranks every app's labels under `lattice` (rows do not change). Labels the new lattice
    /// lacks read nothing and are read by no one until it has them again; they are returned.
    pub async fn set_lattice(&mut self, lattice: Lattice) -> Result<Vec<String>, SchemaError> {
        lattice.validate()?;
        let admin = self.conns.get(self.server, None).await?;
        let dbs = admin
            .query(
                "SELECT datname::text FROM pg_database WHERE datname LIKE 'warden\\_app\\_%'",
                &[],
            )
            .await
            .map_err(sql("listing app databases"))?;
        let mut lost = Vec::new();
        for row in dbs {
            let db: String = row.get(0);
            // One at a time, closed after: an Admin keeping one per app would hold them all.
            let c = self.server.admin(Some(&db)).await?;
            lost.extend(label::rerank(&c, &lattice).await?);
        }
        self.lattice = lattice;
        Ok(lost)
    }

    /// Marks `app` a declassifier: its roles that dominate `to_label` may write rows at it
    /// (each such write recorded in `warden.declassified`). `None` takes the mark away.
    pub async fn declassifier(&self, app: &str, to_label: Option<&str>) -> Result<(), SchemaError> {
        let c = self.app_client(app).await?;
        let id = match to_label {
            Some(l) => {
                let canonical = self.lattice.canonical(l)?;
                Some(label::ensure_label(&c, &self.lattice, &canonical).await?)
            }
            None => None,
        };
        c.execute("UPDATE warden.settings SET declassify_to = $1", &[&id])
            .await
            .map_err(sql("marking the declassifier"))?;
        Ok(())
    }

    /// Size, tables and rows per label of the app's database.
    pub async fn show(&self, app: &str) -> Result<AppData, SchemaError> {
        let c = self.app_client(app).await?;
        label::show(&c).await
    }

    async fn app_client(&self, app: &str) -> Result<std::sync::Arc<Client>, SchemaError> {
        check_name(app)?;
        let db = db_name(app);
        let admin = self.conns.get(self.server, None).await?;
        let exists = admin
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&db])
            .await
            .map_err(sql("looking up the app's database"))?
            .is_some();
        if !exists {
            return Err(SchemaError::NoApp(app.to_owned()));
        }
        Ok(self.conns.get(self.server, Some(&db)).await?)
    }

    /// Creates `role` if missing, with warden's attributes, and sets its verifier.
    async fn ensure_role(&self, admin: &Client, role: &str) -> Result<(), SchemaError> {
        let q = quote_ident(role);
        let exists = admin
            .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
            .await
            .map_err(sql("looking up a role"))?
            .is_some();
        if !exists {
            match admin.batch_execute(&format!("CREATE ROLE {q}")).await {
                Ok(()) => {}
                Err(e) if e.code() == Some(&SqlState::DUPLICATE_OBJECT) => {}
                Err(e) => return Err(sql("creating a role")(e)),
            }
        }
        // Set at every call, so a role's attributes are always these whatever happened to it
        // (a role may change its own password and settings), and a new data key takes effect. The verifier is not the password; it is still
        // never logged (tokio-postgres does not log statement text).
        let verifier = postgres_protocol::password::scram_sha_256(self.password(role).as_bytes());
        admin
            .batch_execute(&format!(
                "ALTER ROLE {q} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION \
                 NOBYPASSRLS NOINHERIT CONNECTION LIMIT {CONNECTION_LIMIT} PASSWORD {};\
                 ALTER ROLE {q} RESET ALL;\
                 ALTER ROLE {q} SET idle_in_transaction_session_timeout = {};\
                 ALTER ROLE {q} SET temp_file_limit = {};",
                quote_literal(&verifier),
                quote_literal(IDLE_IN_TRANSACTION),
                quote_literal(TEMP_FILE_LIMIT),
            ))
            .await
            .map_err(sql("setting a role's attributes"))?;
        // `RESET ALL` above is the role's settings in every database; those it set for one
        // database (`ALTER ROLE CURRENT_USER IN DATABASE ... SET`) go too.
        let per_db = admin
            .query(
                "SELECT d.datname::text FROM pg_db_role_setting s \
                 JOIN pg_database d ON d.oid = s.setdatabase \
                 WHERE s.setrole = (SELECT oid FROM pg_roles WHERE rolname = $1)",
                &[&role],
            )
            .await
            .map_err(sql("listing a role's settings"))?;
        for row in per_db {
            let db: String = row.get(0);
            admin
                .batch_execute(&format!(
                    "ALTER ROLE {q} IN DATABASE {} RESET ALL",
                    quote_ident(&db)
                ))
                .await
                .map_err(sql("resetting a role's settings"))?;
        }
        Ok(())
    }

    fn password(&self, role: &str) -> String {
        // HMAC accepts any key length; a 32-byte key cannot fail.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.key.0) else {
            unreachable!("HMAC takes keys of any length")
        };
        mac.update(role.as_bytes());
        hex(&mac.finalize().into_bytes())
    }

    fn login(&self, role: &str, dbname: String) -> RoleLogin {
        RoleLogin {
            role: role.to_owned(),
            dbname,
            endpoint: self.server.endpoint(),
            password: self.password(role),
        }
    }
}

/// Makes the NOLOGIN, non-superuser owner of warden's SECURITY DEFINER functions, and holds
/// its attributes to these.
async fn ensure_definer(admin: &Client) -> Result<(), SchemaError> {
    let q = quote_ident(sql::DEFINER);
    match admin.batch_execute(&format!("CREATE ROLE {q}")).await {
        Ok(()) => {}
        Err(e) if e.code() == Some(&SqlState::DUPLICATE_OBJECT) => {}
        Err(e) => return Err(sql("creating warden's definer role")(e)),
    }
    admin
        .batch_execute(&format!(
            "ALTER ROLE {q} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION \
             NOBYPASSRLS NOINHERIT"
        ))
        .await
        .map_err(sql("setting warden's definer role's attributes"))
}

/// A connection logged in as `login`'s role (not the admin's session with `SET ROLE`, which
/// the app's code could `RESET`).
async fn connect_as(login: &RoleLogin) -> Result<Client, SchemaError> {
    let mut config = tokio_postgres::Config::new();
    match &login.endpoint {
        Endpoint::Socket { dir, port } => config.host_path(dir).port(*port),
        Endpoint::Tcp { host, port } => config.host(host).port(*port),
    };
    config
        .user(&login.role)
        .password(login.password())
        .dbname(&login.dbname);
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(sql("logging in as the app's owner"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "owner connection to PostgreSQL ended");
        }
    });
    Ok(client)
}

// === impl RoleLogin ===

impl RoleLogin {
    /// The role's password (derived, never stored); for the proxy's SCRAM exchange only.
    pub fn password(&self) -> &str {
        &self.password
    }
}

impl fmt::Debug for RoleLogin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoleLogin")
            .field("role", &self.role)
            .field("dbname", &self.dbname)
            .field("endpoint", &self.endpoint)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl fmt::Debug for DataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DataKey(<redacted>)")
    }
}

/// PostgreSQL's own message and code (tokio-postgres's error says only "db error").
fn pg_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

impl SchemaError {
    /// PostgreSQL refused a catalog change because another session changed the same row at
    /// the same moment (two instances of an app set up at once grant on one database): the
    /// same statements succeed when tried again.
    fn concurrent_update(&self) -> bool {
        let SchemaError::Sql { source, .. } = self else {
            return false;
        };
        source.as_db_error().is_some_and(|db| {
            *db.code() == tokio_postgres::error::SqlState::INTERNAL_ERROR
                && db.message().contains("concurrently")
                || *db.code() == tokio_postgres::error::SqlState::UNIQUE_VIOLATION
                    && db.constraint().is_some_and(|c| c.starts_with("pg_"))
        })
    }
}

fn sql(what: &str) -> impl FnOnce(tokio_postgres::Error) -> SchemaError + '_ {
    move |source| SchemaError::Sql {
        what: what.to_owned(),
        source,
    }
}
