//! The allocator's one setting: memory freed is given back to the system at once.
//!
//! mimalloc gives freed pages back after a delay, but only when the allocator is next called;
//! a gateway that goes quiet after a flood of connections would keep the flood's memory for
//! good (docs/BENCHMARKS.md, "Memory after connection floods").
#![allow(unsafe_code)]

/// mimalloc's `mi_option_purge_delay` (the same index in its v2 and v3).
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Call first thing in `main`.
pub fn give_memory_back_at_once() {
    // SAFETY: mi_option_set takes two integers and only writes mimalloc's option table; the
    // option index is the one its header defines for purge_delay.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 0) };
}
