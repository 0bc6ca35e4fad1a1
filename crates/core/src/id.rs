//! Random identifiers for instances, nodes and secrets.

use rand::RngCore;

/// A short, random, URL-safe id (16 lowercase hex digits, 64 random bits), used for instances
/// and nodes. Not a secret: ids appear in logs and the API.
pub fn short_id() -> String {
    let mut bytes = [0u8; 8];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex(&bytes)
}

/// A secret token with 256 random bits, hex encoded. Used for the admin token; callers must keep
/// it out of logs and error messages.
pub fn secret_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex(&bytes)
}

/// Lowercase hex encoding.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0xf) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_hex() {
        let a = short_id();
        let b = short_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(secret_token().len(), 64);
        assert_eq!(hex(&[0x00, 0xff, 0x1a]), "00ff1a");
    }
}
