//! Unpacking a pushed archive: a gzip'd tar of regular files, directories and relative symlinks
//! that stay inside it; nothing else, and within bounds. Anything else is refused with what it
//! was, before a build runs.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::fcntl::OFlag;
use warden_core::builds::BuildError;

use super::beneath::{BeneathError, Links, Root};

/// Decompressed bytes allowed beyond the content itself: headers and padding.
const HEADER_SLACK: u64 = 64 << 20;

/// Longest path an entry or a link target may have, in bytes (Linux's `PATH_MAX`).
pub(crate) const MAX_PATH: usize = 4096;
/// Longest component of a path, in bytes (Linux's `NAME_MAX`).
pub(crate) const MAX_NAME: usize = 255;
/// Most components of a path.
pub(crate) const MAX_DEPTH: usize = 256;
/// Largest pax extension header: a path, a link target and some attributes.
const MAX_PAX: u64 = 64 << 10;

/// A reader that fails once it has given `left` bytes, or once its work is called off.
struct Capped<'a, R> {
    inner: R,
    left: u64,
    cancel: &'a AtomicBool,
}

impl<R: std::io::Read> std::io::Read for Capped<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(std::io::Error::other("the push was called off"));
        }
        if self.left == 0 {
            return Err(std::io::Error::other(
                "the archive unpacks to more than this node takes",
            ));
        }
        let max = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..max])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// Most entries one archive may hold.
pub(crate) const MAX_ENTRIES: u64 = 200_000;

fn bad(msg: impl Into<String>) -> BuildError {
    BuildError::BadArchive(msg.into())
}

/// Refuses a path past [`MAX_PATH`] bytes, a component past [`MAX_NAME`] or more than
/// [`MAX_DEPTH`] components: every later step is then bounded work.
fn bounded(what: &str, path: &Path) -> Result<(), BuildError> {
    use std::os::unix::ffi::OsStrExt;
    let len = path.as_os_str().as_bytes().len();
    if len > MAX_PATH {
        return Err(bad(format!(
            "{what} is {len} bytes long, longer than the {MAX_PATH} bytes a path may have"
        )));
    }
    let mut depth = 0;
    for c in path.components() {
        depth += 1;
        if c.as_os_str().as_bytes().len() > MAX_NAME {
            return Err(bad(format!(
                "{what} has a name longer than {MAX_NAME} bytes: {}…",
                String::from_utf8_lossy(&c.as_os_str().as_bytes()[..32])
            )));
        }
    }
    if depth > MAX_DEPTH {
        return Err(bad(format!(
            "{what} is {depth} directories deep, deeper than the {MAX_DEPTH} an archive may go"
        )));
    }
    Ok(())
}

/// Reads the archive's headers alone, before anything is unpacked, refusing long-name and pax
/// headers too large for a path: the tar reader holds each whole in memory.
fn check_headers(archive: &Path, cap: u64, cancel: &AtomicBool) -> Result<(), BuildError> {
    let mut tar = open(archive, cap, cancel)?;
    let entries = tar
        .entries()
        .map_err(|e| bad(format!("the upload is not a gzip'd tar archive: {e}")))?
        .raw(true);
    for (n, entry) in entries.enumerate() {
        let entry = entry.map_err(unreadable)?;
        if n as u64 > 3 * MAX_ENTRIES {
            return Err(too_many());
        }
        let kind = entry.header().entry_type();
        let limit = if kind.is_gnu_longname() || kind.is_gnu_longlink() {
            MAX_PATH as u64 + 1
        } else if kind.is_pax_local_extensions() || kind.is_pax_global_extensions() {
            MAX_PAX
        } else {
            continue;
        };
        if entry.size() > limit {
            return Err(bad(format!(
                "an entry's name or extended header is {} bytes long, longer than the {MAX_PATH} bytes a path may have",
                entry.size()
            )));
        }
    }
    Ok(())
}

type Reader<'a> = Capped<'a, flate2::read::GzDecoder<std::io::BufReader<std::fs::File>>>;

fn open<'a>(
    archive: &Path,
    cap: u64,
    cancel: &'a AtomicBool,
) -> Result<tar::Archive<Reader<'a>>, BuildError> {
    let file = std::fs::File::open(archive)
        .map_err(|e| BuildError::Node(format!("cannot open the upload: {e}")))?;
    let inflated = flate2::read::GzDecoder::new(std::io::BufReader::new(file));
    Ok(tar::Archive::new(Capped {
        inner: inflated,
        left: cap,
        cancel,
    }))
}

fn unreadable(e: std::io::Error) -> BuildError {
    bad(format!(
        "the upload is not a readable gzip'd tar archive ({e}); make it with `warden push` or `tar -czf`"
    ))
}

fn too_many() -> BuildError {
    bad(format!(
        "the archive holds more than {MAX_ENTRIES} entries; leave out what the app does not need (.wardenignore)"
    ))
}

/// `path` made of normal components only (no root, no `..`), or `None`.
fn relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(out)
}

/// Whether a symlink at `at` (relative to the archive's root) pointing at `target` stays
/// inside the archive.
fn link_stays_inside(at: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let mut depth: i64 = at.components().count() as i64 - 1;
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::CurDir => {}
            _ => return false,
        }
    }
    true
}

