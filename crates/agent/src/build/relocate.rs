//! Making a built virtual environment run from wherever the slug is copied: pip writes each
//! script's shebang as the absolute path of the venv's Python, which is another path on
//! another node. Those shebangs become `#!/usr/bin/env python3`; instances of a release find
//! the venv's own `python3` first on their PATH (see [`super::slugs::run_spec`]), so the
//! scripts still run in the venv.

use std::io::Read;
use std::path::Path;

/// Rewrites the shebangs under `tree/.venv/bin` that name a Python inside `tree`.
pub(crate) fn relocate(tree: &Path) -> std::io::Result<()> {
    let bin = tree.join(".venv/bin");
    for dir in [tree.join(".venv"), bin.clone()] {
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(std::io::Error::other(format!(
                    "{} is a symlink; a virtual environment must be the tree's own",
                    dir.display()
                )))
            }
            Ok(_) => {}
            Err(_) => return Ok(()),
        }
    }
    let Ok(entries) = std::fs::read_dir(&bin) else {
        return Ok(());
    };
    let prefix = format!("#!{}", tree.display());
    for e in entries {
        let path = e?.path();
        let meta = std::fs::symlink_metadata(&path)?;
        if !meta.is_file() || meta.len() > 1 << 20 {
            continue;
        }
        let mut head = [0u8; 2];
        if std::fs::File::open(&path)?.read(&mut head)? < 2 || &head != b"#!" {
            continue;
        }
        let text = std::fs::read(&path)?;
        let end = text.iter().position(|&b| b == b'\n').unwrap_or(text.len());
        let first = String::from_utf8_lossy(&text[..end]);
        if first.starts_with(&prefix) && first.contains("/.venv/bin/python") {
            let mut new = b"#!/usr/bin/env python3".to_vec();
            new.extend_from_slice(&text[end..]);
            std::fs::write(&path, new)?;
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
        super::relocate(t.path()).expect("relocate");
        let read = |n: &str| std::fs::read_to_string(bin.join(n)).expect("read");
        assert_eq!(read("gunicorn"), "#!/usr/bin/env python3\nimport x\n");
        assert_eq!(read("other"), "#!/bin/sh\necho\n");
    }
}
