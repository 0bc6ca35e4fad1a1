//! What can go wrong when the agent starts, finds or stops an instance.

use warden_core::{InstanceError, Unavailable};
use warden_store::StoreError;

use crate::drivers::LaunchError;
use warden_cluster::node::RegisterError;

/// Why the agent could not start, or an instance could not be started or found.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The instance image, which every sandbox's init runs, is not beside the warden binary.
    #[error(transparent)]
    InstanceImage(#[from] warden_sandbox::image::InstanceImageError),
    /// The node could not register (its name is taken, or the store failed).
    #[error(transparent)]
    Register(#[from] warden_cluster::node::RegisterError),
    /// No app of that name is registered.
    #[error("no app named {0:?} is registered; create it with `warden apps create`")]
    UnknownApp(String),
    /// The driver could not start the app's program or its sandbox, or the instance could
    /// not have its database.
    #[error("cannot start app {app:?}: {source}{}", source.advice())]
    Launch {
        /// App name.
        app: String,
        /// What went wrong.
        source: LaunchError,
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
    /// The app's last instance for this label crashed; no start before its backoff is over.
    #[error("app {app:?} keeps crashing (last: {last_exit}); the next start is in {} ms. An operator can read its log (`warden status`, `warden logs`)", retry_after.as_millis())]
    Backoff {
        /// App name.
        app: String,
        /// Until the next start may be tried.
        retry_after: std::time::Duration,
        /// How its last instance ended.
        last_exit: String,
    },
    /// A connection to the instance's port was accepted by another uid's socket: a process of
    /// the node bound the port before the app. Not the app's fault, and no request went there.
    #[error("app {app:?} was not started: {why} (the app's listener must be its own; a process of the node bound the port first), and no request went there")]
    NotOwnListener {
        /// App name.
        app: String,
        /// Whose socket it was, or why that could not be told.
        why: String,
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
    /// A data app's instance was tainted: it is stopped instead of relabelled, since its
    /// database connections are logged in at the old label and could write down.
    #[error("instance {0:?} of a data app was tainted; it is stopped, not relabelled (its database connections are at its old label)")]
    DataTaint(String),
    /// A directory the agent keeps its instances' files in could not be made.
    #[error("cannot create directory {}: {source}", path.display())]
    Directory {
        /// The directory.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The agent's metrics could not be registered (a bug).
    #[error("cannot register the agent's metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

impl From<AgentError> for InstanceError {
    fn from(e: AgentError) -> Self {
        match e {
            AgentError::UnknownApp(app) => Self::UnknownApp(app),
            AgentError::UnknownInstance(id) | AgentError::DataTaint(id) => {
                Self::UnknownInstance(id)
            }
            AgentError::Timeout {
                ref app, waited_ms, ..
            } => Self::StartTimeout {
                app: app.clone(),
                ms: waited_ms,
                reason: e.to_string(),
            },
            AgentError::Backoff {
                ref app,
                retry_after,
                ..
            } => Self::CrashLoop {
                app: app.clone(),
                retry_after,
                reason: e.to_string(),
            },
            AgentError::Full { .. } => Self::unavailable(Unavailable::Limit, e.to_string()),
            AgentError::Launch { ref source, .. } if source.is_a_node_limit() => {
                Self::unavailable(Unavailable::Limit, e.to_string())
            }
            // This node could not start it (its disk, its cgroups, its sandbox, a slug it could
            // not fetch) while the app's own command is not at fault: another node may.
            AgentError::Launch { ref source, .. } if !source.is_the_apps() => {
                Self::unavailable(Unavailable::Node, e.to_string())
            }
            AgentError::Launch { ref app, .. } | AgentError::Exited { ref app, .. } => {
                Self::StartFailed {
                    app: app.clone(),
                    reason: e.to_string(),
                }
            }
            AgentError::Store(_) | AgentError::Register(RegisterError::Store(_)) => {
                Self::unavailable(Unavailable::Store, e.to_string())
            }
            AgentError::ShuttingDown => Self::unavailable(Unavailable::Stopping, e.to_string()),
            AgentError::Directory { .. }
            | AgentError::NotOwnListener { .. }
            | AgentError::Metrics(_)
            | AgentError::InstanceImage(_)
            | AgentError::Register(RegisterError::NameTaken { .. }) => {
                Self::unavailable(Unavailable::Node, e.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(e: AgentError) -> Option<Unavailable> {
        match InstanceError::from(e) {
            InstanceError::Unavailable { reason, .. } => Some(reason),
            _ => None,
        }
    }

    /// Each failure says truly whether another node may do better: a limit or a stop of this
    /// node does; a store that fails does not; an app that cannot run is no shortage at all.
    #[test]
    fn each_failure_gives_its_true_reason() {
        let full = AgentError::Full {
            what: "this node".into(),
            limit: 1,
        };
        assert_eq!(reason(full), Some(Unavailable::Limit));
        let no_uid = AgentError::Launch {
            app: "demo".into(),
            source: LaunchError::NoUid { of: 1 },
        };
        assert_eq!(reason(no_uid), Some(Unavailable::Limit));
        assert_eq!(
            reason(AgentError::ShuttingDown),
            Some(Unavailable::Stopping)
        );
        let store = AgentError::Store(StoreError::Engine {
            op: "put",
            reason: "unreachable".into(),
        });
        assert_eq!(reason(store), Some(Unavailable::Store));
        let missing = AgentError::Launch {
            app: "demo".into(),
            source: LaunchError::NotFound {
                program: "./demo".into(),
                search: "PATH",
            },
        };
        assert!(matches!(
            InstanceError::from(missing),
            InstanceError::StartFailed { .. }
        ));
        // The node could not fork: its trouble, not the app's; another node may start it.
        let node_side = AgentError::Launch {
            app: "demo".into(),
            source: LaunchError::Spawn {
                what: "the sandbox's init".into(),
                source: std::io::Error::from_raw_os_error(libc::EAGAIN),
            },
        };
        assert_eq!(reason(node_side), Some(Unavailable::Node));
    }

    /// An instance that could not have its database says the data server's error, not advice
    /// about the app's command that would send its operator the wrong way.
    #[test]
    fn a_data_failure_says_the_data_servers_error_not_the_commands() {
        let data = AgentError::Launch {
            app: "notes".into(),
            source: LaunchError::Data(warden_core::data::DataError(
                "cannot connect to PostgreSQL as the admin: connection refused".into(),
            )),
        };
        let text = data.to_string();
        assert!(
            text.ends_with("cannot connect to PostgreSQL as the admin: connection refused"),
            "{text}"
        );
        assert!(!text.contains("command"), "{text}");
        let missing = AgentError::Launch {
            app: "demo".into(),
            source: LaunchError::NotFound {
                program: "./demo".into(),
                search: "PATH",
            },
        };
        assert!(missing
            .to_string()
            .ends_with("check the app's command and workdir"));
    }
}
