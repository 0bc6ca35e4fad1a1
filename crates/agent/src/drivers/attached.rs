//! A process attached to a client (`warden run`): its stdio are pipes and a socket the agent
//! holds, rather than /dev/null and the log file every other process of a driver gets.

use std::os::fd::OwnedFd;

/// The stdio of an attached process, the process's ends.
pub(crate) struct Attached {
    /// Its stdin.
    pub stdin: AttachedStdin,
    /// Its stdout, the write end of a pipe.
    pub stdout: OwnedFd,
    /// Its stderr, the write end of another pipe.
    pub stderr: OwnedFd,
}

/// Where an attached process reads its stdin.
pub(crate) enum AttachedStdin {
    /// A plain process: the read end of a pipe.
    Pipe(OwnedFd),
    /// A sandbox: a Unix socket the agent listens on, by its path inside the sandbox (a pipe
    /// made outside cannot be handed in: sandbox-init's own stdin is its control socket).
    Socket(String),
}
