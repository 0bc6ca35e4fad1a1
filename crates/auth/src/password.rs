//! Argon2id password hashes in PHC string form.
//!
//! Verification takes tens of milliseconds on purpose. Callers on an async executor must run it
//! on a blocking pool.

use std::sync::OnceLock;

use argon2::password_hash::{
    rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString,
};
use argon2::Argon2;
use rand::Rng;

/// Shortest password accepted for a new user.
pub const MIN_PASSWORD_LEN: usize = 8;
/// Longest password accepted; bounds the hashing work one request can cause.
pub const MAX_PASSWORD_LEN: usize = 1024;

/// Why a password could not be hashed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PasswordError {
    /// Too short.
    #[error("password is too short: use at least {MIN_PASSWORD_LEN} characters")]
    TooShort,
    /// Too long.
    #[error("password is too long: use at most {MAX_PASSWORD_LEN} bytes")]
    TooLong,
    /// The hasher failed.
    #[error("password hashing failed: {0}")]
    Hash(String),
}

/// Hashes `password` with Argon2id (RFC 9106 second recommended parameters, as the argon2 crate
/// defaults: 19 MiB, 2 passes, 1 lane) and a fresh random salt.
pub fn hash_password(password: &str) -> Result<String, PasswordError> {
    if password.chars().count() < MIN_PASSWORD_LEN {
        return Err(PasswordError::TooShort);
    }
    if password.len() > MAX_PASSWORD_LEN {
        return Err(PasswordError::TooLong);
    }
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| PasswordError::Hash(e.to_string()))
}

/// True when `password` matches the PHC hash. The final comparison is constant time. A `None`
/// hash (unknown user) is verified against a dummy hash so that the answer takes as long as for
/// a real user and does not reveal which names exist.
pub fn verify_password(phc: Option<&str>, password: &str) -> bool {
    if password.len() > MAX_PASSWORD_LEN {
        return false;
    }
    let (phc, real) = match phc {
        Some(p) => (p, true),
        None => (dummy_hash(), false),
    };
    let Ok(parsed) = PasswordHash::new(phc) else {
        return false;
    };
    let ok = Argon2::default()
        .verify_password(password.as_bytes(), &parsed)
        .is_ok();
    ok && real
}

fn dummy_hash() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| {
        // A random password nobody knows, hashed with the same parameters as real ones.
        hash_password(&generate_password()).unwrap_or_default()
    })
}

/// A random 24-character password from an unambiguous alphabet (about 137 bits).
pub fn generate_password() -> String {
    const ALPHABET: &[u8] = b"abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let mut rng = rand::rngs::OsRng;
    (0..24)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_verify_and_reject() {
        let h = hash_password("correct horse").expect("hash");
        assert!(h.starts_with("$argon2id$"), "{h}");
        assert!(!h.contains("correct horse"));
        assert!(verify_password(Some(&h), "correct horse"));
        assert!(!verify_password(Some(&h), "correct horsf"));
        assert!(!verify_password(None, "correct horse"));
        assert!(!verify_password(Some("not a phc string"), "x"));
        assert_ne!(
            h,
            hash_password("correct horse").expect("hash"),
            "salts differ"
        );
    }

    #[test]
    fn bad_passwords_are_refused() {
        assert_eq!(hash_password("short"), Err(PasswordError::TooShort));
        assert_eq!(
            hash_password(&"x".repeat(2000)),
            Err(PasswordError::TooLong)
        );
        let p = generate_password();
        assert_eq!(p.len(), 24);
        assert_ne!(p, generate_password());
    }
}
