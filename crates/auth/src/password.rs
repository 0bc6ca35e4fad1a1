//! Argon2id password hashes in PHC string form.
//!
//! Verification takes tens of milliseconds on purpose. Callers on an async executor must run it
//! on a blocking pool.

use std::sync::OnceLock;

use argon2::password_hash::{
    rand_core::OsRng, PasswordHash, PasswordHasher, PasswordVerifier, SaltString,
};
use argon2::{Algorithm, Argon2, Params, Version};
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
    /// The cost parameters are out of Argon2's range.
    #[error("Argon2id cost out of range ({0}): memory_kib must be at least 8 per lane, iterations at least 1, parallelism 1 to 16777215")]
    Cost(String),
}

/// The cost of Argon2id hashes made for new passwords (RFC 9106 §4): memory, passes and lanes.
/// A hash keeps the cost it was made with, so changing it affects new passwords only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Argon2Cost {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Passes over the memory.
    pub iterations: u32,
    /// Lanes.
    pub parallelism: u32,
}

impl Argon2Cost {
    /// RFC 9106's second recommended option, as the argon2 crate's defaults: 19 MiB, 2 passes,
    /// 1 lane.
    pub const RFC9106_SECOND: Self = Self {
        memory_kib: 19 * 1024,
        iterations: 2,
        parallelism: 1,
    };

    /// The hasher of this cost, or why the cost cannot be used.
    pub fn hasher(&self) -> Result<Argon2<'static>, PasswordError> {
        let params = Params::new(self.memory_kib, self.iterations, self.parallelism, None)
            .map_err(|e| PasswordError::Cost(e.to_string()))?;
        Ok(Argon2::new(Algorithm::Argon2id, Version::V0x13, params))
    }
}

/// Hashes `password` with Argon2id at `cost` and a fresh random salt.
pub fn hash_password(password: &str, cost: &Argon2Cost) -> Result<String, PasswordError> {
    if password.chars().count() < MIN_PASSWORD_LEN {
        return Err(PasswordError::TooShort);
    }
    if password.len() > MAX_PASSWORD_LEN {
        return Err(PasswordError::TooLong);
    }
    let salt = SaltString::generate(&mut OsRng);
    cost.hasher()?
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| PasswordError::Hash(e.to_string()))
}

/// True when `password` matches the PHC hash, at the cost the hash was made with. The final
/// comparison is constant time. A `None` hash (unknown user) is verified against a dummy hash
/// of `cost`, the cost of new passwords, so that the answer takes as long as for a real user and
/// does not reveal which names exist.
pub fn verify_password(phc: Option<&str>, password: &str, cost: &Argon2Cost) -> bool {
    if password.len() > MAX_PASSWORD_LEN {
        return false;
    }
    let dummy;
    let (phc, real) = match phc {
        Some(p) => (p, true),
        None => {
            dummy = dummy_hash(cost);
            (dummy.as_str(), false)
        }
    };
    let Ok(parsed) = PasswordHash::new(phc) else {
        return false;
    };
    let ok = Argon2::default()
        .verify_password(password.as_bytes(), &parsed)
        .is_ok();
    ok && real
}

/// A hash of a random password nobody knows, at `cost`. A process uses one cost, whose dummy is
/// made once; another cost gets a fresh one.
fn dummy_hash(cost: &Argon2Cost) -> String {
    static DUMMY: OnceLock<(Argon2Cost, String)> = OnceLock::new();
    let make = || hash_password(&generate_password(), cost).unwrap_or_default();
    let (made_for, hash) = DUMMY.get_or_init(|| (*cost, make()));
    if made_for == cost {
        hash.clone()
    } else {
        make()
    }
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

    const COST: Argon2Cost = Argon2Cost::RFC9106_SECOND;

    #[test]
    fn hashes_verify_and_reject() {
        let h = hash_password("correct horse", &COST).expect("hash");
        assert!(h.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{h}");
        assert!(!h.contains("correct horse"));
        assert!(verify_password(Some(&h), "correct horse", &COST));
        assert!(!verify_password(Some(&h), "correct horsf", &COST));
        assert!(!verify_password(None, "correct horse", &COST));
        assert!(!verify_password(Some("not a phc string"), "x", &COST));
        assert_ne!(
            h,
            hash_password("correct horse", &COST).expect("hash"),
            "salts differ"
        );
    }

    #[test]
    fn a_hash_keeps_the_cost_it_was_made_with() {
        let cheap = Argon2Cost {
            memory_kib: 64,
            iterations: 1,
            parallelism: 1,
        };
        let h = hash_password("correct horse", &cheap).expect("hash");
        assert!(h.starts_with("$argon2id$v=19$m=64,t=1,p=1$"), "{h}");
        assert!(verify_password(Some(&h), "correct horse", &COST));
        let broken = Argon2Cost {
            memory_kib: 0,
            ..cheap
        };
        assert!(matches!(
            hash_password("correct horse", &broken),
            Err(PasswordError::Cost(_))
        ));
    }

    #[test]
    fn bad_passwords_are_refused() {
        assert_eq!(hash_password("short", &COST), Err(PasswordError::TooShort));
        assert_eq!(
            hash_password(&"x".repeat(2000), &COST),
            Err(PasswordError::TooLong)
        );
        let p = generate_password();
        assert_eq!(p.len(), 24);
        assert_ne!(p, generate_password());
    }
}
