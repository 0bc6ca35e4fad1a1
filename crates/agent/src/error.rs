//! What can go wrong when the agent starts, finds or stops an instance.

use warden_store::StoreError;

/// Why an instance could not be started or found.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentError {
    /// No app of that name is registered.
    #[error("no app named {0:?} is registered; create it with `warden apps create`")]
    UnknownApp(String),
    /// The program could not be started.
    #[error("cannot start app {app:?}: {reason}; check the app's command and workdir")]
    Spawn {
        /// App name.
        app: String,
        /// What went wrong.
        reason: String,
    },
    /// The program exited before accepting connections.
    #[error(
        "app {app:?} exited ({status}) before accepting connections; its last output:\n{log_tail}"
    )]
    Exited {
        /// App name.
        app: String,
        /// Exit status.
        status: String,
        /// Last lines the instance printed.
        log_tail: String,
    },
    /// The program did not become ready in time.
    #[error("app {app:?} did not become ready within {waited_ms} ms: {waiting_for}. Its last output:\n{log_tail}")]
    Timeout {
        /// App name.
        app: String,
        /// How long the agent waited.
        waited_ms: u64,
        /// What readiness still lacked, and what the app must do.
        waiting_for: String,
        /// Last lines the instance printed.
        log_tail: String,
    },
    /// The app or the node already runs as many instances as it may.
    #[error("{what} already runs its maximum of {limit} instances; retry when one has stopped or raise the limit")]
    Full {
        /// "app \"x\"" or "this node".
        what: String,
        /// The limit reached.
        limit: u32,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The agent is stopping.
    #[error("the agent is shutting down")]
    ShuttingDown,
    /// No instance with that id runs on this node.
    #[error("no instance {0:?} runs on this node")]
    UnknownInstance(String),
}
