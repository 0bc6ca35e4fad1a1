//! Text from programs, shown on the dashboard's pages: build output and instances' last lines
//! are hostile (a dependency's install script or an app prints what it likes), so terminal
//! escapes are taken out before [`super::pages::escape_html`] makes the rest inert; and times
//! as `warden releases` prints them.

/// Most bytes of a program's output one page shows: the end of it.
pub(crate) const TAIL: usize = 32 * 1024;

/// The last [`TAIL`] bytes of `text` (from a line start where one is near), and whether
/// anything was cut.
pub(crate) fn tail(text: &str) -> (&str, bool) {
    if text.len() <= TAIL {
        return (text, false);
    }
    let mut at = text.len() - TAIL;
    while !text.is_char_boundary(at) {
        at += 1;
    }
    let rest = &text[at..];
    let rest = rest.find('\n').map_or(rest, |n| &rest[n + 1..]);
    (rest, true)
}

/// Most characters an escape sequence may hold before it is taken as ended: an unterminated
/// one (a crash mid-sequence, or a hostile program) must not swallow the rest of the output.
const ESCAPE_MAX: usize = 256;

/// `text` without terminal escapes (CSI such as colours, OSC such as titles and links, and
/// the two-byte ones) or other control characters but newlines and tabs, and without Unicode
/// format characters (bidi overrides and isolates, zero-width ones) or line/paragraph
/// separators, which would reorder or hide what the page shows: what is left is what a
/// terminal would print as characters. An escape ends at its final byte, at a newline (kept)
/// or after [`ESCAPE_MAX`] characters.
pub(crate) fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.peek() {
                // CSI: parameters and intermediates up to a final byte in @..~.
                Some('[') => {
                    chars.next();
                    skip(&mut chars, &mut out, |c, _| ('@'..='~').contains(&c));
                }
                // OSC, DCS, SOS, PM, APC: up to BEL or ST (ESC \).
                Some(']' | 'P' | 'X' | '^' | '_') => {
                    chars.next();
                    skip(&mut chars, &mut out, |c, next| {
                        c == '\u{7}' || (c == '\u{1b}' && next.next_if_eq(&'\\').is_some())
                    });
                }
                Some('\n') | None => {}
                Some(_) => {
                    chars.next();
                }
            },
            // The 8-bit CSI.
            '\u{9b}' => skip(&mut chars, &mut out, |c, _| ('@'..='~').contains(&c)),
            '\n' | '\t' => out.push(c),
            c if c.is_control() || format_char(c) => {}
            c => out.push(c),
        }
    }
    out
}

type Chars<'a> = std::iter::Peekable<std::str::Chars<'a>>;

/// Skips an escape's body up to where `end` says it ends, a newline (kept in `out`) or
/// [`ESCAPE_MAX`] characters.
fn skip(chars: &mut Chars<'_>, out: &mut String, end: impl Fn(char, &mut Chars<'_>) -> bool) {
    for _ in 0..ESCAPE_MAX {
        let Some(c) = chars.next() else { return };
        if c == '\n' {
            out.push('\n');
            return;
        }
        if end(c, chars) {
            return;
        }
    }
}

/// Whether `c` is a Unicode format character (general category Cf: bidi controls, zero-width
/// joiners and spaces, the BOM, tags...) or a line or paragraph separator.
fn format_char(c: char) -> bool {
    matches!(c,
        '\u{ad}' | '\u{600}'..='\u{605}' | '\u{61c}' | '\u{6dd}' | '\u{70f}' | '\u{890}'..='\u{891}'
        | '\u{8e2}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206f}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}'
        | '\u{110bd}' | '\u{110cd}' | '\u{13430}'..='\u{1343f}' | '\u{1bca0}'..='\u{1bca3}'
        | '\u{1d173}'..='\u{1d17a}' | '\u{e0001}' | '\u{e0020}'..='\u{e007f}')
}

pub(crate) use warden_core::model::utc_text as when;

/// A length of time in ms as `2h 5m`, `3m 12s` or `40s`.
pub(crate) fn span(ms: u64) -> String {
    let s = ms / 1000;
    match (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60) {
        (0, 0, 0, s) => format!("{s}s"),
        (0, 0, m, s) => format!("{m}m {s}s"),
        (0, h, m, _) => format!("{h}h {m}m"),
        (d, h, _, _) => format!("{d}d {h}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_escapes_and_controls_are_taken_out() {
        let text = "\u{1b}[31;1mred\u{1b}[0m \u{1b}]0;title\u{7}\u{1b}]8;;http://x\u{1b}\\link\u{1b}]8;;\u{1b}\\ \u{9b}2Jx\r\u{8}\u{0}ok\n\tend\u{1b}";
        assert_eq!(plain(text), "red link xok\n\tend");
    }

    #[test]
    fn bidi_and_invisible_characters_are_taken_out() {
        let text = "ok\u{202e}gpj.exe\u{2066}a\u{2069}\u{200b}b\u{feff}\u{2028}c\u{e0041}";
        assert_eq!(plain(text), "okgpj.exeabc");
    }

    #[test]
    fn an_unterminated_escape_ends_at_a_newline_or_its_bound() {
        assert_eq!(plain("a\u{1b}]0;title\nshown\n"), "a\nshown\n");
        assert_eq!(plain("a\u{9b}12\nshown"), "a\nshown");
        let long = format!("\u{1b}]{}after", "x".repeat(ESCAPE_MAX));
        assert_eq!(plain(&long), "after");
        assert_eq!(plain("\u{1b}[31"), "");
    }

    #[test]
    fn the_tail_starts_at_a_line_and_says_it_was_cut() {
        let text = format!("{}\nlast\n", "é".repeat(TAIL));
        let (t, cut) = tail(&text);
        assert!(cut);
        assert_eq!(t, "last\n");
        assert_eq!(tail("short"), ("short", false));
    }

    #[test]
    fn times_read_as_the_cli_prints_them() {
        assert_eq!(when(1_764_180_140_000), "2025-11-26 18:02:20");
        assert_eq!(span(3_723_000), "1h 2m");
        assert_eq!(span(59_000), "59s");
    }
}
