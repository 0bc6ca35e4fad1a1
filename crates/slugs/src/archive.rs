//! A built slug as one file, for nodes that run its release but did not build it: a gzip'd tar
//! of the slug's home (its mark and its tree), its bytes fixed by its files alone, named in the
//! app's spec by its SHA-256 so that a fetching node checks what it got.

use std::io::{Read, Write};
use std::path::Path;

use super::beneath::{Links, Root};

/// File name of the archive in a slug's home; never inside the archive itself.
pub(crate) const FILE: &str = warden_core::builds::slug_files::ARCHIVE;

/// Packs `home` (all but the archive) into `home/slug.tar.gz`; returns its SHA-256, hex.
pub(crate) fn pack(home: &Path) -> std::io::Result<String> {
    let mut entries = Vec::new();
    collect(home, home, &mut entries)?;
    entries.sort();
    let tmp = home.join(format!(".{FILE}.part"));
    let file = std::fs::File::create(&tmp)?;
    let gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(std::io::BufWriter::new(file), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    tar.mode(tar::HeaderMode::Deterministic);
    tar.follow_symlinks(false);
    let root = Root::open(home)?;
    for rel in &entries {
        if rel.as_os_str() == FILE {
            continue;
        }
        append(&mut tar, &root, home, rel)?;
    }
    let mut w = tar.into_inner()?.finish()?;
    w.flush()?;
    drop(w);
    std::fs::rename(&tmp, home.join(FILE))?;
    sha256_file(&home.join(FILE))
}

/// Appends `rel` as it is: a symlink as a link, never followed; a file read through a
/// descriptor opened beneath `home` with no symlink on its path, at most the size it had.
fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    root: &Root,
    home: &Path,
    rel: &Path,
) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(home.join(rel))?;
    let mut header = tar::Header::new_gnu();
    if meta.file_type().is_symlink() {
        header.set_metadata_in_mode(&meta, tar::HeaderMode::Deterministic);
        let target = std::fs::read_link(home.join(rel))?;
        return tar.append_link(&mut header, rel, target);
    }
    if meta.is_dir() {
        header.set_metadata_in_mode(&meta, tar::HeaderMode::Deterministic);
        return tar.append_data(&mut header, rel, std::io::empty());
    }
    let file = root
        .file(rel, Links::Refuse)
        .map_err(std::io::Error::other)?;
    let meta = file.metadata()?;
    header.set_metadata_in_mode(&meta, tar::HeaderMode::Deterministic);
    let size = meta.len();
    tar.append_data(&mut header, rel, file.take(size))
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let path = e.path();
        let rel = path.strip_prefix(root).unwrap_or(&path).to_owned();
        if rel
            .as_os_str()
            .to_string_lossy()
            .starts_with(&format!(".{FILE}"))
        {
            continue;
        }
        let ft = e.file_type()?;
        if !(ft.is_file() || ft.is_dir() || ft.is_symlink()) {
            return Err(std::io::Error::other(format!(
                "the build left {} that is neither a file, a directory nor a symlink; a slug may hold only those",
                rel.display()
            )));
        }
        out.push(rel);
        if ft.is_dir() {
            collect(root, &path, out)?;
        }
    }
    Ok(())
}

/// SHA-256 of a file, hex.
pub(crate) fn sha256_file(path: &Path) -> std::io::Result<String> {
    use sha2::Digest;
    let mut f = std::fs::File::open(path)?;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
