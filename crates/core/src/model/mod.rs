//! Records stored under the keys of [`crate::keys`], serialised as JSON: app specs in
//! `app`, everything else in `records`.

mod app;
mod records;

pub use app::*;
pub use records::*;
