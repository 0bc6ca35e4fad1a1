//! A real PostgreSQL for the proxy's tests, kept small: initdb in a temp dir, a Unix socket
//! only, SCRAM for every local login. Run as the `postgres` system user when the tests run as
//! root (PostgreSQL refuses root). To be replaced by `server::private` once it lands.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;
use warden_data::proxy::{ServerAddr, Target};

const BIN: &str = "/usr/lib/postgresql/15/bin";
const ADMIN_PASSWORD: &str = "admin-test-password";
pub const ROLE: &str = "wl_test";
pub const DATABASE: &str = "appdb";

pub struct Pg {
    _dir: TempDir,
    data: PathBuf,
    pub socket_dir: PathBuf,
    log: PathBuf,
    user: Option<(u32, u32)>,
}

impl Pg {
    /// initdb, start, and make the role the proxy logs in as (with a SCRAM verifier computed
    /// here, never the clear password in SQL) and its database.
    pub async fn start() -> Pg {
        let dir = tempfile::Builder::new()
            .prefix("warden-pg-")
            .tempdir()
            .unwrap();
        let user = postgres_user();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        }
        let pg = Pg {
            data: dir.path().join("data"),
            socket_dir: dir.path().to_owned(),
            log: dir.path().join("log"),
            _dir: dir,
            user,
        };
        let pwfile = pg.socket_dir.join("pw");
        std::fs::write(&pwfile, ADMIN_PASSWORD).unwrap();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid)).unwrap();
        }
        pg.run(
            "initdb",
            &[
                "-D",
                path(&pg.data),
                "-U",
                "postgres",
                "--auth=scram-sha-256",
                "-N",
                "--pwfile",
                path(&pwfile),
            ],
        );
        pg.start_again();
        let admin = pg.admin().await;
        let verifier = postgres_protocol::password::scram_sha_256(password().as_bytes());
        let role = format!("CREATE ROLE {ROLE} LOGIN NOSUPERUSER PASSWORD '{verifier}'");
        admin.batch_execute(&role).await.unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {DATABASE} OWNER {ROLE}"))
            .await
            .unwrap();
        pg
    }

    /// Starts the server (again), waiting until it accepts connections.
    pub fn start_again(&self) {
        let opts = format!(
            "-k {} -c listen_addresses='' -c fsync=off",
            self.socket_dir.display()
        );
        self.run(
            "pg_ctl",
            &[
                "start",
                "-w",
                "-D",
                path(&self.data),
                "-l",
                path(&self.log),
                "-o",
                &opts,
            ],
        );
    }

    /// Stops the server, closing every connection.
    pub fn stop(&self) {
        self.run(
            "pg_ctl",
            &["stop", "-w", "-m", "fast", "-D", path(&self.data)],
        );
    }

    pub fn target(&self) -> Target {
        Target {
            role: ROLE.into(),
            password: password(),
            server: ServerAddr::Unix {
                dir: self.socket_dir.clone(),
                port: 5432,
            },
            database: DATABASE.into(),
        }
    }

    /// Another app: its own role and database on the same server.
    pub async fn another_app(&self, role: &str, database: &str) -> Target {
        let admin = self.admin().await;
        let verifier = postgres_protocol::password::scram_sha_256(password().as_bytes());
        let role_sql = format!("CREATE ROLE {role} LOGIN NOSUPERUSER PASSWORD '{verifier}'");
        admin.batch_execute(&role_sql).await.unwrap();
        let db_sql = format!("CREATE DATABASE {database} OWNER {role}");
        admin.batch_execute(&db_sql).await.unwrap();
        Target {
            role: role.into(),
            database: database.into(),
            ..self.target()
        }
    }

    /// A superuser session, straight to PostgreSQL.
    pub async fn admin(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::Config::new()
            .host_path(&self.socket_dir)
            .user("postgres")
            .password(ADMIN_PASSWORD)
            .dbname("postgres")
            .connect(tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
    }

    fn run(&self, program: &str, args: &[&str]) {
        let mut cmd = Command::new(Path::new(BIN).join(program));
        cmd.args(args).env_remove("PGDATA");
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{program} failed: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        let mut cmd = Command::new(Path::new(BIN).join("pg_ctl"));
        cmd.args(["stop", "-m", "immediate", "-D", path(&self.data)]);
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        let _ = cmd.output();
    }
}

/// The role's password: what the caller of the proxy would derive.
fn password() -> String {
    "role-test-password-not-in-the-instance".into()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The `postgres` system user's ids when running as root.
fn postgres_user() -> Option<(u32, u32)> {
    let me = String::from_utf8(Command::new("id").arg("-u").output().unwrap().stdout).unwrap();
    if me.trim() != "0" {
        return None;
    }
    let id = |flag: &str| -> u32 {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .unwrap();
        String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .expect("a postgres system user")
    };
    Some((id("-u"), id("-g")))
}
