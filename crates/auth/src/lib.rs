//! Identity and access rules: password hashing with Argon2id and the security-clearance lattice.
//!
//! This crate owns the rules, not the plumbing: it does no I/O, keeps no state and knows nothing
//! of HTTP or the store. Passwords pass through it but are never logged, stored or returned; only
//! their PHC hashes leave it.
#![forbid(unsafe_code)]

pub mod lattice;
pub mod password;

pub use lattice::{Label, Lattice, LatticeError};
pub use password::{generate_password, hash_password, verify_password, Argon2Cost, PasswordError};
