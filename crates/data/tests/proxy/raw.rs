//! Raw protocol for what no client library sends: bad startups, a query and Terminate at
//! once, a cancel with a chosen key.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// A simple-protocol Query message.
pub fn query_message(sql: &str) -> Vec<u8> {
    let mut msg = vec![b'Q'];
    msg.extend_from_slice(&((sql.len() + 5) as i32).to_be_bytes());
    msg.extend_from_slice(sql.as_bytes());
    msg.push(0);
    msg
}

/// A startup message with `params`, written raw.
pub fn startup(params: &[(&str, &str)], version: i32) -> Vec<u8> {
    let mut body = version.to_be_bytes().to_vec();
    for (k, v) in params {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut out = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// Everything the proxy says before closing (bounded by a timeout), as text.
pub async fn read_all(s: &mut UnixStream) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// A raw protocol client past its startup: returns the stream and the key it was given.
pub async fn raw_client(sock: &Path) -> UnixStream {
    raw_client_with_key(sock).await.0
}

pub async fn raw_client_with_key(sock: &Path) -> (UnixStream, (i32, i32)) {
    raw_client_params(sock, &[("user", "x")]).await
}

pub async fn raw_client_params(sock: &Path, params: &[(&str, &str)]) -> (UnixStream, (i32, i32)) {
    let mut s = UnixStream::connect(sock).await.unwrap();
    s.write_all(&startup(params, 196_608)).await.unwrap();
    let mut key = (0, 0);
    loop {
        let tag = s.read_u8().await.unwrap();
        let len = s.read_i32().await.unwrap() as usize - 4;
        let mut body = vec![0; len];
        s.read_exact(&mut body).await.unwrap();
        match tag {
            b'K' => {
                key = (
                    i32::from_be_bytes(body[..4].try_into().unwrap()),
                    i32::from_be_bytes(body[4..].try_into().unwrap()),
                )
            }
            b'Z' => return (s, key),
            b'E' => panic!("refused: {}", String::from_utf8_lossy(&body)),
            _ => {}
        }
    }
}

/// The raw client's answer up to its ReadyForQuery.
pub async fn read_all_until_ready(s: &mut UnixStream) -> String {
    let mut out = String::new();
    loop {
        let tag = s.read_u8().await.unwrap();
        let len = s.read_i32().await.unwrap() as usize - 4;
        let mut body = vec![0; len];
        s.read_exact(&mut body).await.unwrap();
        out.push_str(&String::from_utf8_lossy(&body));
        if tag == b'Z' {
            return out;
        }
    }
}
