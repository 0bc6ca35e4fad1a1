//! Labelled data (issue 34): the PostgreSQL warden administers, the row security that keeps
//! each label's rows readable only by labels that dominate it, and the socket each instance
//! reaches its database through.
//!
//! This crate owns the database's side of the lattice: `server` (a PostgreSQL warden runs
//! under its data dir or is pointed at), `schema` (an app's database, its roles, row security
//! and labelling) and `proxy` (the per-instance socket, which authenticates on the instance's
//! behalf and pools server connections). It may call core and auth; it must not import a role
//! crate (agent, gateway, api, cluster) or know HTTP.
#![forbid(unsafe_code)]

pub mod proxy;
pub mod schema;
pub mod server;
