//! Issue 34's "opens the socket of another instance", through `warden up`: a hostile app
//! (data/attack.py) reaches for data sockets not its own, under each driver, and for what
//! warden does with its own socket's place once it stops. See `data_attacks.rs` for the
//! [`Vault`] every test starts.

use std::path::Path;

use serde_json::json;

use crate::data_attacks::Vault;

/// A sandboxed instance cannot even see another instance's socket (nor the server's): neither
/// is in its filesystem, while its own is.
#[test]
fn a_sandboxed_instance_cannot_open_another_instances_socket() {
    let Some(v) = Vault::start("sandbox") else {
        return;
    };
    v.ok("ursula", "SELECT 1");
    v.ok("sam", "SELECT 1");
    let other = v.instance_dir("U").join("data/.pg/.s.PGSQL.5432");
    let server = v.data_dir.join("postgres/run/.s.PGSQL.5432");
    for path in [&other, &server] {
        assert!(path.exists(), "{}", path.display());
        assert_eq!(
            v.peer("vault", "sam", path),
            json!({ "connected": false, "errno": "ENOENT" }),
            "{}",
            path.display()
        );
    }
    assert_eq!(
        v.peer("vault", "sam", Path::new("/data/.pg/.s.PGSQL.5432")),
        json!({ "connected": true })
    );
}

/// An unsandboxed instance runs as a uid of its own: another instance's directory (0700, that
/// uid's) keeps it from the socket inside, and the server's socket directory (0700, the
/// server's user's) from the server's.
#[test]
fn an_unsandboxed_instance_cannot_open_another_instances_socket() {
    let Some(v) = Vault::start("process") else {
        return;
    };
    v.ok("ursula", "SELECT 1");
    v.ok("sam", "SELECT 1");
    let other = v.instance_dir("U").join("pg/.s.PGSQL.5432");
    let server = v.data_dir.join("postgres/run/.s.PGSQL.5432");
    for path in [&other, &server] {
        assert!(path.exists(), "{}", path.display());
        assert_eq!(
            v.peer("vault", "sam", path),
            json!({ "connected": false, "errno": "EACCES" }),
            "{}",
            path.display()
        );
    }
    let mine = v.instance_dir("S").join("pg/.s.PGSQL.5432");
    assert_eq!(v.peer("vault", "sam", &mine), json!({ "connected": true }));
}

/// A sandboxed instance's directory path is no secret (any uid reads it in the sandbox's
/// `/proc/PID/mountinfo`), so its mode must keep others out: an unsandboxed instance of
/// another app, at any label, finds the path of a sandboxed S instance's data socket and
/// cannot connect to it.
#[test]
fn an_unsandboxed_instance_cannot_open_a_sandboxed_instances_socket() {
    let Some(v) = Vault::start("sandbox") else {
        return;
    };
    v.ok("sam", "SELECT 1");
    v.create_app("spy", "process", false);
    let target = v.instance_dir("S").join("data");
    let hunted = v.get("spy", "ursula", "hunt");
    assert!(
        hunted
            .as_array()
            .unwrap()
            .contains(&json!(target.display().to_string())),
        "{hunted}"
    );
    let socket = target.join(".pg/.s.PGSQL.5432");
    assert!(socket.exists(), "{}", socket.display());
    assert_eq!(
        v.peer("spy", "ursula", &socket),
        json!({ "connected": false, "errno": "EACCES" })
    );
}

/// An instance owns its `/data` (a process instance its directory), so it can put a symlink
/// where the socket's directory was: warden's cleanup, when the instance exits and when warden
/// stops, must still remove only its own socket, never the file the link leads to (the private
/// server's socket, every app's way to its data; or any file of the name, as root).
#[test]
fn an_instance_cannot_make_warden_remove_another_socket() {
    let Some(mut v) = Vault::start("sandbox") else {
        return;
    };
    v.ok("ursula", "SELECT 1");
    v.ok("sam", "SELECT 1");
    let server_dir = v.data_dir.join("postgres/run");
    let server = server_dir.join(".s.PGSQL.5432");
    // Stand-ins for a socket of that name elsewhere on the host, which outlive warden.
    let decoy = v.top.path().join("decoy");
    std::fs::create_dir(&decoy).unwrap();
    std::fs::write(decoy.join(".s.PGSQL.5432"), b"").unwrap();
    assert!(server.exists());
    // S points its socket's place at the server's, and exits.
    let to = format!("redirect?to={}&exit=1", server_dir.display());
    assert_eq!(v.get("vault", "sam", &to), json!({ "redirected": true }));
    warden_test_support::wait_until(
        "the redirecting instance to be gone",
        std::time::Duration::from_secs(30),
        || {
            let all = v.w.instances();
            (!all.iter().any(|i| i["app"] == "vault" && i["label"] == "S")).then_some(())
        },
    );
    assert!(server.exists(), "warden removed the server's socket");
    assert_eq!(v.admin("SELECT count(*) FROM notes"), "0");
    // U points its socket's place at the decoy and stays until warden stops.
    let to = format!("redirect?to={}", decoy.display());
    assert_eq!(v.get("vault", "ursula", &to), json!({ "redirected": true }));
    v.w.stop();
    assert!(
        decoy.join(".s.PGSQL.5432").exists(),
        "warden removed the decoy"
    );
}
