//! Where a process of a data app (an instance, a release command) reaches its app's database:
//! a socket warden binds in the process's private directory, and the environment that names
//! it. The socket is the credential: no password is in the environment.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::LaunchError;

/// What a data app's process meets on a node without a data server.
pub(crate) const NO_SERVER: &str = "the app has data but this node has no data server; start warden with --data postgres://ADMIN@HOST/DB or install postgresql";

/// Where to bind a process's database socket, and the environment that names it.
pub(crate) struct DataPlace {
    /// The socket's path on the host (`<dir>/.s.PGSQL.5432`).
    pub socket: PathBuf,
    /// `DATABASE_URL` and libpq's variables, as the process sees the socket.
    pub env: BTreeMap<String, String>,
}

/// Makes the socket's directory inside `dir`, the process's private directory: `pg/` for a
/// plain process, `data/.pg` in a sandbox (seen as `/data/.pg`: the private directory is
/// mounted there).
pub(crate) fn place(dir: &Path, app: &str, sandboxed: bool) -> Result<DataPlace, LaunchError> {
    // Absolute: libpq takes `host` as a socket directory only when it starts with '/'.
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
    let (host_dir, seen_as) = match sandboxed {
        true => (
            dir.join(warden_sandbox::DATA_DIR).join(".pg"),
            format!("{}/.pg", warden_sandbox::DATA_MOUNT),
        ),
        false => {
            let d = dir.join("pg");
            (d.clone(), d.display().to_string())
        }
    };
    // The process's own directory (0700) guards the socket; this one only lets the process's
    // uid reach the socket warden binds as itself. The own directory is made 0700 first,
    // before the socket's directory would make it 0755: a sandbox's directory stays root's,
    // and its path is no secret (any uid reads it in the sandbox's /proc/PID/mountinfo).
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .and_then(|()| {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&host_dir)
        })
        .map_err(|source| LaunchError::Create {
            path: host_dir.clone(),
            source,
        })?;
    let db = format!("warden_app_{app}");
    let env = BTreeMap::from([
        (
            "DATABASE_URL".to_owned(),
            format!("postgresql:///{db}?host={seen_as}"),
        ),
        ("PGHOST".to_owned(), seen_as),
        ("PGDATABASE".to_owned(), db),
        // libpq names the OS user when no user is given, and an instance's uid has no
        // name: it would refuse before connecting. The socket ignores it either way.
        ("PGUSER".to_owned(), "warden".to_owned()),
    ]);
    Ok(DataPlace {
        socket: host_dir.join(".s.PGSQL.5432"),
        env,
    })
}
