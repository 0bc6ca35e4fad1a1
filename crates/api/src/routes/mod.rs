//! One module per resource; each handler parses into types that cannot hold invalid values.

pub mod apps;
pub mod audit;
mod awaiting;
pub mod data;
pub(crate) mod device_live;
pub mod forward;
pub mod git;
pub(crate) mod git_archive;
pub mod git_base;
pub mod git_hook;
pub(crate) mod git_lock;
pub(crate) mod git_repo;
pub mod instances;
pub mod lattice;
pub mod login_device;
pub mod node_releases;
pub mod nodes;
pub mod oidc_providers;
pub mod operators;
pub mod provider_operators;
pub mod ps;
pub mod releases;
pub mod restart;
pub mod run;
pub mod status;
pub mod store;
pub mod tokens;
mod upload;
pub mod users;

/// A record that decodes, or `None` for a damaged one, which is logged (rate-limited) and left
/// for `GET /v1/status` to list: one bad record never hides the others.
pub(crate) fn readable<T>(r: Result<T, warden_store::StoreError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            warden_core::log_limited!(warn, error = %e, "skipping a damaged record");
            None
        }
    }
}
