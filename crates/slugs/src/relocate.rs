//! Making a built virtual environment run from wherever the slug is copied: pip writes each
//! script's shebang as the absolute path of the venv's Python, which is another path on
//! another node. Those shebangs become `#!/usr/bin/env python3`; instances of a release find
//! the venv's own `python3` first on their PATH (see [`crate::run_spec`]), so the
//! scripts still run in the venv.

use std::io::{Read, Seek, Write};
use std::path::Path;

use nix::fcntl::OFlag;

use super::beneath::{BeneathError, Links, Root};

/// Largest script whose shebang is rewritten.
const MAX_SCRIPT: u64 = 1 << 20;

/// Rewrites the shebangs under `tree/.venv/bin` that name a Python inside `tree`. Every file is
/// opened beneath the tree with no symlink on its path: a link in the venv is left alone.
pub(crate) fn relocate(tree: &Path) -> std::io::Result<()> {
    let root = Root::open(tree)?;
    let bin = Path::new(".venv/bin");
    match root.open_at(bin, OFlag::O_PATH | OFlag::O_DIRECTORY, Links::Refuse) {
        Ok(_) => {}
        Err(BeneathError::Symlink(_) | BeneathError::Outside(_)) => {
            return Err(std::io::Error::other(format!(
                "{} is a symlink; a virtual environment must be the tree's own",
                tree.join(bin).display()
            )))
        }
        Err(_) => return Ok(()),
    }
    let Ok(entries) = std::fs::read_dir(tree.join(bin)) else {
        return Ok(());
    };
    let prefix = format!("#!{}", tree.display());
    for e in entries {
        let rel = bin.join(e?.file_name());
        // Symlinks, directories and whatever else is not a plain file are not scripts.
        let Ok(mut file) = root.file_with(&rel, OFlag::O_RDWR, Links::Refuse) else {
            continue;
        };
        if file.metadata()?.len() > MAX_SCRIPT {
            continue;
        }
        let mut text = Vec::new();
        (&mut file).take(MAX_SCRIPT).read_to_end(&mut text)?;
        if !text.starts_with(b"#!") {
            continue;
        }
        let end = text.iter().position(|&b| b == b'\n').unwrap_or(text.len());
        let first = String::from_utf8_lossy(&text[..end]);
        if first.starts_with(&prefix) && first.contains("/.venv/bin/python") {
            let mut new = b"#!/usr/bin/env python3".to_vec();
            new.extend_from_slice(&text[end..]);
            file.rewind()?;
            file.write_all(&new)?;
            file.set_len(new.len() as u64)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn rewrites_only_the_venvs_own_shebangs() {
        let t = tempfile::tempdir().expect("dir");
        let bin = t.path().join(".venv/bin");
        std::fs::create_dir_all(&bin).expect("bin");
        let own = format!("#!{}/.venv/bin/python3\nimport x\n", t.path().display());
        std::fs::write(bin.join("gunicorn"), own).expect("write");
        std::fs::write(bin.join("other"), "#!/bin/sh\necho\n").expect("write");
        // A link in the venv to a file outside is not followed, even with the venv's shebang.
        let outside = tempfile::tempdir().expect("dir");
        let theirs = format!("#!{}/.venv/bin/python3\nkeep\n", t.path().display());
        std::fs::write(outside.path().join("theirs"), &theirs).expect("write");
        std::os::unix::fs::symlink(outside.path().join("theirs"), bin.join("linked"))
            .expect("link");
        super::relocate(t.path()).expect("relocate");
        assert_eq!(
            std::fs::read_to_string(outside.path().join("theirs")).expect("read"),
            theirs
        );
        let read = |n: &str| std::fs::read_to_string(bin.join(n)).expect("read");
        assert_eq!(read("gunicorn"), "#!/usr/bin/env python3\nimport x\n");
        assert_eq!(read("other"), "#!/bin/sh\necho\n");
    }
}
