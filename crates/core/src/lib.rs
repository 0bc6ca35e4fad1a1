//! Shared vocabulary of warden: the records every role reads and writes in the store, the key
//! layout they live under, the rules for names and ids, and the seams through which roles meet
//! ([`instances::Instances`]: what a gateway needs from wherever instances come from).
//!
//! This crate owns data shapes and traits only. It does no I/O of its own, knows nothing of
//! HTTP, processes or the storage engine, and must stay cheap to depend on from every other
//! crate.
#![forbid(unsafe_code)]

pub mod audit;
pub mod builds;
pub mod csrf;
pub mod data;
pub mod id;
pub mod identity;
pub mod instances;
pub mod keys;
pub mod model;
pub mod name;
pub mod oneoff;
pub mod peers;
pub mod ratelimit;
pub mod releases;
pub mod requests;

pub use instances::{
    Activity, ActivityGuard, InstanceAdmin, InstanceError, InstanceStream, Instances, Owner,
    RelabelHook, RemoteStream, Unavailable,
};
pub use model::{
    AddrError, AppHealth, AppSpec, BuildKind, ClaimRule, DrainOrder, DriverKind, FailReason,
    HostLoad, InstanceAddr, InstanceRecord, InstanceState, LabelHealth, Lifetime, Limits, Move,
    MoveReason, NetworkMode, NodeRecord, OidcFlowRecord, OidcProviderRecord, OperatorRecord,
    OperatorSource, Placement, ProcessOf, ProviderMark, ProviderSession, Release, ReleaseSource,
    ReleaseStatus, Restarts, Role, SchedulerRecord, SessionRecord, SpecRelease, StartPath,
    TokenKind, TokenRecord, UserRecord, MAX_POOL,
};
pub use name::{
    process_app, split_process_app, validate_name, validate_process_type, NameError, PROCESS_SEP,
};
pub use peers::Peers;
pub use releases::{
    LocalReleases, ReleaseAsk, ReleaseError, ReleaseEvents, Releases, UploadReader,
};

/// PATH given to instances (and builds) that set none: the agent's own environment (which may
/// hold credentials such as WARDEN_TOKEN) is never passed on. A release's instances get their
/// slug's bin directories before it.
pub const INSTANCE_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
