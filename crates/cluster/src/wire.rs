//! The node port's messages: one request from the client, one reply from the node, each a
//! JSON document behind a 4-byte big-endian length. After the reply to `connect`, the stream
//! carries the instance's bytes both ways.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use warden_core::audit::{Query, Verified};
use warden_core::{AppSpec, InstanceError, InstanceRecord, Owner, ReleaseAsk};

/// Largest message accepted (an app spec is the largest thing sent).
const MAX_MESSAGE: u32 = 1 << 20;

/// What a node is asked.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Request {
    /// Join this stream to the instance, if it still serves `label` (a gateway whose view is
    /// behind a relabel after taint is refused, not joined).
    Connect { id: String, label: String },
    /// A ready instance of the app for the label and owner, started if none runs.
    Ensure {
        spec: Box<AppSpec>,
        label: String,
        owner: Owner,
    },
    /// Stop a per-request instance whose request is done.
    Retire { id: String },
    /// Raise a tainted instance's label.
    Relabel { id: String, label: String },
    /// Stop an instance.
    Kill { id: String },
    /// The last lines an instance printed.
    Logs { id: String, lines: usize },
    /// A release's slug archive, if this node has it.
    Slug { id: String },
    /// Whether the node answers: `ok`, and the connection waits for the next ping.
    Ping,
    /// Make a release on this node (for a push, its bytes follow): `refused`, or `stream`
    /// and the release's progress as `text` until `ok`.
    Release { ask: ReleaseAsk },
    /// A release's log, kept by this node: `text` pieces until `ok`.
    ReleaseLog { app: String, number: u64 },
    /// This node's audit records for `query` (at most 10,000): JSON lines in `text` pieces
    /// until `ok`; `refused` if its log cannot be read.
    Audit { query: Query },
    /// This node's audit log checked: `verified`, or `refused` if it keeps none.
    AuditVerify,
}

/// What a node answers.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Reply {
    /// Done (for `connect`: the instance's bytes follow).
    Ok,
    /// The instance asked for.
    Record(Box<InstanceRecord>),
    /// Log lines.
    Text(String),
    /// `size` bytes of a slug's archive follow.
    Blob { size: u64 },
    /// It could not be done.
    Err(InstanceError),
    /// A release was refused before anything ran, or an audit request cannot be answered: the
    /// HTTP status and message to answer.
    Refused { status: u16, message: String },
    /// What this node's audit log's check found.
    Verified(Box<Verified>),
    /// A release was taken: its progress follows.
    Stream,
}

fn invalid(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

pub(crate) async fn write<T: Serialize>(
    w: &mut (impl AsyncWrite + Unpin),
    msg: &T,
) -> std::io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(|e| invalid(e.to_string()))?;
    let len = u32::try_from(body.len()).map_err(|_| invalid("message too large".into()))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame).await?;
    w.flush().await
}

pub(crate) async fn read<T: serde::de::DeserializeOwned>(
    r: &mut (impl AsyncRead + Unpin),
) -> std::io::Result<T> {
    let len = r.read_u32().await?;
    if len > MAX_MESSAGE {
        return Err(invalid(format!("a node port message of {len} bytes")));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body).await?;
    serde_json::from_slice(&body)
        .map_err(|e| invalid(format!("a malformed node port message: {e}")))
}
