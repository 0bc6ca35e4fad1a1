//! The `Date` header of the lane's own responses, formatted once per second per thread, as
//! hyper does for the responses it writes.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

/// Length of an IMF-fixdate such as `Sun, 06 Nov 1994 08:49:37 GMT`.
const LEN: usize = 29;

thread_local! {
    static CACHED: RefCell<(u64, [u8; LEN])> = const { RefCell::new((u64::MAX, [b' '; LEN])) };
}

/// Appends `date: <now>\r\n` to `out`.
pub(crate) fn write_header(out: &mut Vec<u8>) {
    let now = SystemTime::now();
    let secs = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    CACHED.with_borrow_mut(|(at, text)| {
        if *at != secs {
            let formatted = httpdate::fmt_http_date(now);
            if formatted.len() == LEN {
                text.copy_from_slice(formatted.as_bytes());
                *at = secs;
            }
        }
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(text);
        out.extend_from_slice(b"\r\n");
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn writes_an_http_date_of_now() {
        let mut out = Vec::new();
        super::write_header(&mut out);
        let line = std::str::from_utf8(&out).expect("ascii");
        let value = line
            .strip_prefix("date: ")
            .and_then(|v| v.strip_suffix("\r\n"))
            .expect("a date header line");
        let when = httpdate::parse_http_date(value).expect("an HTTP date");
        let age = std::time::SystemTime::now()
            .duration_since(when)
            .expect("not in the future");
        assert!(age.as_secs() < 3600, "{value}");
        // The second call within the same second reuses the text.
        let mut again = Vec::new();
        super::write_header(&mut again);
        assert_eq!(again.len(), out.len());
    }
}
