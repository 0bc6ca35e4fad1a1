//! Shared vocabulary of warden: the records every role reads and writes in the store, the key
//! layout they live under, and the rules for names and ids.
//!
//! This crate owns data shapes only. It does no I/O, knows nothing of HTTP, processes or the
//! storage engine, and must stay cheap to depend on from every other crate.
#![forbid(unsafe_code)]

pub mod id;
pub mod keys;
pub mod model;
pub mod name;

pub use model::{
    AppHealth, AppSpec, DriverKind, HostLoad, InstanceRecord, InstanceState, LabelHealth, Lifetime,
    Limits, NetworkMode, NodeRecord, SessionRecord, StartPath, UserRecord, MAX_POOL,
};
pub use name::{validate_name, NameError};
