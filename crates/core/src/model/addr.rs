//! Where the gateway reaches an instance: [`InstanceAddr`], parsed once when a record is read.
//!
//! Stored records and the API's JSON hold it as a string (`host:port`, or `fd+unix:<path>`);
//! the type serialises to and from exactly that string, so neither changed when it came, and an
//! unknown form is refused when the record is decoded rather than when someone connects.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Where an instance takes connections.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum InstanceAddr {
    /// A TCP port the node can reach: a `process` instance on the host's loopback.
    Tcp(SocketAddr),
    /// A Unix socket whose listener (a sandbox's init) hands over a TCP connection it opened
    /// inside the instance's own network namespace, which nothing on the host reaches by
    /// address.
    FdUnix {
        /// The hand-over socket, in the instance's directory.
        socket: PathBuf,
    },
}

/// Why a string is not an instance address. Shown when a record that holds one is decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    /// `fd+unix:` with nothing after it.
    #[error("instance address {0:?} names no socket after `fd+unix:`; the record was not written by a warden agent, remove it")]
    NoSocket(String),
    /// Neither form.
    #[error("instance address {0:?} is neither `ip:port` nor `fd+unix:<path>`; the record was not written by a warden agent, remove it")]
    Unknown(String),
}

// === impl InstanceAddr ===

impl InstanceAddr {
    /// Prefix of the string form of [`InstanceAddr::FdUnix`].
    pub const FD_UNIX: &'static str = "fd+unix:";

    /// The hand-over socket `socket`.
    pub fn fd_unix(socket: impl Into<PathBuf>) -> Self {
        Self::FdUnix {
            socket: socket.into(),
        }
    }

    /// The TCP address, for a [`InstanceAddr::Tcp`].
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            Self::Tcp(a) => Some(*a),
            Self::FdUnix { .. } => None,
        }
    }

    /// The hand-over socket, for a [`InstanceAddr::FdUnix`].
    pub fn socket(&self) -> Option<&Path> {
        match self {
            Self::Tcp(_) => None,
            Self::FdUnix { socket } => Some(socket),
        }
    }
}

impl From<SocketAddr> for InstanceAddr {
    fn from(a: SocketAddr) -> Self {
        Self::Tcp(a)
    }
}

impl fmt::Display for InstanceAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(a) => a.fmt(f),
            // `display` is what the string form was made with before the type: the same bytes
            // for every UTF-8 path (an instance directory under the node's data directory).
            Self::FdUnix { socket } => write!(f, "{}{}", Self::FD_UNIX, socket.display()),
        }
    }
}

impl FromStr for InstanceAddr {
    type Err = AddrError;

    fn from_str(s: &str) -> Result<Self, AddrError> {
        if let Some(path) = s.strip_prefix(Self::FD_UNIX) {
            if path.is_empty() {
                return Err(AddrError::NoSocket(s.to_owned()));
            }
            return Ok(Self::fd_unix(path));
        }
        s.parse::<SocketAddr>()
            .map(Self::Tcp)
            .map_err(|_| AddrError::Unknown(s.to_owned()))
    }
}

impl Serialize for InstanceAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for InstanceAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every form an agent writes: a process instance's loopback port, the same on IPv6, and a
    /// sandbox's hand-over socket under a data directory (with a space, as paths may hold).
    const WRITTEN: [&str; 4] = [
        "127.0.0.1:41234",
        "[::1]:8080",
        "fd+unix:/var/lib/warden/instances/web-0a1b2c/conn.sock",
        "fd+unix:/tmp/warden data/instances/x/conn.sock",
    ];

    #[test]
    fn every_written_form_round_trips_byte_for_byte() {
        for s in WRITTEN {
            let addr: InstanceAddr = s.parse().expect(s);
            assert_eq!(addr.to_string(), s);
            let json = serde_json::to_string(&addr).unwrap();
            assert_eq!(json, serde_json::to_string(s).unwrap());
            let back: InstanceAddr = serde_json::from_str(&json).unwrap();
            assert_eq!(back, addr);
        }
    }

    #[test]
    fn forms_parse_to_what_they_say() {
        assert_eq!(
            "127.0.0.1:41234".parse::<InstanceAddr>().unwrap(),
            InstanceAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 41234)))
        );
        let sock = "fd+unix:/d/conn.sock".parse::<InstanceAddr>().unwrap();
        assert_eq!(sock.socket(), Some(Path::new("/d/conn.sock")));
        assert_eq!(sock.tcp(), None);
    }

    #[test]
    fn what_the_agent_builds_writes_todays_string() {
        let tcp = InstanceAddr::from(SocketAddr::from(([127, 0, 0, 1], 5000)));
        assert_eq!(tcp.to_string(), "127.0.0.1:5000");
        let sock = InstanceAddr::fd_unix(Path::new("/data/i/x").join("conn.sock"));
        assert_eq!(sock.to_string(), "fd+unix:/data/i/x/conn.sock");
    }

    #[test]
    fn a_malformed_address_is_refused_at_decode() {
        for bad in [
            "",
            "fd+unix:",
            "localhost",
            "127.0.0.1",
            "unix:/x/conn.sock",
            "FD+UNIX:/x",
            "tcp://127.0.0.1:80",
            "127.0.0.1:99999",
        ] {
            let json = serde_json::to_string(bad).unwrap();
            let err = serde_json::from_str::<InstanceAddr>(&json)
                .expect_err(bad)
                .to_string();
            assert!(err.contains("instance address"), "{bad}: {err}");
        }
        assert!(serde_json::from_str::<InstanceAddr>("5").is_err());
    }

    #[test]
    fn a_record_keeps_its_stored_form_and_refuses_a_bad_one() {
        let stored = |addr: &str| {
            serde_json::json!({
                "id": "i1", "app": "web", "label": "L", "node": "n", "addr": addr,
                "pid": 1, "state": "ready", "started_at_ms": 0, "lifetime": "shared", "kept": false,
            })
        };
        for s in WRITTEN {
            let record: crate::InstanceRecord = serde_json::from_value(stored(s)).unwrap();
            assert_eq!(serde_json::to_value(&record).unwrap(), stored(s));
        }
        let err = serde_json::from_value::<crate::InstanceRecord>(stored("nowhere")).unwrap_err();
        assert!(err.to_string().contains("\"nowhere\""), "{err}");
    }
}
