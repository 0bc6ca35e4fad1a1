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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names_and_refuses_the_rest() {
        assert!(validate_name("app", "demo").is_ok());
        assert!(validate_name("app", "web-2_x").is_ok());
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
