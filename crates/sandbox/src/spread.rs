//! A stable spread of names over small ranges (per-instance uids, interface names).

/// FNV-1a: cheap and stable across runs and versions; not for security.
pub(crate) fn fnv(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn near_names_spread() {
        let a = super::fnv(b"/data/instances/abc");
        let b = super::fnv(b"/data/instances/abd");
        assert_ne!(a % 100_000, b % 100_000);
    }
}
