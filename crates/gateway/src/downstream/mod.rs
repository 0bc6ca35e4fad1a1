//! The downstream side: what clients speak to the gateway. A connection starts on the lane
//! ([`lane`]), the gateway's own HTTP/1.1 loop for the request that dominates its load; what
//! the lane does not take goes to hyper ([`hyper`]) with the bytes read so far, and hyper
//! serves the connection from that request on (HTTP/2, and HTTP/1.1 the lane leaves alone).
//! Both end in the same place: [`crate::dispatch`] and [`crate::upstream`] for apps,
//! [`crate::endpoints`] for the gateway's own answers.

mod hyper;
mod lane;
mod streams;

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::client::Client;
use crate::phases::Clock;
use crate::shared::SharedTcp;
use crate::state::State;

/// Serves an HTTP/1.1 connection: on the lane while it can, then through hyper. `spare` is a
/// second handle on a plain socket, with which hyper's path answers 408 to a slow head.
pub(crate) async fn serve_http1<S>(
    state: Arc<State>,
    stream: S,
    client: Client,
    spare: Option<SharedTcp>,
    clock: Arc<Clock>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    lane::serve(state, stream, client, spare, clock).await
}

/// Serves an HTTP/2 connection (chosen by ALPN over TLS) with hyper.
pub(crate) async fn serve_http2<S>(state: Arc<State>, stream: S, client: Client, clock: Arc<Clock>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    hyper::serve(state, stream, client, None, clock).await
}
