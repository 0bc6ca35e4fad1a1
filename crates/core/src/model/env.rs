//! The one rule for an app's environment variables, whichever way they come in (`apps create`,
//! `apps update`, `config set`, a rollback) and again in the agent before it starts anything.
//!
//! A variable is refused, never altered: a value is passed to the instance byte for byte or
//! not at all. Errors name the key and the rule, never the value (values are often secrets).

use std::collections::BTreeMap;

/// Variables warden sets itself for every instance; an app cannot set them.
pub const RESERVED_ENV: &[&str] = &[
    "PORT",
    "WARDEN_APP",
    "WARDEN_DATA_DIR",
    "WARDEN_INSTANCE",
    crate::identity::SECRET_ENV,
    "WARDEN_LABEL",
    "WARDEN_NETWORK_ADDR",
];

/// Longest variable name.
pub const MAX_ENV_NAME: usize = 256;

/// Why an environment variable cannot be set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// The name is not one a shell or `execve` takes as a variable name.
    #[error("environment variable {key:?} is not a usable name: use 1 to {MAX_ENV_NAME} letters, digits and '_', not starting with a digit")]
    BadName {
        /// The key as given.
        key: String,
    },
    /// Warden sets this variable itself.
    #[error("environment variable {key:?} is set by warden for every instance; choose another name (reserved: {})", RESERVED_ENV.join(", "))]
    Reserved {
        /// The key.
        key: String,
    },
    /// The value holds a NUL byte, which no process environment can carry.
    #[error("the value of environment variable {key:?} holds a NUL byte, which an environment cannot carry; remove it")]
    Nul {
        /// The key.
        key: String,
    },
}

/// Checks that `key` may name an app's variable: well formed and not reserved.
pub fn validate_env_name(key: &str) -> Result<(), EnvError> {
    let well_formed = !key.is_empty()
        && key.len() <= MAX_ENV_NAME
        && !key.starts_with(|c: char| c.is_ascii_digit())
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !well_formed {
        return Err(EnvError::BadName { key: key.into() });
    }
    if RESERVED_ENV.contains(&key) {
        return Err(EnvError::Reserved { key: key.into() });
    }
    Ok(())
}

/// Checks one variable: its name (see [`validate_env_name`]) and that its value can be passed.
pub fn validate_env_var(key: &str, value: &str) -> Result<(), EnvError> {
    validate_env_name(key)?;
    if value.contains('\0') {
        return Err(EnvError::Nul { key: key.into() });
    }
    Ok(())
}

/// Checks every variable of `env`; the first refused one is the error.
pub fn validate_env(env: &BTreeMap<String, String>) -> Result<(), EnvError> {
    env.iter().try_for_each(|(k, v)| validate_env_var(k, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_values_and_reserved_keys() {
        for ok in ["A", "_x", "GREETING_2", "WARDEN_DEMO_UNHEALTHY_CHECKS"] {
            assert_eq!(validate_env_var(ok, "v"), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "A=B",
            "1A",
            "A B",
            "A\0",
            "É",
            &"A".repeat(MAX_ENV_NAME + 1),
        ] {
            assert!(
                matches!(validate_env_var(bad, "v"), Err(EnvError::BadName { .. })),
                "{bad:?}"
            );
        }
        for r in RESERVED_ENV {
            assert!(matches!(
                validate_env_var(r, "v"),
                Err(EnvError::Reserved { .. })
            ));
        }
        let err = validate_env_var("TOKEN", "se\0cret").expect_err("NUL");
        assert!(matches!(err, EnvError::Nul { .. }));
        assert!(!err.to_string().contains("cret"), "{err}");
    }
}
