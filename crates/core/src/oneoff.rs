//! One-off commands (`warden run`): the seam through which the API asks this node's agent to
//! run a command as a fresh process of an app (its driver, slug, config vars, and for a data
//! app a socket as its label's role) and talks to it while it runs. The process is the agent's:
//! it is killed when the API lets go of the [`OneOff`] (the client went away) or when warden
//! stops.

use tokio::sync::mpsc;

/// Most bytes one chunk of input or output carries.
pub const MAX_CHUNK: usize = 64 * 1024;

/// What the client sends the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Bytes for its stdin.
    Stdin(Vec<u8>),
    /// Its stdin ends (the client's reached end of file).
    StdinEnd,
    /// A signal for it.
    Signal(RunSignal),
}

/// The signals a client may send a one-off process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunSignal {
    /// SIGINT: the client's Ctrl-C.
    Interrupt,
    /// SIGTERM.
    Terminate,
}

/// What the process sends the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Bytes it wrote to stdout.
    Stdout(Vec<u8>),
    /// Bytes it wrote to stderr.
    Stderr(Vec<u8>),
    /// It ended; nothing follows.
    Exited(Exit),
}

/// How a one-off process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal (this number) killed it.
    Signal(i32),
}

/// A running one-off process. Dropping `input` (or `output`) kills it.
#[derive(Debug)]
pub struct OneOff {
    /// Where the client's input goes.
    pub input: mpsc::Sender<Input>,
    /// What the process writes, then how it ended.
    pub output: mpsc::Receiver<Output>,
}

/// Why a one-off process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum OneOffError {
    /// The node could not start it (its slug, its directory, its driver, the data server).
    #[error("{0}")]
    Node(String),
    /// This node runs no agent that could.
    #[error("this node cannot run one-off commands: it runs no agent; run `warden run` against the API of a node that runs the agent")]
    NoAgent,
}
