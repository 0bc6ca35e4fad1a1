//! Records stored under the keys of [`crate::keys`], serialised as JSON: app specs in
//! `app`, everything else in `records`.

mod addr;
mod app;
mod check;
mod env;
mod oidc;
mod operator;
mod placement;
mod process;
mod records;
mod release;
mod restart;
mod running;

pub use addr::*;
pub use app::*;
pub use check::*;
pub use env::*;
pub use oidc::*;
pub use operator::*;
pub use placement::*;
pub use process::*;
pub use records::*;
pub use release::*;
pub use restart::*;
pub use running::*;
