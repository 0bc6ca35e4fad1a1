//! Where a browser goes after signing in (`next`): only a path of this gateway, never another
//! site. Every place that redirects to a `next` the client chose calls [`safe_next`]; anything
//! it refuses becomes [`DEFAULT_NEXT`].
//!
//! The rules are read the way a browser reads a `Location`: it treats `\` like `/`, drops tabs
//! and newlines inside a URL, and takes `//host` as another site; an app behind the gateway may
//! percent-decode the path once more. So a `next` is refused for anything that could become one
//! of those, before or after decoding.

/// Where a browser goes when it asked for nowhere, or for somewhere refused.
pub(crate) const DEFAULT_NEXT: &str = "/whoami";

/// Longest `next` kept: longer ones are refused, not cut (a cut path is another path).
pub(crate) const MAX_NEXT: usize = 2048;

/// How many rounds of percent-decoding are checked: an app may decode once more than the
/// browser, and a third round costs nothing.
const DECODE_ROUNDS: usize = 3;

/// `next` if it is a path of this gateway that no browser or app can read as another site:
/// it begins with exactly one `/`, holds no `//`, no `/\`, no backslash, control character,
/// whitespace or byte outside printable ASCII, is at most 2048 bytes, and none of that
/// changes when it is percent-decoded (up to three times). `None` otherwise.
pub fn safe_next(next: &str) -> Option<String> {
    if next.len() > MAX_NEXT {
        return None;
    }
    let mut text = next.as_bytes().to_vec();
    for _ in 0..DECODE_ROUNDS {
        if !plain_path(&text) {
            return None;
        }
        let decoded: Vec<u8> = percent_encoding::percent_decode(&text).collect();
        if decoded == text {
            break;
        }
        text = decoded;
    }
    // Still changing after the last round: something encoded over and over, refused.
    if !plain_path(&text) || percent_encoding::percent_decode(&text).ne(text.iter().copied()) {
        return None;
    }
    Some(next.to_owned())
}

/// Whether `p` is a path with one leading `/` and nothing a browser reads as another site.
fn plain_path(p: &[u8]) -> bool {
    p.first() == Some(&b'/')
        && p.iter().all(|b| (0x21..=0x7e).contains(b) && *b != b'\\')
        && !p.windows(2).any(|w| w == b"//")
}

/// [`safe_next`], or [`DEFAULT_NEXT`].
pub(crate) fn next_or_default(next: Option<&str>) -> String {
    next.and_then(safe_next)
        .unwrap_or_else(|| DEFAULT_NEXT.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn paths_of_this_gateway_are_kept() {
        for ok in [
            "/",
            "/whoami",
            "/apps/demo/",
            "/apps/demo/notes?page=2&sort=new",
            "/apps/demo/a%2Db",
            "/apps/demo/<script>",
        ] {
            assert_eq!(safe_next(ok).as_deref(), Some(ok), "{ok}");
        }
    }

    #[test]
    fn other_sites_and_odd_paths_are_refused() {
        for bad in [
            "",
            "//evil.example",
            "///evil.example",
            "/\\evil.example",
            "\\\\evil.example",
            "https://evil.example",
            "evil.example",
            "/%2F%2Fevil.example",
            "/%2f/evil.example",
            "/%5Cevil.example",
            "/%252F%252Fevil.example",
            "/%25252F%25252Fevil.example",
            "/\tevil",
            "/ev\til",
            "/a b",
            "/a%20b",
            "/a\nb",
            "/a%0Ab",
            "/a%09b",
            "/a%00",
            "/caf\u{e9}",
            "/apps//x",
            " /x",
            "javascript:alert(1)",
        ] {
            assert_eq!(safe_next(bad), None, "{bad:?}");
        }
        assert_eq!(safe_next(&format!("/{}", "a".repeat(MAX_NEXT))), None);
        assert_eq!(next_or_default(Some("//evil")), DEFAULT_NEXT);
        assert_eq!(next_or_default(None), DEFAULT_NEXT);
    }

    proptest! {
        /// Whatever comes in, what comes out is a path a browser keeps on this site, even
        /// after decoding.
        #[test]
        fn whatever_is_kept_stays_on_this_site(s in ".{0,64}", pre in "[/\\\\%a-fA-F0-9:. \t]{0,12}") {
            let input = format!("{pre}{s}");
            if let Some(n) = safe_next(&input) {
                prop_assert_eq!(&n, &input);
                let mut text = n.into_bytes();
                for _ in 0..4 {
                    prop_assert!(text.starts_with(b"/"));
                    prop_assert!(!text.windows(2).any(|w| w == b"//"));
                    prop_assert!(text.iter().all(|b| (0x21..=0x7e).contains(b) && *b != b'\\'));
                    text = percent_encoding::percent_decode(&text).collect();
                }
            }
        }
    }
}
