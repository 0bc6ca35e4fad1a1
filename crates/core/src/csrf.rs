//! The forms' cross-site request forgery token, for every page warden serves (the gateway's
//! sign-in forms, the API's dashboard): a signed double-submit token. The browser holds a random
//! cookie; the form carries the hex HMAC-SHA256 of it under a key the server holds, with a
//! context that keeps one use's tokens from standing for another's. Pure: each caller keeps its
//! own cookie, key and origin check.

use hmac::{Hmac, Mac};
use sha2::Sha256;

fn mac(key: &[u8; 32], context: &[u8], cookie: &str) -> Hmac<Sha256> {
    // An HMAC takes a key of any length: this cannot fail.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    m.update(context);
    m.update(cookie.as_bytes());
    m
}

/// The form field for `cookie`: its hex HMAC-SHA256 under `key`, after `context`.
pub fn field(key: &[u8; 32], context: &[u8], cookie: &str) -> String {
    crate::id::hex(&mac(key, context, cookie).finalize().into_bytes())
}

/// Whether `sent` is the field for `cookie`, compared in constant time.
pub fn verify(key: &[u8; 32], context: &[u8], cookie: &str, sent: &str) -> bool {
    decode_hex(sent).is_some_and(|sent| mac(key, context, cookie).verify_slice(&sent).is_ok())
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() != 64 {
        return None;
    }
    (0..32)
        .map(|i| u8::from_str_radix(text.get(i * 2..i * 2 + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_verifies_only_for_its_cookie_key_and_context() {
        let (k, other) = ([7u8; 32], [8u8; 32]);
        let f = field(&k, b"a\0", "cookie");
        assert!(verify(&k, b"a\0", "cookie", &f));
        assert!(!verify(&k, b"a\0", "other cookie", &f));
        assert!(!verify(&other, b"a\0", "cookie", &f));
        assert!(!verify(&k, b"b\0", "cookie", &f));
        assert!(!verify(&k, b"a\0", "cookie", &f[..62]));
        assert!(!verify(&k, b"a\0", "cookie", "zz"));
    }
}
