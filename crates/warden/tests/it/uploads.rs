//! Hostile uploads, sent to the API as raw archives: what a pusher may not make warden do while
//! it unpacks and reads a tree (leave it, read the node's files, spin on a name). Each gets a
//! clear 400, nothing is released, and no upload is left behind.

use warden_test_support::{http, Launch, Warden};

use crate::BIN;

/// A gzip'd tar built by `build`.
fn gzip_tar(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    build(&mut b);
    let tar = b.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar).unwrap();
    gz.finish().unwrap()
}

fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, body: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_size(body.len() as u64);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, path, body).unwrap();
}

fn link(b: &mut tar::Builder<Vec<u8>>, path: &str, target: &str) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, path, target).unwrap();
}

/// POSTs `archive` as a push of app `app`.
fn post(w: &Warden, app: &str, archive: &[u8]) -> http::Response {
    http::request(
        "POST",
        &format!("{}/v1/apps/{app}/releases", w.api),
        &[("authorization", &format!("Bearer {}", w.token))],
        archive,
    )
}

/// Asserts that nothing of `app` was released and no upload or scratch tree is left.
fn nothing_left(w: &Warden, app: &str) {
    let r = w.api("GET", &format!("/v1/apps/{app}/releases"), None);
    assert!(
        r.status == 404 || r.json().as_array().is_some_and(Vec::is_empty),
        "{}",
        r.text()
    );
    let uploads = std::fs::read_dir(w.dir.join("uploads"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(uploads, 0, "an upload was left behind");
    let scratch = std::fs::read_dir(w.dir.join("slugs"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(".unpack-"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(scratch, 0, "an unpacked tree was left behind");
}

#[test]
fn chained_symlinks_never_lead_out_of_a_pushed_tree() {
    let w = Launch::new(BIN).start();
    // A Procfile outside the tree, on the node: the release must never run its command.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(
        outside.path().join("Procfile"),
        "web: python3 -m http.server $PORT\n",
    )
    .unwrap();
    // `b/c -> ..` is the root; each `b/c/` counts as two steps down as text but is none, so
    // the `..`s after them climb past the root to `/` while the text stays inside.
    let up = format!("{}{}", "b/c/".repeat(20), "../".repeat(40));
    for target in [
        format!("{up}{}", outside.path().join("Procfile").display()),
        format!("{up}dev/zero"),
    ] {
        let target = target.replace("//", "/");
        let archive = gzip_tar(|b| {
            file(b, "b/keep", b"x");
            file(b, "index.html", b"<p>hi");
            link(b, "b/c", "..");
            link(b, "Procfile", &target);
        });
        let r = post(&w, "chain", &archive);
        assert_eq!(r.status, 400, "{target}: {}", r.text());
        assert!(r.text().contains("leads outside"), "{}", r.text());
        nothing_left(&w, "chain");
    }
}

#[test]
fn overlong_names_are_refused_at_once_and_leave_nothing() {
    let mut w = Launch::new(BIN).start();
    // An 8 MiB name in a GNU long-name entry: a small upload, and a path check quadratic in
    // its length would spin for good.
    let huge = "a/".repeat(4 << 20);
    let deep = "d/".repeat(300) + "f";
    let wide = "n".repeat(300);
    let cases = [
        (
            gzip_tar(|b| file(b, &huge, b"x")),
            "longer than the 4096 bytes",
        ),
        (gzip_tar(|b| file(b, &deep, b"x")), "deeper than the 256"),
        (
            gzip_tar(|b| file(b, &wide, b"x")),
            "name longer than 255 bytes",
        ),
        (
            gzip_tar(|b| link(b, "l", &"x/".repeat(2100))),
            "longer than the 4096 bytes",
        ),
    ];
    for (archive, want) in cases {
        let r = post(&w, "long", &archive);
        assert_eq!(r.status, 400, "{want}: {}", r.text());
        assert!(r.text().contains(want), "{want}: {}", r.text());
        nothing_left(&w, "long");
    }
    assert!(w.stop().success());
}
