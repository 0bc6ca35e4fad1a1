//! Where a sign-in may return to: this gateway's own paths only.
//!
//! A private copy of the pages slice's `endpoints/next.rs` `safe_next` (issue 36 splits the
//! work; the lead keeps one of the two when both land).

/// `next` if it is a path on this gateway (`/…`, not `//host` or `/\host`, no scheme, no
/// control characters, no backslash); `None` otherwise.
pub(crate) fn safe_next(next: &str) -> Option<String> {
    let ok = next.starts_with('/')
        && !next.starts_with("//")
        && !next.contains('\\')
        && !next.chars().any(|c| c.is_control())
        && next.len() <= 2048;
    ok.then(|| next.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_own_paths() {
        assert_eq!(safe_next("/apps/demo/").as_deref(), Some("/apps/demo/"));
        for bad in [
            "https://evil.example/",
            "//evil.example/",
            "/\\evil.example",
            "evil",
            "/a\r\nLocation: x",
            "",
        ] {
            assert_eq!(safe_next(bad), None, "{bad:?}");
        }
    }
}
