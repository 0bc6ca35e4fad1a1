//! A push whose app already serves starts its build from the dependencies the serving release
//! installed (issue 38's build cache): the same requirements install nothing and ask no
//! registry; changed ones install only what changed; another app never starts from them.

use crate::deploy::{answer, fixture, push_ok};
use warden_test_support::Warden;

const BIN: &str = env!("CARGO_BIN_EXE_warden");

#[test]
fn a_rebuild_starts_from_the_serving_release_s_dependencies() {
    let w = Warden::demo(BIN);
    let src = fixture("flask");
    let cold = push_ok(&w, "shop", src.path());
    assert!(cold.contains("Successfully installed"), "{cold}");

    // One line of code changed: nothing is installed, and pip never runs (so no registry is
    // asked: the build works while one is unreachable).
    std::fs::write(src.path().join("answer.txt"), "hello again\n").unwrap();
    let warm = push_ok(&w, "shop", src.path());
    assert!(
        warm.contains("nothing to install")
            && !warm.contains("Collecting")
            && !warm.contains("Successfully installed")
            && !warm.contains("Requirement already satisfied"),
        "{warm}"
    );
    assert_eq!(answer(&w, "alice", "shop")["answer"], "hello again");

    // Another app pushing the same code builds from nothing: shop's serving release is not
    // its own.
    let other = fixture("flask");
    std::fs::write(other.path().join("answer.txt"), "another app\n").unwrap();
    let theirs = push_ok(&w, "other", other.path());
    assert!(
        theirs.contains("Successfully installed") && !theirs.contains("nothing to install"),
        "{theirs}"
    );

    // A requirement added: what was installed stays, only the new one is.
    let mut req = std::fs::read_to_string(src.path().join("requirements.txt")).unwrap();
    req.push_str("six==1.17.0\n");
    std::fs::write(src.path().join("requirements.txt"), req).unwrap();
    let changed = push_ok(&w, "shop", src.path());
    assert!(
        changed.contains("installing what changed")
            && changed.contains("Requirement already satisfied: flask")
            && changed.contains("Successfully installed six"),
        "{changed}"
    );
    assert_eq!(answer(&w, "alice", "shop")["answer"], "hello again");
}

#[test]
fn a_node_rebuild_with_the_same_lock_file_installs_nothing() {
    let w = Warden::demo(BIN);
    let src = fixture("express");
    let cold = push_ok(&w, "api", src.path());
    assert!(cold.contains("building a node app"), "{cold}");
    let server = src.path().join("server.js");
    let code = std::fs::read_to_string(&server).unwrap();
    std::fs::write(&server, code.replace("hello from express", "hello again")).unwrap();
    let warm = push_ok(&w, "api", src.path());
    assert!(
        warm.contains("nothing to install") && !warm.contains("added "),
        "{warm}"
    );
    assert_eq!(answer(&w, "bob", "api")["answer"], "hello again");
}
