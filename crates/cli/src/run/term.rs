//! What of a command's output reaches a terminal: text, with control characters other than
//! line ends and tabs, and bidi overrides, replaced by U+FFFD, so that output an app user wrote
//! cannot drive the operator's terminal (OSC 52 writes the clipboard, others the title or the
//! screen). Output arrives in chunks that may split a character: the incomplete end waits for
//! the next chunk.

use std::borrow::Cow;

/// Filters one stream (stdout or stderr).
pub(super) struct Filter {
    /// Whether the stream is a terminal: otherwise bytes pass as they are.
    on: bool,
    /// The start of a character the last chunk ended in.
    carry: Vec<u8>,
}

/// Longest UTF-8 character: the most a chunk's end can hold back.
const MAX_CHAR: usize = 4;

impl Filter {
    pub(super) fn new(on: bool) -> Self {
        Self {
            on,
            carry: Vec::new(),
        }
    }

    /// What of `chunk` to write now.
    pub(super) fn pass<'a>(&mut self, chunk: &'a [u8]) -> Cow<'a, [u8]> {
        if !self.on {
            return Cow::Borrowed(chunk);
        }
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(chunk);
        let mut out = String::with_capacity(bytes.len());
        let mut rest = &bytes[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    push_clean(&mut out, text);
                    break;
                }
                Err(e) => {
                    let (good, after) = rest.split_at(e.valid_up_to());
                    // Checked by from_utf8 up to here.
                    push_clean(&mut out, std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{fffd}');
                            rest = &after[n..];
                        }
                        // A character cut by the chunk's end: kept for the next chunk.
                        None => {
                            self.carry = after[..after.len().min(MAX_CHAR)].to_vec();
                            break;
                        }
                    }
                }
            }
        }
        Cow::Owned(out.into_bytes())
    }
}

fn push_clean(out: &mut String, text: &str) {
    out.extend(text.chars().map(|c| {
        let bidi = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if bidi || c.is_control() && !matches!(c, '\n' | '\r' | '\t') {
            '\u{fffd}'
        } else {
            c
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::Filter;

    #[test]
    fn escapes_are_replaced_and_text_kept_across_chunks() {
        let mut f = Filter::new(true);
        // OSC 52 (the clipboard), then a CSI in its C1 form, then é cut between two chunks.
        let a = f
            .pass(b"ok\x1b]52;c;aGk=\x07 \xc2\x9b2J caf\xc3")
            .into_owned();
        let b = f.pass(b"\xa9\n").into_owned();
        let all = String::from_utf8([a, b].concat()).expect("utf-8");
        assert_eq!(all, "ok\u{fffd}]52;c;aGk=\u{fffd} \u{fffd}2J caf\u{e9}\n");
        assert_eq!(
            String::from_utf8(f.pass("\u{202e}x\tz".as_bytes()).into_owned()).expect("utf-8"),
            "\u{fffd}x\tz"
        );
    }

    #[test]
    fn a_pipe_gets_the_bytes_as_they_are() {
        let mut f = Filter::new(false);
        assert_eq!(&*f.pass(b"\x1b[2J\xff"), b"\x1b[2J\xff");
    }
}
