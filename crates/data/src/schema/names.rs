//! The names warden gives an app's database and roles, and quoting: identifiers through
//! [`quote_ident`], literals through [`quote_literal`] (for warden's own text only), so SQL
//! is made only from validated names.

use sha2::{Digest, Sha256};

use super::SchemaError;

/// The app's database.
pub fn db_name(app: &str) -> String {
    format!("warden_app_{app}")
}

/// The app's owner role.
pub fn owner_role_name(app: &str) -> String {
    format!("wo_{}", short_hash(&["owner", app]))
}

/// The role of (app, label[, user]); `label` canonical.
pub fn label_role_name(app: &str, label: &str, user: Option<&str>) -> String {
    let user_part = match user {
        Some(u) => format!("u:{u}"),
        None => "-".into(),
    };
    format!("wl_{}", short_hash(&["label", app, label, &user_part]))
}

pub(super) fn is_warden_role(role: &str) -> bool {
    (role.starts_with("wo_") || role.starts_with("wl_"))
        && role.len() == 19
        && role[3..].bytes().all(|b| b.is_ascii_hexdigit())
}

fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        // Length-prefixed, so no two tuples hash the same text.
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    hex(&h.finalize()[..8])
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A PostgreSQL identifier, always quoted.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A PostgreSQL string literal (standard_conforming_strings is on from 9.1).
pub(super) fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

pub(super) fn check_name(app: &str) -> Result<(), SchemaError> {
    let ok = !app.is_empty()
        && app.len() <= 40
        && app
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    ok.then_some(())
        .ok_or_else(|| SchemaError::BadName(app.to_owned()))
}

/// Users only ever reach PostgreSQL as bound values and hash input; still bounded.
pub(super) fn check_user(user: &str) -> Result<(), SchemaError> {
    let ok = !user.is_empty() && user.len() <= 128 && !user.chars().any(char::is_control);
    ok.then_some(())
        .ok_or_else(|| SchemaError::BadName(user.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_and_differ() {
        let a = label_role_name("notes", "SECRET", None);
        let b = label_role_name("notes", "SECRET", Some("alice"));
        let c = label_role_name("notes2", "SECRET", None);
        assert!(a != b && a != c && b != c);
        assert!(is_warden_role(&a) && is_warden_role(&owner_role_name("notes")));
        assert!(a.len() < 63);
    }

    #[test]
    fn quoting_doubles_quotes() {
        assert_eq!(quote_ident(r#"a"b"#), r#""a""b""#);
        assert_eq!(quote_literal("it's"), "'it''s'");
    }

    #[test]
    fn app_names_are_checked() {
        assert!(check_name("notes-2").is_ok());
        assert!(check_name("Notes").is_err());
        assert!(check_name("a\"; DROP").is_err());
    }
}
