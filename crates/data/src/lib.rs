//! Labelled data (issue 34): the PostgreSQL warden administers, the row security that keeps
//! each label's rows readable only by labels that dominate it, and the socket each instance
//! reaches its database through.
//!
//! This crate owns the database's side of the lattice:
//! - `server`: a PostgreSQL warden is pointed at (`postgres://ADMIN@HOST/DB`) or runs under its
//!   data dir (Unix socket only, as the `postgres` user when warden is root, dying with
//!   warden, one left running in its dir stopped at the next start), and the admin connection.
//! - `schema`: an app's database, its owner and label roles (passwords derived from the data
//!   key, given to PostgreSQL as SCRAM verifiers only), row security forced on every table,
//!   the trigger that stamps each row with its writer's label, labelling after a release
//!   migration, lattice changes, declassifiers, and the guard that keeps the owner from undoing
//!   any of it.
//! - `proxy`: the per-instance socket, which authenticates on the instance's behalf and pools
//!   server connections.
//!
//! It may call core and auth; it must not import a role crate (agent, gateway, api, cluster)
//! or know HTTP. Enforcement is PostgreSQL's: the rules are privileges, policies and triggers
//! in each app's database, so they hold for any client that reaches it. Logs and errors never
//! contain a password, a verifier or the data key.
#![forbid(unsafe_code)]

pub mod proxy;
pub mod schema;
pub mod server;
