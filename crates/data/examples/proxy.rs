//! The data proxy on its own, for `bench/data.sh` (pgbench through it): one listener in front
//! of a PostgreSQL on a Unix socket, until killed.
//!
//! `proxy SOCKET PG_SOCKET_DIR ROLE DATABASE [MAX_CLIENTS]`; the role's password comes from
//! `WARDEN_PROXY_PASSWORD`, so it is not on a command line `ps` shows; idle server
//! connections kept, if not the default, from `WARDEN_PROXY_MAX_IDLE`.

use std::path::PathBuf;

use warden_data::proxy::{Limits, Listener, Pool, ServerAddr, Target};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [socket, pg_dir, role, database, rest @ ..] = args.as_slice() else {
        return Err("usage: proxy SOCKET PG_SOCKET_DIR ROLE DATABASE [MAX_CLIENTS]".into());
    };
    let password = std::env::var("WARDEN_PROXY_PASSWORD")
        .map_err(|_| "set WARDEN_PROXY_PASSWORD to the role's password")?;
    let mut limits = Limits::default();
    if let Some(max) = rest.first() {
        limits.max_clients = max.parse()?;
    }
    if let Ok(idle) = std::env::var("WARDEN_PROXY_MAX_IDLE") {
        limits.max_idle = idle.parse()?;
    }
    let target = Target {
        role: role.clone(),
        password,
        server: ServerAddr::Unix {
            dir: PathBuf::from(pg_dir),
            port: 5432,
        },
        database: database.clone(),
    };
    let _listener = Listener::bind(socket, target, Pool::new(limits))?;
    eprintln!("proxy listening on {socket}");
    tokio::signal::ctrl_c().await?;
    Ok(())
}
