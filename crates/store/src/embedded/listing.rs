//! Listings: the records under a key prefix by whole tokens, or starting with a text, read in one
//! transaction with the revision it saw.

use redb::{Database, ReadableDatabase, ReadableTable};

use super::{codec, read_err, KV, META};
use crate::{Listing, StoreError};

/// Records a listing reads on the caller's thread before it goes to the blocking pool.
pub(super) const INLINE_LIST: usize = 128;

/// Which keys a listing holds.
pub(super) enum Span {
    /// `prefix` itself and every key under `prefix/` (whole tokens); the whole store for "".
    Under(String),
    /// Every key that begins with this text.
    Starting(String),
}

/// The inclusive-exclusive key range that holds everything strictly under `prefix/`.
fn child_range(prefix: &str) -> (String, String) {
    (format!("{prefix}/"), format!("{prefix}0")) // '0' is the byte after '/'
}

/// Every record in `span`, with the revision the read saw; `None` when there are more than
/// `limit`.
pub(super) fn list_in(
    db: &Database,
    span: &Span,
    limit: Option<usize>,
) -> Result<Option<Listing>, StoreError> {
    let txn = db.begin_read().map_err(read_err)?;
    let kv = txn.open_table(KV).map_err(read_err)?;
    let meta = txn.open_table(META).map_err(read_err)?;
    let revision = meta
        .get("revision")
        .map_err(read_err)?
        .map(|v| v.value())
        .unwrap_or(0);
    let mut rows: Vec<(redb::AccessGuard<'_, &str>, redb::AccessGuard<'_, &[u8]>)> = Vec::new();
    let mut own = None;
    let over = |rows: &Vec<_>| limit.is_some_and(|l| rows.len() > l);
    match span {
        Span::Under(prefix) if prefix.is_empty() => {
            for row in kv.iter().map_err(read_err)? {
                rows.push(row.map_err(read_err)?);
                if over(&rows) {
                    return Ok(None);
                }
            }
        }
        Span::Under(prefix) => {
            own = kv
                .get(prefix.as_str())
                .map_err(read_err)?
                .map(|v| (prefix.as_str(), v));
            let (lo, hi) = child_range(prefix);
            for row in kv.range(lo.as_str()..hi.as_str()).map_err(read_err)? {
                rows.push(row.map_err(read_err)?);
                if over(&rows) {
                    return Ok(None);
                }
            }
        }
        Span::Starting(start) => {
            // Keys sort by their bytes, so those that begin with `start` follow it in one run.
            for row in kv.range(start.as_str()..).map_err(read_err)? {
                let row = row.map_err(read_err)?;
                if !row.0.value().starts_with(start.as_str()) {
                    break;
                }
                rows.push(row);
                if over(&rows) {
                    return Ok(None);
                }
            }
        }
    }
    let mut entries = Vec::new();
    // A record whose framing is damaged is left out (and logged), never failing the listing of
    // every other one.
    let mut damaged = Vec::new();
    let mut push = |k: &str, v: &[u8]| match codec::decode_entry(k, v) {
        Ok(e) => entries.push(e),
        Err(e) => {
            warden_core::log_limited!(warn, error = %e, "skipping a damaged store record");
            damaged.push((k.to_owned(), e.to_string()));
        }
    };
    if let Some((k, v)) = own {
        push(k, v.value());
    }
    for (k, v) in &rows {
        push(k.value(), v.value());
    }
    Ok(Some(Listing {
        entries,
        revision,
        damaged,
    }))
}
