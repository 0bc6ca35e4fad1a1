//! The client at the far end of a connection, as the request path needs it.

use std::net::{IpAddr, SocketAddr};

/// The client of a connection.
pub(crate) struct Client {
    pub ip: IpAddr,
    /// The address written out once, for `x-forwarded-for`.
    pub text: String,
    /// It came over TLS.
    pub https: bool,
}

impl Client {
    pub(crate) fn new(peer: SocketAddr, https: bool) -> Self {
        Self {
            ip: peer.ip(),
            text: peer.ip().to_string(),
            https,
        }
    }
}
