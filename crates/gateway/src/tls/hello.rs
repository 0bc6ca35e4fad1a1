//! Reading the first TLS record of a connection and telling resumption attempts from full
//! handshakes, before any cryptography runs (seed 004 §8).
//!
//! Only the few fields the decision needs are read: the legacy session id, and whether the
//! `pre_shared_key` (TLS 1.3) or a non-empty `session_ticket` (TLS 1.2) extension is present.
//! Parsing a dozen length-prefixed fields by hand keeps a parser crate and its dependencies out of
//! the accept path; every length is checked against what is left.

/// Largest TLS record payload (RFC 8446 §5.1) plus room for expansion.
const MAX_RECORD: usize = 16384 + 2048;
const HANDSHAKE: u8 = 0x16;
const CLIENT_HELLO: u8 = 1;
const EXT_SESSION_TICKET: usize = 35;
const EXT_PRE_SHARED_KEY: usize = 41;

/// What the first bytes of a connection are.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum First {
    /// A TLS handshake record; `resumption` if the client offers to resume a session.
    Tls { resumption: bool },
    /// Not TLS at all: most likely plain HTTP sent to the TLS port.
    NotTls,
}

/// Whether `buf` holds enough to classify the connection: the whole first TLS record, or bytes
/// that show this is not TLS, or a record header announcing more than a record may hold.
pub(crate) fn first_record_read(buf: &[u8]) -> bool {
    if buf.is_empty() {
        return false;
    }
    if buf[0] != HANDSHAKE {
        return true;
    }
    if buf.len() < 5 {
        return false;
    }
    let need = 5 + usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    buf.len() >= need || need > 5 + MAX_RECORD
}

/// Classifies a connection by its first record. `known_session` says whether a legacy session id
/// is one this server issued (a TLS 1.3 client sends a random one for compatibility).
pub(crate) fn classify(first: &[u8], known_session: impl Fn(&[u8]) -> bool) -> First {
    if first.first() != Some(&HANDSHAKE) {
        return First::NotTls;
    }
    // A malformed or split ClientHello is treated as a full handshake: the cautious choice.
    First::Tls {
        resumption: parse(first).is_some_and(|h| {
            h.psk || h.ticket || (!h.session_id.is_empty() && known_session(h.session_id))
        }),
    }
}

struct Hello<'a> {
    session_id: &'a [u8],
    psk: bool,
    ticket: bool,
}

/// A cursor that refuses to read past the end.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }
}

fn parse(record: &[u8]) -> Option<Hello<'_>> {
    let mut r = Cursor(record);
    r.take(3)?; // content type, legacy record version
    let len = r.u16()?;
    let mut h = Cursor(r.take(len)?);
    if h.u8()? != usize::from(CLIENT_HELLO) {
        return None;
    }
    let body_len = h.u24()?;
    let mut b = Cursor(h.take(body_len)?);
    b.take(2 + 32)?; // legacy version, random
    let sid_len = b.u8()?;
    let session_id = b.take(sid_len)?;
    let suites = b.u16()?;
    b.take(suites)?;
    let compression = b.u8()?;
    b.take(compression)?;
    let mut hello = Hello {
        session_id,
        psk: false,
        ticket: false,
    };
    if b.0.is_empty() {
        return Some(hello);
    }
    let ext_len = b.u16()?;
    let mut e = Cursor(b.take(ext_len)?);
    while !e.0.is_empty() {
        let kind = e.u16()?;
        let len = e.u16()?;
        e.take(len)?;
        match kind {
            EXT_PRE_SHARED_KEY => hello.psk = true,
            EXT_SESSION_TICKET if len > 0 => hello.ticket = true,
            _ => {}
        }
    }
    Some(hello)
}

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello record with the given session id and extensions.
    fn hello(session_id: &[u8], exts: &[(usize, &[u8])]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([7u8; 32]);
        body.push(session_id.len() as u8);
        body.extend(session_id);
        body.extend([0, 2, 0x13, 0x01]); // one suite
        body.extend([1, 0]); // null compression
        let mut ext = Vec::new();
        for (kind, data) in exts {
            ext.extend((*kind as u16).to_be_bytes());
            ext.extend((data.len() as u16).to_be_bytes());
            ext.extend(*data);
        }
        body.extend((ext.len() as u16).to_be_bytes());
        body.extend(ext);
        let mut hs = vec![CLIENT_HELLO];
        hs.extend(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend(body);
        let mut rec = vec![HANDSHAKE, 3, 1];
        rec.extend((hs.len() as u16).to_be_bytes());
        rec.extend(hs);
        rec
    }

    #[test]
    fn fresh_hello_is_a_full_handshake() {
        let r = hello(&[9; 32], &[(0, b"\0\0"), (EXT_SESSION_TICKET, b"")]);
        assert_eq!(classify(&r, |_| false), First::Tls { resumption: false });
    }

    #[test]
    fn psk_ticket_or_known_session_id_is_a_resumption_attempt() {
        let psk = hello(&[], &[(EXT_PRE_SHARED_KEY, b"abc")]);
        assert_eq!(classify(&psk, |_| false), First::Tls { resumption: true });
        let ticket = hello(&[], &[(EXT_SESSION_TICKET, b"ticket")]);
        assert_eq!(
            classify(&ticket, |_| false),
            First::Tls { resumption: true }
        );
        let sid = hello(&[5; 32], &[]);
        assert_eq!(
            classify(&sid, |id| id == [5; 32]),
            First::Tls { resumption: true }
        );
        assert_eq!(classify(&sid, |_| false), First::Tls { resumption: false });
    }

    #[test]
    fn truncated_or_lying_lengths_never_panic_and_count_as_full() {
        let good = hello(&[1; 8], &[(EXT_PRE_SHARED_KEY, b"x")]);
        for cut in 0..good.len() {
            let r = classify(&good[..cut], |_| true);
            assert!(
                matches!(r, First::Tls { resumption: false } | First::NotTls),
                "cut {cut}: {r:?}"
            );
        }
        let mut lying = good.clone();
        lying[43] = 200; // session id length beyond the record
        assert_eq!(classify(&lying, |_| true), First::Tls { resumption: false });
    }

    #[test]
    fn plain_http_is_not_tls() {
        assert_eq!(classify(b"GET / HTTP/1.1\r\n", |_| true), First::NotTls);
    }

    #[test]
    fn a_record_is_read_when_whole_and_plain_bytes_at_once() {
        let rec = hello(&[], &[]);
        for cut in 0..rec.len() {
            assert!(!first_record_read(&rec[..cut]), "cut {cut}");
        }
        assert!(first_record_read(&rec));
        let mut more = rec.clone();
        more.extend(b"next record");
        assert!(first_record_read(&more));
        assert!(first_record_read(b"G"));
        // A header announcing more than any record holds: no point waiting for it.
        assert!(first_record_read(&[HANDSHAKE, 3, 1, 0xff, 0xff]));
    }
}
