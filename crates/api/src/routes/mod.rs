//! One module per resource; each handler parses into types that cannot hold invalid values.

pub mod apps;
pub mod instances;
pub mod lattice;
pub mod nodes;
pub mod status;
pub mod store;
pub mod users;
