//! `POST /v1/apps/{name}/run` (`warden run`): the request, and the frames both ends exchange
//! once the connection is upgraded (`Upgrade: warden-run`). Each frame is a type byte, a
//! length (u32, big-endian, at most [`MAX_FRAME`]) and that many bytes.

use warden_core::oneoff::{Exit, Input, Output, RunSignal};

/// The `Upgrade` protocol of a run.
pub const UPGRADE: &str = "warden-run";

/// Most bytes one frame carries.
pub const MAX_FRAME: usize = warden_core::oneoff::MAX_CHUNK;

/// Body of `POST /v1/apps/{name}/run`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// The command and its arguments, run without a shell on the release's PATH.
    pub command: Vec<String>,
}

/// Query of `POST /v1/apps/{name}/run`: in the query string, so the audit record names them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RunQuery {
    /// The label the command runs at (a data app's database as that label's role) [default:
    /// the user's clearance with `user`, else the lattice's lowest level].
    #[serde(default)]
    pub label: Option<String>,
    /// The app user the command runs for: their clearance is its label.
    #[serde(default)]
    pub user: Option<String>,
}

const STDIN: u8 = 1;
const STDIN_END: u8 = 2;
const SIGNAL: u8 = 3;
const STDOUT: u8 = 11;
const STDERR: u8 = 12;
const EXIT: u8 = 13;

/// A frame that does not read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// Longer than [`MAX_FRAME`].
    #[error("a frame of {0} bytes, more than the {MAX_FRAME} allowed")]
    TooLong(usize),
    /// A type this end does not know, or a body that does not fit it.
    #[error("a frame of unknown type {0} (or a malformed one); are the CLI and the API the same version?")]
    Unknown(u8),
}

fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(kind);
    out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// The frame of `input` (client → server). Stdin longer than a frame is sent in several.
pub fn encode_input(input: &Input) -> Vec<u8> {
    match input {
        Input::Stdin(b) => b.chunks(MAX_FRAME).flat_map(|c| frame(STDIN, c)).collect(),
        Input::StdinEnd => frame(STDIN_END, &[]),
        Input::Signal(RunSignal::Interrupt) => frame(SIGNAL, &[2]),
        Input::Signal(RunSignal::Terminate) => frame(SIGNAL, &[15]),
    }
}

/// The frame of `output` (server → client).
pub fn encode_output(output: &Output) -> Vec<u8> {
    match output {
        Output::Stdout(b) => b.chunks(MAX_FRAME).flat_map(|c| frame(STDOUT, c)).collect(),
        Output::Stderr(b) => b.chunks(MAX_FRAME).flat_map(|c| frame(STDERR, c)).collect(),
        Output::Exited(Exit::Code(c)) => frame(EXIT, &[&[0][..], &c.to_be_bytes()].concat()),
        Output::Exited(Exit::Signal(s)) => frame(EXIT, &[&[1][..], &s.to_be_bytes()].concat()),
    }
}

/// Takes the first whole frame off `buf`: its type and body, `None` while it is incomplete.
fn take(buf: &mut Vec<u8>) -> Result<Option<(u8, Vec<u8>)>, FrameError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLong(len));
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    let kind = buf[0];
    let body = buf[5..5 + len].to_vec();
    buf.drain(..5 + len);
    Ok(Some((kind, body)))
}

/// The first whole client frame in `buf`, taken off it.
pub fn decode_input(buf: &mut Vec<u8>) -> Result<Option<Input>, FrameError> {
    let Some((kind, body)) = take(buf)? else {
        return Ok(None);
    };
    Ok(Some(match (kind, body.as_slice()) {
        (STDIN, _) => Input::Stdin(body),
        (STDIN_END, []) => Input::StdinEnd,
        (SIGNAL, [2]) => Input::Signal(RunSignal::Interrupt),
        (SIGNAL, [15]) => Input::Signal(RunSignal::Terminate),
        _ => return Err(FrameError::Unknown(kind)),
    }))
}

/// The first whole server frame in `buf`, taken off it.
pub fn decode_output(buf: &mut Vec<u8>) -> Result<Option<Output>, FrameError> {
    let Some((kind, body)) = take(buf)? else {
        return Ok(None);
    };
    Ok(Some(match (kind, body.as_slice()) {
        (STDOUT, _) => Output::Stdout(body),
        (STDERR, _) => Output::Stderr(body),
        (EXIT, [how, a, b, c, d]) => {
            let n = i32::from_be_bytes([*a, *b, *c, *d]);
            match how {
                0 => Output::Exited(Exit::Code(n)),
                _ => Output::Exited(Exit::Signal(n)),
            }
        }
        _ => return Err(FrameError::Unknown(kind)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_back_whole_and_in_pieces() {
        let inputs = [
            Input::Stdin(b"hello\n".to_vec()),
            Input::StdinEnd,
            Input::Signal(RunSignal::Interrupt),
        ];
        let mut wire: Vec<u8> = inputs.iter().flat_map(encode_input).collect();
        let mut got = Vec::new();
        // Byte by byte: a frame is only taken when whole.
        let mut buf = Vec::new();
        for b in wire.drain(..) {
            buf.push(b);
            while let Some(i) = decode_input(&mut buf).unwrap() {
                got.push(i);
            }
        }
        assert_eq!(got, inputs);
        let outputs = [
            Output::Stdout(b"x".to_vec()),
            Output::Stderr(b"e".to_vec()),
            Output::Exited(Exit::Code(3)),
            Output::Exited(Exit::Signal(2)),
        ];
        let mut buf: Vec<u8> = outputs.iter().flat_map(encode_output).collect();
        for o in outputs {
            assert_eq!(decode_output(&mut buf).unwrap(), Some(o));
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn a_frame_too_long_or_unknown_is_refused() {
        let mut long = vec![STDIN];
        long.extend_from_slice(&(MAX_FRAME as u32 + 1).to_be_bytes());
        assert_eq!(
            decode_input(&mut long),
            Err(FrameError::TooLong(MAX_FRAME + 1))
        );
        let mut odd = frame(SIGNAL, &[9]);
        assert_eq!(decode_input(&mut odd), Err(FrameError::Unknown(SIGNAL)));
    }
}
