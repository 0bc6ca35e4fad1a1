//! Names of apps, users, groups and nodes: what characters they may hold.
//!
//! Names become store key tokens and URL path segments, so they must never contain `/`, spaces or
//! anything that needs escaping.

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name is empty.
    #[error("{kind} name is empty; use 1 to 63 characters from a-z, 0-9, '-' and '_'")]
    Empty {
        /// What was being named (app, user, ...).
        kind: &'static str,
    },
    /// The name is too long.
    #[error("{kind} name is {len} characters long; the limit is 63")]
    TooLong {
        /// What was being named.
        kind: &'static str,
        /// Its length.
        len: usize,
    },
    /// The name holds a character outside the allowed set.
    #[error("{kind} name {name:?} contains {bad:?}; use only a-z, 0-9, '-' and '_', starting with a letter or digit")]
    BadChar {
        /// What was being named.
        kind: &'static str,
        /// The offending name.
        name: String,
        /// The first offending character.
        bad: char,
    },
}

/// Checks that `name` is 1..=63 characters of `[a-z0-9_-]`, not starting with `-` or `_`.
pub fn validate_name(kind: &'static str, name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { kind });
    }
    if name.len() > 63 {
        return Err(NameError::TooLong {
            kind,
            len: name.len(),
        });
    }
    for (i, c) in name.chars().enumerate() {
        let ok = c.is_ascii_lowercase() || c.is_ascii_digit() || (i > 0 && (c == '-' || c == '_'));
        if !ok {
            return Err(NameError::BadChar {
                kind,
                name: name.to_owned(),
                bad: c,
            });
        }
    }
    Ok(())
}

/// What joins an app's name and one of its process types in the name of the type's derived
/// spec (`demo~worker`): a character [`validate_name`] never accepts, so no app a user names
/// can be taken for a process type, or collide with one.
pub const PROCESS_SEP: char = '~';

/// Longest process type name (a Procfile line's name).
pub const MAX_PROCESS_TYPE: usize = 32;

/// Checks a Procfile process type name: `[a-z][a-z0-9_-]{0,31}`.
pub fn validate_process_type(kind: &str) -> Result<(), String> {
    let mut chars = kind.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase());
    let rest_ok =
        chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if first_ok && rest_ok && kind.len() <= MAX_PROCESS_TYPE {
        Ok(())
    } else {
        Err(format!(
            "process type {kind:?} must be 1 to {MAX_PROCESS_TYPE} characters from a-z, 0-9, '-' and '_', starting with a letter"
        ))
    }
}

/// The name of the spec that runs process type `kind` of app `app`.
pub fn process_app(app: &str, kind: &str) -> String {
    format!("{app}{PROCESS_SEP}{kind}")
}

/// The app and process type a derived spec's name joins; `None` for an app's own name.
pub fn split_process_app(name: &str) -> Option<(&str, &str)> {
    name.split_once(PROCESS_SEP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names_and_refuses_the_rest() {
        assert!(validate_name("app", "demo").is_ok());
        assert!(validate_name("app", "web-2_x").is_ok());
        // A derived spec's name is never an app's.
        assert!(validate_name("app", &process_app("demo", "worker")).is_err());
        assert_eq!(
            split_process_app(&process_app("demo", "worker")),
            Some(("demo", "worker"))
        );
        assert!(validate_process_type("worker_2").is_ok());
        for bad in ["", "2w", "Worker", "w.x", &"w".repeat(33)] {
            assert!(validate_process_type(bad).is_err(), "{bad}");
        }
        assert!(matches!(
            validate_name("app", ""),
            Err(NameError::Empty { .. })
        ));
        assert!(matches!(
            validate_name("app", "a/b"),
            Err(NameError::BadChar { bad: '/', .. })
        ));
        assert!(matches!(
            validate_name("app", "-x"),
            Err(NameError::BadChar { .. })
        ));
        assert!(matches!(
            validate_name("app", "Web"),
            Err(NameError::BadChar { .. })
        ));
        assert!(matches!(
            validate_name("app", &"a".repeat(64)),
            Err(NameError::TooLong { .. })
        ));
    }
}
