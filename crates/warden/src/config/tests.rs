use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;

use super::types::{Human, Role};
use super::*;

const EXAMPLE: &str = include_str!("../../../../docs/warden.example.toml");

/// `warden up`'s flags alone.
#[derive(Debug, Parser)]
struct Up {
    #[command(flatten)]
    up: UpArgs,
}

fn flags(args: &[&str]) -> Result<Config, String> {
    let up = Up::try_parse_from(std::iter::once("up").chain(args.iter().copied()))
        .map_err(|e| e.to_string())?;
    up.up.into_config().map_err(|e| e.to_string())
}

fn file(text: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), text).unwrap();
    f
}

#[test]
fn the_example_holds_every_default_and_every_flag_has_a_key() {
    assert_eq!(Config::parse(EXAMPLE).unwrap(), Config::default());
    let cmd = <Up as clap::CommandFactory>::command();
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == "config" || long == "help" {
            continue;
        }
        let key = long.trim_start_matches("no-").replace('-', "_");
        let listed = EXAMPLE
            .lines()
            .any(|l| l.trim_start_matches("# ").starts_with(&format!("{key} = ")));
        assert!(
            listed,
            "--{long} has no key {key} in docs/warden.example.toml"
        );
    }
}

#[test]
fn flags_override_the_file_and_the_file_overrides_defaults() {
    let f = file("listen = \"127.0.0.1:8000\"\nheader_timeout = \"2s\"\nroles = [\"gateway\"]\n");
    let path = f.path().to_str().unwrap();
    let cfg = flags(&["--config", path, "--listen", "127.0.0.1:9000"]).unwrap();
    assert_eq!(cfg.listen, "127.0.0.1:9000".parse::<SocketAddr>().unwrap());
    assert_eq!(cfg.header_timeout, Human(Duration::from_secs(2)));
    assert_eq!(cfg.roles, vec![Role::Gateway]);
    assert_eq!(cfg.upstream_timeout, Config::default().upstream_timeout);
    let cfg = flags(&[
        "--config",
        path,
        "--roles",
        "api,agent",
        "--no-tls-admission",
    ])
    .unwrap();
    assert_eq!(cfg.roles, vec![Role::Api, Role::Agent]);
    assert!(!cfg.tls_admission);
    assert!(cfg.password_sign_in, "on unless turned off");
    let off = file("password_sign_in = false\n");
    assert!(
        !flags(&["--config", off.path().to_str().unwrap()])
            .unwrap()
            .password_sign_in
    );
    assert!(
        !flags(&["--no-password-sign-in"])
            .unwrap()
            .auth()
            .password_sign_in
    );
}

#[test]
fn bad_values_are_refused_naming_the_key() {
    let cases = [
        ("header_timeout = \"soon\"", "header_timeout"),
        ("header_timeout = \"0s\"", "header_timeout"),
        ("lisen = \"127.0.0.1:1\"", "lisen"),
        ("cgroups = \"maybe\"", "cgroups"),
        ("bridge_cidr = \"10.0.0.1/16\"", "bridge_cidr"),
        ("max_log_mb = 0", "max_log_mb"),
        ("roles = [\"checker\"]", "roles"),
        ("roles = []", "roles"),
        (
            "tls_cert = [\"a.pem\"]\ntls_listen = \"127.0.0.1:1\"",
            "tls_key",
        ),
        ("argon2_memory_kib = 1", "argon2_memory_kib"),
    ];
    for (text, key) in cases {
        let f = file(text);
        let err = flags(&["--config", f.path().to_str().unwrap()]).unwrap_err();
        assert!(err.contains(key), "{text:?} gave: {err}");
    }
    for (args, flag) in [
        (&["--header-timeout", "soon"][..], "--header-timeout"),
        (&["--roles", "gateway,nope"], "--roles"),
        (&["--listen", "localhost"], "--listen"),
    ] {
        let err = flags(args).unwrap_err();
        assert!(err.contains(flag), "{args:?} gave: {err}");
    }
    let err = flags(&["--config", "/nonexistent/warden.toml"]).unwrap_err();
    assert!(err.contains("/nonexistent/warden.toml"), "{err}");
}

#[test]
fn the_demo_serves_tls_beside_the_gateway() {
    let cfg = flags(&["--demo", "--listen", "127.0.0.1:8700"]).unwrap();
    assert_eq!(cfg.tls_listen(), Some("127.0.0.1:8702".parse().unwrap()));
    let cfg = flags(&["--demo", "--listen", "127.0.0.1:0"]).unwrap();
    assert_eq!(cfg.tls_listen(), Some("127.0.0.1:0".parse().unwrap()));
    assert_eq!(flags(&[]).unwrap().tls_listen(), None);
}

#[test]
fn durations_read_like_people_write_them() {
    for (text, d) in [
        ("500ms", Duration::from_millis(500)),
        ("30s", Duration::from_secs(30)),
        ("1h 30m", Duration::from_secs(5400)),
    ] {
        assert_eq!(text.parse::<Human>().unwrap(), Human(d));
    }
    assert!("15".parse::<Human>().is_err());
    assert_eq!(Human(Duration::from_secs(43_200)).to_string(), "12h");
}

#[test]
fn the_data_url_is_a_flag_and_a_key_and_its_password_is_never_shown() {
    let cfg = flags(&["--data", "postgres://admin:hunter2@db.internal/postgres"]).unwrap();
    let url = cfg.data.clone().expect("--data is kept");
    assert_eq!(url.0, "postgres://admin:hunter2@db.internal/postgres");
    let shown = format!("{cfg:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("db.internal/postgres"), "{shown}");
    let f = file("data = \"none\"\n");
    let cfg = flags(&["--config", f.path().to_str().unwrap()]).unwrap();
    assert_eq!(cfg.data.map(|d| d.0).as_deref(), Some("none"));
    assert!(Config::default().data.is_none());
}

#[test]
fn build_timeout_is_a_duration_like_the_others_and_bare_seconds_still_read() {
    let secs = |c: Config| c.build_timeout.0;
    assert_eq!(
        secs(Config::parse("build_timeout = \"15m\"").unwrap()),
        Duration::from_secs(900)
    );
    assert_eq!(
        secs(Config::parse("build_timeout = 30").unwrap()),
        Duration::from_secs(30)
    );
    assert_eq!(
        secs(flags(&["--build-timeout", "2"]).unwrap()),
        Duration::from_secs(2)
    );
    assert_eq!(
        secs(flags(&["--build-timeout", "1m"]).unwrap()),
        Duration::from_secs(60)
    );
    for bad in ["build_timeout = 0", "build_timeout = \"0s\""] {
        let e = Config::parse(bad).unwrap_err();
        assert!(e.contains("zero"), "{bad}: {e}");
    }
    let e = Config::parse("build_timeout = \"soon\"").unwrap_err();
    assert!(e.contains("not a duration like"), "{e}");
    let e = Config::parse("build_timeout = true").unwrap_err();
    assert!(e.contains("expected a duration like"), "{e}");
    let long = Config::parse("build_timeout = \"2d\"").unwrap();
    assert!(long.validate().unwrap_err().to_string().contains("24h"));
}
