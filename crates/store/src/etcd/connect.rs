//! What a client needs to reach an etcd cluster: endpoints, client TLS and a user.

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use crate::StoreError;

/// Client TLS towards etcd: the CA that signed the members' certificates, and this client's
/// own certificate and key when the members ask for one (`--client-cert-auth`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EtcdTls {
    /// PEM CA certificate(s) the members' certificates must chain to.
    pub ca: PathBuf,
    /// PEM client certificate.
    pub cert: Option<PathBuf>,
    /// PEM key of `cert`.
    pub key: Option<PathBuf>,
}

/// How to reach an etcd cluster. The password is never held here: only the file it is read
/// from, so that it cannot reach a log line or the config shown back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EtcdOptions {
    /// `host:port` of each member.
    pub endpoints: Vec<String>,
    /// Client TLS, when the members serve TLS.
    pub tls: Option<EtcdTls>,
    /// etcd user, when etcd's authentication is on.
    pub user: Option<String>,
    /// File holding that user's password (one line).
    pub password_file: Option<PathBuf>,
}

impl EtcdOptions {
    /// Parses `etcd://HOST:PORT[,HOST:PORT...]`.
    pub fn parse(s: &str) -> Option<Self> {
        let rest = s.strip_prefix("etcd://")?;
        let endpoints: Vec<String> = rest
            .split(',')
            .map(|e| e.trim().trim_end_matches('/').to_owned())
            .collect();
        let valid = |e: &String| {
            e.rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0))
        };
        if endpoints.is_empty() || !endpoints.iter().all(valid) {
            return None;
        }
        Some(Self {
            endpoints,
            ..Self::default()
        })
    }
}

fn read(what: &str, path: &PathBuf) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| StoreError::Open {
        path: path.display().to_string(),
        reason: format!("cannot read the etcd {what}: {e}"),
    })
}

pub(super) async fn client(o: &EtcdOptions) -> Result<Client, StoreError> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5))
        // A dead member is noticed in seconds even when its socket stays open (a partition).
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
        .with_keep_alive_while_idle(true)
        // A member cut off from the majority must not answer from its stale copy.
        .with_require_leader(true);
    let scheme = match &o.tls {
        Some(tls) => {
            let mut t = TlsOptions::new()
                .ca_certificate(Certificate::from_pem(read("CA certificate", &tls.ca)?));
            match (&tls.cert, &tls.key) {
                (Some(c), Some(k)) => {
                    t = t.identity(Identity::from_pem(
                        read("client certificate", c)?,
                        read("client key", k)?,
                    ))
                }
                (None, None) => {}
                _ => {
                    return Err(StoreError::Open {
                        path: "etcd".into(),
                        reason: "give both --etcd-cert and --etcd-key, or neither".into(),
                    })
                }
            }
            options = options.with_tls(t);
            "https"
        }
        None => "http",
    };
    match (&o.user, &o.password_file) {
        (Some(user), Some(file)) => {
            let password =
                String::from_utf8(read("password file", file)?).map_err(|_| StoreError::Open {
                    path: file.display().to_string(),
                    reason: "the etcd password file is not UTF-8".into(),
                })?;
            options = options.with_user(user.clone(), password.trim_end_matches(['\r', '\n']));
        }
        (None, None) => {}
        _ => {
            return Err(StoreError::Open {
                path: "etcd".into(),
                reason: "give both --etcd-user and --etcd-password-file, or neither".into(),
            })
        }
    }
    let urls: Vec<String> = o
        .endpoints
        .iter()
        .map(|e| format!("{scheme}://{e}"))
        .collect();
    Client::connect(urls, Some(options))
        .await
        .map_err(|e| StoreError::Open {
            path: o.endpoints.join(","),
            // Never the password: etcd's errors name the user at most.
            reason: format!("cannot connect to etcd: {e}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_addresses_parse_or_are_refused() {
        let o = EtcdOptions::parse("etcd://127.0.0.1:2379,127.0.0.2:2379").unwrap();
        assert_eq!(o.endpoints, ["127.0.0.1:2379", "127.0.0.2:2379"]);
        for bad in [
            "etcd://",
            "etcd://host",
            "etcd://:2379",
            "etcd://h:0",
            "redis://h:1",
        ] {
            assert_eq!(EtcdOptions::parse(bad), None, "{bad}");
        }
    }
}
