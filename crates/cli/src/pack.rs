//! Packing an app's source for `warden push`: the files of a directory that `.gitignore` and
//! `.wardenignore` do not exclude (and never `.git`), as a gzip'd tar whose bytes depend only
//! on the files' paths, contents, executable bits and symlink targets. The same tree makes the
//! same archive, so the API builds it once.

use std::path::Path;

use anyhow::{bail, Context};

/// The archive of `dir`, and how many entries it holds.
pub(crate) fn pack(dir: &Path) -> anyhow::Result<(Vec<u8>, usize)> {
    use std::os::unix::fs::PermissionsExt;
    if !dir.is_dir() {
        bail!(
            "{} is not a directory; give the directory of the app's source",
            dir.display()
        );
    }
    let walk = ignore::WalkBuilder::new(dir)
        .hidden(false)
        .git_ignore(true)
        .git_global(false)
        .git_exclude(false)
        .require_git(false)
        .parents(false)
        .add_custom_ignore_filename(".wardenignore")
        .filter_entry(|e| e.file_name() != ".git")
        .build();
    let mut paths = Vec::new();
    for entry in walk {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        let ft = entry.file_type();
        if ft.is_some_and(|t| t.is_file() || t.is_symlink()) {
            paths.push(entry.into_path());
        }
    }
    paths.sort();
    if paths.is_empty() {
        bail!(
            "{} holds no files to push (after .gitignore and .wardenignore)",
            dir.display()
        );
    }
    let gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    tar.mode(tar::HeaderMode::Deterministic);
    for path in &paths {
        let rel = path.strip_prefix(dir).unwrap_or(path);
        let meta = std::fs::symlink_metadata(path)
            .with_context(|| format!("reading {}", path.display()))?;
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(path)?;
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_mode(0o777);
            h.set_size(0);
            tar.append_link(&mut h, rel, &target)
                .with_context(|| format!("packing {}", path.display()))?;
        } else {
            let exec = meta.permissions().mode() & 0o111 != 0;
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(if exec { 0o755 } else { 0o644 });
            h.set_size(meta.len());
            let file =
                std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
            tar.append_data(&mut h, rel, file)
                .with_context(|| format!("packing {}", path.display()))?;
        }
    }
    let gz = tar.into_inner().context("finishing the archive")?;
    let bytes = gz.finish().context("finishing the archive")?;
    Ok((bytes, paths.len()))
}

#[cfg(test)]
mod tests {
    use super::pack;

    #[test]
    fn same_tree_same_bytes_and_ignores_honoured() {
        let make = || {
            let d = tempfile::tempdir().expect("dir");
            std::fs::write(d.path().join("app.py"), "x").expect("write");
            std::fs::write(d.path().join(".gitignore"), "*.log\n").expect("write");
            std::fs::write(d.path().join(".wardenignore"), "secret.txt\n").expect("write");
            std::fs::write(d.path().join("debug.log"), "noise").expect("write");
            std::fs::write(d.path().join("secret.txt"), "s").expect("write");
            std::fs::create_dir(d.path().join(".git")).expect("git");
            std::fs::write(d.path().join(".git/HEAD"), "ref").expect("write");
            d
        };
        let (a, b) = (make(), make());
        let (pa, n) = pack(a.path()).expect("pack");
        assert_eq!(
            pa,
            pack(b.path()).expect("pack").0,
            "the same tree packs to the same bytes"
        );
        let mut names: Vec<String> = tar::Archive::new(flate2::read::GzDecoder::new(&pa[..]))
            .entries()
            .expect("entries")
            .map(|e| {
                e.expect("entry")
                    .path()
                    .expect("path")
                    .display()
                    .to_string()
            })
            .collect();
        names.sort();
        assert_eq!(names, [".gitignore", ".wardenignore", "app.py"]);
        assert_eq!(n, 3);
    }
}
