//! The Debian package `packaging/deb.sh` builds (issue 38): what it installs, and that the
//! warden it installs runs the demo from where the package puts it, with the package's config.

use std::path::Path;
use std::process::Command;

use warden_test_support::Launch;

const BIN: &str = env!("CARGO_BIN_EXE_warden");

fn dpkg_deb(args: &[&str]) -> String {
    let out = Command::new("dpkg-deb").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "dpkg-deb {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_debian_package_installs_a_warden_that_runs_with_its_config_and_unit() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bin_dir = Path::new(BIN).parent().unwrap();
    let out = tempfile::tempdir().unwrap();
    let built = Command::new("bash")
        .arg(repo.join("packaging/deb.sh"))
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--out")
        .arg(out.path())
        .args(["--compress", "none"])
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let deb = String::from_utf8_lossy(&built.stdout).trim().to_owned();
    assert!(deb.ends_with(".deb"), "{deb}");

    let fields = dpkg_deb(&["-f", &deb, "Package", "Version", "Depends"]);
    assert!(
        fields.contains("Package: warden")
            && fields.contains(&format!("Version: {}", env!("CARGO_PKG_VERSION")))
            && fields.contains("Depends: util-linux"),
        "{fields}"
    );
    let listed = dpkg_deb(&["-c", &deb]);
    for path in [
        "./usr/bin/warden",
        "./usr/bin/warden-instance",
        "./lib/systemd/system/warden.service",
        "./etc/warden/warden.toml",
        "./usr/share/doc/warden/README.md",
    ] {
        assert!(listed.contains(path), "{path} missing:\n{listed}");
    }
    // Files are root's, whoever built the package.
    let warden_line = listed
        .lines()
        .find(|l| l.ends_with("./usr/bin/warden"))
        .unwrap();
    assert!(warden_line.contains("root/root"), "{warden_line}");

    // Unpacked where a machine would have it, the package's warden runs the demo with the
    // package's config, its instance image found beside it.
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        root.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    dpkg_deb(&["-x", &deb, root.path().to_str().unwrap()]);
    let conffiles = dpkg_deb(&["-I", &deb, "conffiles"]);
    assert_eq!(conffiles.trim(), "/etc/warden/warden.toml");
    let config = root.path().join("etc/warden/warden.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("data_dir = \"/var/lib/warden\""), "{text}");
    let unit =
        std::fs::read_to_string(root.path().join("lib/systemd/system/warden.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/warden up --config /etc/warden/warden.toml")
            && unit.contains("StateDirectory=warden"),
        "{unit}"
    );
    let w = Launch::new(root.path().join("usr/bin/warden"))
        .arg("--config")
        .arg(config.to_str().unwrap())
        .start();
    let alice = w.password("alice");
    let r = w.get_as("alice", &alice, "/apps/demo/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["label"], "SECRET");
}
