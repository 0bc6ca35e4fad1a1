//! Whether a value is a sound record for its key: it decodes as the type its key names, and
//! names what its key names (a user record at `users/alice` is alice's). For checking records
//! that come from outside the store, as a backup's do, before any is written.

use serde::de::DeserializeOwned;

use super::{AppHealth, AppSpec, DrainOrder, Placement, Release, UserRecord};
use crate::keys;

/// Why a value is not a sound record for its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The value does not decode as the record its key names.
    #[error("it does not decode as {what}: {reason}")]
    Undecodable {
        /// The record type.
        what: &'static str,
        /// The decoder's message.
        reason: String,
    },
    /// The record names something other than its key does.
    #[error("it names {field} {found:?}, but its key names {expected:?}")]
    Mismatch {
        /// The field compared.
        field: &'static str,
        /// What the key names.
        expected: String,
        /// What the record names.
        found: String,
    },
}

fn decode<T: DeserializeOwned>(what: &'static str, value: &[u8]) -> Result<T, RecordError> {
    serde_json::from_slice(value).map_err(|e| RecordError::Undecodable {
        what,
        reason: e.to_string(),
    })
}

fn same(field: &'static str, expected: &str, found: &str) -> Result<(), RecordError> {
    match expected == found {
        true => Ok(()),
        false => Err(RecordError::Mismatch {
            field,
            expected: expected.to_owned(),
            found: found.to_owned(),
        }),
    }
}

/// Checks that `value` is a sound record for `key`. A key of no known kind must hold JSON.
pub fn check_record(key: &str, value: &[u8]) -> Result<(), RecordError> {
    let parts: Vec<&str> = key.split('/').collect();
    match parts.as_slice() {
        [keys::USERS, name] => {
            let u: UserRecord = decode("a user record", value)?;
            same("user", name, &u.name)
        }
        [keys::APPS, app, "spec"] => {
            let s: AppSpec = decode("an app spec", value)?;
            same("app", app, &s.name)
        }
        ["releases", app, number] => {
            let r: Release = decode("a release", value)?;
            same("app", app, &r.app)?;
            same("release number", number, &format!("{:010}", r.number))
        }
        [keys::HEALTH, _, _] => decode::<AppHealth>("a restart state", value).map(drop),
        [keys::DRAINS, _] => decode::<DrainOrder>("a drain order", value).map(drop),
        _ if key == keys::PLACEMENT => decode::<Placement>("the placement", value).map(drop),
        _ => decode::<serde_json::Value>("JSON", value).map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_must_decode_as_its_key_names_and_name_what_its_key_names() {
        let alice = br#"{"name":"alice","password_hash":"$argon2id$x","clearance":"SECRET"}"#;
        assert_eq!(check_record("users/alice", alice), Ok(()));
        assert!(matches!(
            check_record("users/mallory", alice),
            Err(RecordError::Mismatch { .. })
        ));
        assert!(matches!(
            check_record("users/alice", &alice[..alice.len() - 3]),
            Err(RecordError::Undecodable { .. })
        ));
        assert!(check_record("lattice", br#"{"levels":[]}"#).is_ok());
        assert!(check_record("lattice", b"{\"levels\":[").is_err());
    }
}
