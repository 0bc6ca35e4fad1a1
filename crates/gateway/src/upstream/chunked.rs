//! Finds where a chunked response body ends (RFC 9112 §7.1) while its bytes pass through
//! unchanged, so the connection to the instance can be reused after it; and where its data
//! lies, for a client to which the gateway frames the body anew.

/// Where the scanner is in the chunked encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// In a chunk-size line: the size so far, and whether a hex digit was seen.
    Size(u64, bool),
    /// In a chunk extension, after the size.
    Ext(u64),
    /// After the size line's CR.
    SizeLf(u64),
    /// Inside chunk data, with this many bytes left.
    Data(u64),
    DataCr,
    DataLf,
    /// At the start of a trailer line (or of the final empty line).
    LineStart,
    Line,
    /// After a trailer line's CR; true when the line was empty (the end).
    LineLf(bool),
    Done,
}

/// Bytes allowed in chunk extensions and trailer lines: tab, visible ASCII, obs-text. A bare LF
/// or other control byte would let a lenient client find the body's end elsewhere than here.
fn text(b: u8) -> bool {
    b == b'\t' || (0x20..=0x7e).contains(&b) || b >= 0x80
}

/// A malformed chunked body.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Malformed;

/// Scans a chunked body.
#[derive(Debug)]
pub(crate) struct Scanner(At);

impl Scanner {
    pub fn new() -> Self {
        Self(At::Size(0, false))
    }

    /// True once the whole body, trailers included, has been seen.
    pub fn done(&self) -> bool {
        self.0 == At::Done
    }

    /// Scans `bytes`, the next bytes of the body, and returns how many belong to it: all of
    /// them, or fewer when the body ends inside `bytes`.
    #[cfg(test)]
    pub fn advance(&mut self, bytes: &[u8]) -> Result<usize, Malformed> {
        self.advance_with(bytes, |_| {})
    }

    /// [`Scanner::advance`], telling `data` every run of chunk data in `bytes` (ranges into it,
    /// in order).
    pub fn advance_with(
        &mut self,
        bytes: &[u8],
        mut data: impl FnMut(std::ops::Range<usize>),
    ) -> Result<usize, Malformed> {
        let mut i = 0;
        while i < bytes.len() && self.0 != At::Done {
            if let At::Data(left) = self.0 {
                let take = usize::try_from(left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len() - i);
                data(i..i + take);
                i += take;
                let left = left - take as u64;
                self.0 = if left == 0 {
                    At::DataCr
                } else {
                    At::Data(left)
                };
                continue;
            }
            let b = bytes[i];
            i += 1;
            self.0 = match (self.0, b) {
                (At::Size(n, _), b) if b.is_ascii_hexdigit() => {
                    let d = u64::from(char::from(b).to_digit(16).ok_or(Malformed)?);
                    At::Size(n.checked_mul(16).ok_or(Malformed)? + d, true)
                }
                (At::Size(n, true), b';' | b' ' | b'\t') => At::Ext(n),
                (At::Size(n, true), b'\r') => At::SizeLf(n),
                (At::Ext(n), b'\r') => At::SizeLf(n),
                (At::Ext(n), b) if text(b) => At::Ext(n),
                (At::SizeLf(0), b'\n') => At::LineStart,
                (At::SizeLf(n), b'\n') => At::Data(n),
                (At::DataCr, b'\r') => At::DataLf,
                (At::DataLf, b'\n') => At::Size(0, false),
                (At::LineStart, b'\r') => At::LineLf(true),
                (At::Line, b'\r') => At::LineLf(false),
                (At::LineStart | At::Line, b) if text(b) => At::Line,
                (At::LineLf(true), b'\n') => At::Done,
                (At::LineLf(false), b'\n') => At::LineStart,
                _ => return Err(Malformed),
            };
        }
        Ok(i)
    }
}

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_end_of_a_body_in_any_split() {
        let body =
            b"5\r\nhello\r\n1A;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-trailer: 1\r\n\r\n";
        for split in 0..body.len() {
            let mut s = Scanner::new();
            let a = s.advance(&body[..split]).unwrap();
            assert_eq!(a, split);
            assert!(!s.done(), "done early at {split}");
            let mut rest = body[split..].to_vec();
            rest.extend_from_slice(b"NEXT");
            let b = s.advance(&rest).unwrap();
            assert_eq!(a + b, body.len(), "split {split}");
            assert!(s.done());
        }
    }

    #[test]
    fn finds_the_data_in_any_split() {
        let body =
            b"5\r\nhello\r\n1A;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-trailer: 1\r\n\r\n";
        for split in 0..body.len() {
            let mut s = Scanner::new();
            let mut data = Vec::new();
            for part in [&body[..split], &body[split..]] {
                s.advance_with(part, |r| data.extend_from_slice(&part[r]))
                    .unwrap();
            }
            assert_eq!(data, b"helloabcdefghijklmnopqrstuvwxyz", "split {split}");
            assert!(s.done());
        }
    }

    #[test]
    fn refuses_malformed_framing() {
        for bad in [
            &b"\r\n"[..],
            b"zz\r\n",
            b"5\r\nhelloXX",
            b"5\n",
            b"ffffffffffffffffff\r\n",
            b"0\r\nX\n\r\n",
            b"5;a\nb\r\n",
        ] {
            assert_eq!(Scanner::new().advance(bad), Err(Malformed), "{bad:?}");
        }
        let mut s = Scanner::new();
        assert_eq!(s.advance(b"0\r\n\r\n"), Ok(5));
        assert!(s.done());
    }
}
