//! The seam between the roles that need an app's database (the agent, the API) and the crate
//! that administers it (`warden-data`, wired in the binary): the roles depend on this trait
//! only, so none of them links PostgreSQL's client or knows its SQL.

use std::any::Any;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;

/// A future a [`DataPlane`] returns.
pub type DataFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, DataError>> + Send + 'a>>;

/// Why the data plane could not do what was asked; the message says what to do.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct DataError(pub String);

/// An instance's socket to its app's database: it serves while held and is closed (with every
/// connection made through it) when dropped.
pub struct DataSocket(pub Box<dyn Any + Send + Sync>);

impl std::fmt::Debug for DataSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataSocket")
    }
}

/// What an app's database holds, as the admin sees it (row security does not bind it): the
/// answer of `GET /v1/apps/{name}/data` and `warden data show`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AppData {
    /// The database's size on disk, in bytes.
    pub size_bytes: i64,
    /// The app's labelled tables, by name.
    pub tables: Vec<TableRows>,
    /// The label the database lets the app's instances write down to (canonical), if the app
    /// is a declassifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declassify_to: Option<String>,
    /// Rows written below their writer's label (by a declassifier), as `warden.declassified`
    /// records them.
    pub declassified_writes: i64,
}

/// One labelled table of an app.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TableRows {
    /// The table's name.
    pub name: String,
    /// Rows per label (canonical text); labels without rows are left out.
    pub rows_per_label: BTreeMap<String, i64>,
}

/// Apps' databases on the PostgreSQL this node uses.
pub trait DataPlane: Send + Sync {
    /// Where data lives, for people (no password): `private PostgreSQL under DIR` or
    /// `postgres://ADMIN@HOST/DB`.
    fn describe(&self) -> String;
    /// Makes the app's database and owner role (idempotent).
    fn create_app<'a>(&'a self, app: &'a str) -> DataFuture<'a, ()>;
    /// Drops the app's database and roles.
    fn drop_app<'a>(&'a self, app: &'a str) -> DataFuture<'a, ()>;
    /// A socket at `socket` (a path `<dir>/.s.PGSQL.5432`) that logs in to `app`'s database as
    /// the role of `label` (and `owner`, for an instance reserved for one user).
    fn attach<'a>(
        &'a self,
        app: &'a str,
        label: &'a str,
        owner: Option<&'a str>,
        socket: &'a Path,
    ) -> DataFuture<'a, DataSocket>;
    /// Lets `app`'s instances whose label dominates `to_label` write rows at it, each write
    /// recorded (a declassifier); `None` takes that away.
    fn declassifier<'a>(&'a self, app: &'a str, to_label: Option<&'a str>) -> DataFuture<'a, ()>;
    /// Size, tables and rows per label of `app`'s database.
    fn show<'a>(&'a self, app: &'a str) -> DataFuture<'a, AppData>;
    /// A socket at `socket` that logs in to `app`'s database as its owner role, which may
    /// make and change tables: for the release phase only, never for an instance.
    fn attach_owner<'a>(&'a self, app: &'a str, socket: &'a Path) -> DataFuture<'a, DataSocket>;
    /// Labels every table of `app`'s database the owner made since the last time (idempotent);
    /// returns the tables labelled. Fails naming a table warden cannot label.
    fn label_tables<'a>(&'a self, app: &'a str) -> DataFuture<'a, Vec<String>>;
}

impl std::fmt::Debug for dyn DataPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}
