//! `app.toml` at the root of a pushed tree: what the app asks of warden beyond its code, kept
//! with the code so that a push says it. One key today, `data = true|false`: whether the app
//! has a database (as `warden apps create --data`). Anything else (an unknown key, a value of
//! the wrong type, a file past 4 KiB) refuses the push, naming what to fix.

use std::path::Path;

use warden_core::builds::BuildError;

use super::beneath::{BeneathError, Root};

/// The file's name, at the tree's root.
pub(crate) const FILE: &str = "app.toml";
/// Most bytes of it read.
const MAX: u64 = 4096;

/// What a tree's `app.toml` asks; all `None` when it has none.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct AppToml {
    /// `data`: whether the app has a database.
    pub data: Option<bool>,
}

fn refused(msg: impl std::fmt::Display) -> BuildError {
    BuildError::Detect(format!("{FILE}: {msg}"))
}

/// Reads the `app.toml` of the tree at `dir`, opened beneath its root.
pub(crate) fn read(dir: &Path) -> Result<AppToml, BuildError> {
    let root = Root::open(dir)
        .map_err(|e| BuildError::Node(format!("cannot open the unpacked tree: {e}")))?;
    let bytes = match root.read(FILE, MAX) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(AppToml::default()),
        Err(BeneathError::TooLarge { .. }) => {
            return Err(refused(format!(
                "it is larger than {MAX} bytes; it holds only `data = true` or `data = false`"
            )))
        }
        Err(e) => return Err(refused(e)),
    };
    let text = String::from_utf8(bytes).map_err(|_| refused("it is not UTF-8 text"))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| refused(format!("it is not TOML: {e}")))?;
    let mut asked = AppToml::default();
    for (key, value) in table {
        match (key.as_str(), value) {
            ("data", toml::Value::Boolean(b)) => asked.data = Some(b),
            ("data", other) => {
                return Err(refused(format!(
                    "key `data` must be true or false, not a {}",
                    other.type_str()
                )))
            }
            _ => {
                return Err(refused(format!(
                    "unknown key `{key}`; the only key is `data` (true or false)"
                )))
            }
        }
    }
    Ok(asked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_text(text: &str) -> Result<AppToml, BuildError> {
        let d = tempfile::tempdir().expect("dir");
        std::fs::write(d.path().join(FILE), text).expect("write");
        read(d.path())
    }

    #[test]
    fn data_is_the_one_key_and_every_mistake_is_named() {
        assert_eq!(read_text("data = true\n").expect("true").data, Some(true));
        assert_eq!(read_text("data = false").expect("false").data, Some(false));
        assert_eq!(read_text("# nothing\n").expect("empty").data, None);
        let none = tempfile::tempdir().expect("dir");
        assert_eq!(read(none.path()).expect("absent"), AppToml::default());
        for (text, want) in [
            ("data = true\ndatabase = true\n", "unknown key `database`"),
            (
                "data = \"yes\"\n",
                "key `data` must be true or false, not a string",
            ),
            (
                "[data]\nx = 1\n",
                "key `data` must be true or false, not a table",
            ),
            ("data = \n", "not TOML"),
        ] {
            let err = read_text(text).expect_err(text).to_string();
            assert!(err.contains(want), "{text:?}: {err}");
            assert!(err.starts_with("app.toml: "), "{err}");
        }
        let big = format!("data = true\n{}", "#".repeat(5000));
        let err = read_text(&big).expect_err("big").to_string();
        assert!(err.contains("larger than 4096 bytes"), "{err}");
    }
}
