//! The private server's log file, opened safely by root in a directory the server's user owns.

use std::path::Path;

use nix::unistd::Uid;

/// Opens the server's log for appending, as warden (root, when the server runs as `uid`): the
/// log is in a directory the server's user owns, so that user could put a symlink, a hard link
/// or a FIFO at its path and have root append to (and the postmaster write into) a file of
/// root's, or hang the keeper's restart. So: no symlink followed (`O_NOFOLLOW`), no blocking
/// open (`O_NONBLOCK`, a FIFO without a reader fails), and only a regular file of one link
/// owned by warden's uid (it made the file) or the server's is used.
pub(super) fn open_log(path: &Path, uid: u32) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "cannot open the server's log {} ({e}); if it is a symlink, remove it",
                    path.display()
                ),
            )
        })?;
    let meta = log.metadata()?;
    let owner_ok = meta.uid() == uid || meta.uid() == Uid::effective().as_raw();
    if !meta.file_type().is_file() || meta.nlink() != 1 || !owner_ok {
        return Err(std::io::Error::other(format!(
            "the server's log {} is not a plain file of the server's (a link, or owned by uid \
             {}); remove it and start again",
            path.display(),
            meta.uid()
        )));
    }
    Ok(log)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::chown;
    use std::process::Command;

    use super::*;

    /// The log is never opened through a symlink or a second hard link, nor when another
    /// uid owns it: the server's user could point either at a file of root's.
    #[test]
    fn the_log_is_opened_only_as_a_plain_file_of_the_servers() {
        let top = tempfile::tempdir().unwrap();
        let victim = top.path().join("victim");
        std::fs::write(&victim, "root's").unwrap();
        let log = top.path().join("server.log");
        std::os::unix::fs::symlink(&victim, &log).unwrap();
        assert!(open_log(&log, 4_000_123).is_err(), "followed a symlink");
        std::fs::remove_file(&log).unwrap();
        std::fs::hard_link(&victim, &log).unwrap();
        assert!(
            open_log(&log, 4_000_123).is_err(),
            "used a second hard link"
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's");
        std::fs::remove_file(&log).unwrap();
        let fifo = Command::new("mkfifo").arg(&log).status().unwrap();
        assert!(fifo.success());
        assert!(open_log(&log, 4_000_123).is_err(), "opened a FIFO");
        std::fs::remove_file(&log).unwrap();
        open_log(&log, 4_000_123).expect("a new log");
        if Uid::effective().is_root() {
            chown(&log, Some(4_000_124), None).unwrap();
            assert!(
                open_log(&log, 4_000_123).is_err(),
                "used another uid's file"
            );
            open_log(&log, 4_000_124).expect("the server's own log");
        }
    }
}