/// Unpacks `archive` into `into` (which must exist), refusing entries that are not plain files,
/// directories or inner symlinks, paths that leave it, more than [`MAX_ENTRIES`] entries or
/// more than `max_bytes` of content. Files get mode 0755 when any execute bit was set, else
/// 0644; directories 0755. A `built` slug (checked against its digest before) may hold
/// symlinks anywhere, such as a virtual environment's `python` to the system's.
/// Stops early, refused, once `cancel` is set (the push was called off).
pub(crate) fn unpack(
    archive: &Path,
    into: &Path,
    max_bytes: u64,
    built: bool,
    cancel: &AtomicBool,
) -> Result<u64, BuildError> {
    use std::os::unix::fs::PermissionsExt;
    // Everything decompressed counts, headers included: a small upload must not become
    // gigabytes in memory (long-name headers are read whole) or on disk.
    let cap = max_bytes.saturating_add(HEADER_SLACK);
    check_headers(archive, cap, cancel)?;
    let mut tar = open(archive, cap, cancel)?;
    tar.set_overwrite(true);
    tar.set_preserve_permissions(false);
    tar.set_unpack_xattrs(false);
    let entries = tar
        .entries()
        .map_err(|e| bad(format!("the upload is not a gzip'd tar archive: {e}")))?;
    let root = Root::open(into)
        .map_err(|e| BuildError::Node(format!("cannot open the directory to unpack into: {e}")))?;
    let (mut count, mut total) = (0u64, 0u64);
    let mut links = Vec::new();
    for entry in entries {
        let mut entry = entry.map_err(unreadable)?;
        count += 1;
        if count > MAX_ENTRIES {
            return Err(too_many());
        }
        let raw = entry
            .path()
            .map_err(|e| bad(format!("an entry's path is unreadable: {e}")))?
            .into_owned();
        bounded("an entry's path", &raw)?;
        let Some(rel) = relative(&raw) else {
            return Err(bad(format!(
                "entry {} climbs out of the archive (a path starting at / or going up with ..); an archive's paths stay inside it",
                raw.display()
            )));
        };
        if rel.as_os_str().is_empty() {
            continue;
        }
        let kind = entry.header().entry_type();
        let mode = entry.header().mode().unwrap_or(0o644);
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                total = total.saturating_add(entry.size());
                if total > max_bytes {
                    return Err(bad(format!(
                        "the archive unpacks to more than {max_bytes} bytes; leave out what the app does not need (.wardenignore)"
                    )));
                }
            }
            tar::EntryType::Directory => {}
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .ok()
                    .flatten()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                bounded(&format!("the target of symlink {}", rel.display()), &target)?;
                if !built && !link_stays_inside(&rel, &target) {
                    return Err(bad(format!(
                        "symlink {} points outside the archive ({}); a slug holds only its own files",
                        rel.display(),
                        target.display()
                    )));
                }
                links.push(rel.clone());
            }
            other => {
                return Err(bad(format!(
                    "entry {} is a {other:?}; an archive may hold only files, directories and symlinks inside it",
                    rel.display()
                )))
            }
        }
        // No entry may be written through a symlink an earlier entry made: `d -> .` and then
        // `d/d/x -> ../../etc` would put a link out of the tree at its top. The kernel walks
        // the parent beneath the root, refusing any symlink on the way.
        if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
            match root.open_at(parent, OFlag::O_PATH | OFlag::O_DIRECTORY, Links::Refuse) {
                Err(BeneathError::Outside(_)) => {
                    return Err(bad(format!(
                        "entry {} has a parent outside the archive",
                        rel.display(),
                    )))
                }
                Err(BeneathError::Symlink(_)) => {
                    return Err(bad(format!(
                        "entry {} lies under a symlink; an archive may not write through its own links",
                        rel.display(),
                    )))
                }
                Err(BeneathError::Io { source, .. })
                    if source.raw_os_error() == Some(libc::ENOTDIR) =>
                {
                    return Err(bad(format!(
                        "entry {} lies under a file; an archive's paths must go through directories",
                        rel.display(),
                    )))
                }
                Ok(_) | Err(_) => {}
            }
        }
        let ok = entry
            .unpack_in(into)
            .map_err(|e| bad(format!("cannot unpack {}: {e}", rel.display())))?;
        if !ok {
            return Err(bad(format!(
                "the tar reader refused to unpack entry {}",
                rel.display()
            )));
        }
        let at = into.join(&rel);
        let perm = match kind {
            tar::EntryType::Directory => Some(0o755),
            tar::EntryType::Symlink => None,
            _ if mode & 0o111 != 0 => Some(0o755),
            _ => Some(0o644),
        };
        if let Some(p) = perm {
            std::fs::set_permissions(&at, std::fs::Permissions::from_mode(p)).map_err(|e| {
                BuildError::Node(format!("cannot set the mode of {}: {e}", at.display()))
            })?;
        }
    }
    if count == 0 {
        return Err(bad("the archive is empty"));
    }
    if !built {
        // Each link looked inside as text; chained (`b/c -> ..`, then `a -> b/c/..`) they
        // may not. The kernel follows every one of them beneath the root.
        for rel in &links {
            match root.resolves_beneath(rel) {
                Ok(()) => {}
                Err(BeneathError::Outside(_)) => {
                    return Err(bad(format!(
                        "symlink {} leads outside the archive through other links; a slug holds only its own files",
                        rel.display()
                    )))
                }
                Err(e) => {
                    return Err(bad(format!(
                        "symlink {} cannot be followed ({e}); leave out links that loop",
                        rel.display()
                    )))
                }
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> tempfile::NamedTempFile {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        let tar = b.into_inner().expect("tar");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &tar).expect("gzip");
        let f = tempfile::NamedTempFile::new().expect("temp");
        std::fs::write(f.path(), gz.finish().expect("gzip")).expect("write");
        f
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, body: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        // Written raw: `append_data` refuses `..` itself, and the point is to see that unpack
        // refuses it too.
        let name = path.as_bytes();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_cksum();
        b.append(&h, body).expect("append");
    }

    /// A GNU long-name entry naming the regular file after it.
    fn gnu_long_name(b: &mut tar::Builder<Vec<u8>>, name: &str) {
        let mut h = tar::Header::new_gnu();
        h.as_gnu_mut().expect("gnu").name[..13].copy_from_slice(b"././@LongLink");
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_size(name.len() as u64 + 1);
        h.set_cksum();
        b.append(&h, format!("{name}\0").as_bytes())
            .expect("long name");
        file(b, "short", b"x");
    }

    fn link(b: &mut tar::Builder<Vec<u8>>, path: &str, target: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, path, target).expect("link");
    }

    #[test]
    fn warden_s_own_path_check_refuses_every_way_out() {
        for out in ["..", "../x", "a/../../x", "a/..", "/etc/passwd", "/"] {
            assert_eq!(relative(Path::new(out)), None, "{out}");
        }
        assert_eq!(relative(Path::new("./a/./b")), Some(PathBuf::from("a/b")));
    }

    #[test]
    fn unpacks_files_and_inner_links() {
        let a = archive(|b| {
            file(b, "app/main.py", b"print(1)");
            link(b, "app/alias.py", "main.py");
        });
        let dir = tempfile::tempdir().expect("dir");
        assert_eq!(
            unpack(
                a.path(),
                dir.path(),
                1 << 20,
                false,
                &AtomicBool::new(false)
            )
            .expect("unpack"),
            8
        );
        assert_eq!(
            std::fs::read(dir.path().join("app/alias.py")).expect("read"),
            b"print(1)"
        );
    }

    #[test]
    fn refuses_escapes_devices_and_bombs() {
        let dir = tempfile::tempdir().expect("dir");
        let cases: Vec<(tempfile::NamedTempFile, &str)> = vec![
            (
                archive(|b| file(b, "../evil", b"x")),
                "climbs out of the archive",
            ),
            (
                archive(|b| file(b, "a/../../evil", b"x")),
                "climbs out of the archive",
            ),
            (
                archive(|b| file(b, "/etc/evil", b"x")),
                "climbs out of the archive",
            ),
            (archive(|b| link(b, "etc", "/etc")), "points outside"),
            (archive(|b| link(b, "a/up", "../../x")), "points outside"),
            (
                archive(|b| {
                    link(b, "d", ".");
                    link(b, "d/d/out", "../../x");
                }),
                "lies under a symlink",
            ),
            (
                archive(|b| {
                    file(b, "b/keep", b"x");
                    link(b, "b/c", "..");
                    link(b, "a", "b/c/..");
                }),
                "leads outside the archive through other links",
            ),
            (
                archive(|b| {
                    let mut h = tar::Header::new_gnu();
                    h.set_entry_type(tar::EntryType::Char);
                    h.set_size(0);
                    b.append_data(&mut h, "null", std::io::empty())
                        .expect("dev");
                }),
                "may hold only",
            ),
            (
                archive(|b| file(b, "big", &[0u8; 4096])),
                "more than 1000 bytes",
            ),
            (archive(|_| {}), "empty"),
            (
                archive(|b| gnu_long_name(b, &"a/".repeat(3000))),
                "longer than the 4096 bytes",
            ),
            (
                archive(|b| gnu_long_name(b, &("d/".repeat(300) + "f"))),
                "deeper than the 256",
            ),
        ];
        for (a, want) in cases {
            let err = unpack(a.path(), dir.path(), 1000, false, &AtomicBool::new(false))
                .expect_err(want)
                .to_string();
            assert!(err.contains(want), "{err:?} should say {want:?}");
        }
        let not_gzip = tempfile::NamedTempFile::new().expect("temp");
        std::fs::write(not_gzip.path(), b"hello").expect("write");
        let err = unpack(
            not_gzip.path(),
            dir.path(),
            1000,
            false,
            &AtomicBool::new(false),
        )
        .expect_err("not gzip");
        assert!(matches!(err, BuildError::BadArchive(_)), "{err}");
        assert!(!dir.path().parent().expect("parent").join("evil").exists());
    }
}
