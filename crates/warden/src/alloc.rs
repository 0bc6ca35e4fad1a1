//! The allocator, chosen per process role before the first allocation.
//!
//! `warden up` (gateway, agent, API: one long-lived process with many threads and floods of
//! connections) allocates with mimalloc, set to give freed memory back at once: mimalloc gives
//! freed pages back after a delay, but only when the allocator is next called, so a gateway
//! that goes quiet after a flood would keep the flood's memory for good (docs/BENCHMARKS.md,
//! "Memory after connection floods").
//!
//! Every other role uses the C library's allocator: the demo app and `sandbox-init` (one app
//! and three init processes per instance, thousands of them idle) and the client commands.
//! mimalloc's arenas and the transparent huge pages it asks for cost each of those processes
//! megabytes that stay for its life: an idle sandboxed demo app cost 12.89 MiB instead of 1.65
//! (docs/BENCHMARKS.md, "Idle instances: the allocator per role").
//!
//! The role is read from the command line by a load-time constructor, before Rust's runtime
//! starts. Whichever allocator serves the first allocation serves all of them, so a pointer is
//! always freed by the allocator that gave it out: if anything allocated before the constructor
//! ran, the process stays on mimalloc.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

use mimalloc::MiMalloc;

/// No allocation yet and no role read.
const UNDECIDED: u8 = 0;
const MIMALLOC: u8 = 1;
const SYSTEM: u8 = 2;

static CHOSEN: AtomicU8 = AtomicU8::new(UNDECIDED);

/// The allocator this process uses, fixed by its first allocation.
#[inline]
fn chosen() -> u8 {
    match CHOSEN.load(Ordering::Relaxed) {
        UNDECIDED => {
            match CHOSEN.compare_exchange(UNDECIDED, MIMALLOC, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => MIMALLOC,
                Err(now) => now,
            }
        }
        c => c,
    }
}

/// Whether this process allocates with mimalloc (`up`) or the C library (every other role).
pub fn uses_mimalloc() -> bool {
    chosen() == MIMALLOC
}

/// The role a command line runs as, by its first argument: only `up` gets mimalloc.
fn allocator_for(first_argument: Option<&[u8]>) -> u8 {
    if first_argument == Some(b"up") {
        MIMALLOC
    } else {
        SYSTEM
    }
}

/// Runs when the binary is loaded, before `main` and before Rust's runtime allocates anything;
/// glibc passes main's arguments to `.init_array` functions (Rust's std reads its own `args()`
/// the same way).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" fn choose_at_load(
    argc: std::ffi::c_int,
    argv: *const *const std::ffi::c_char,
    _envp: *const *const std::ffi::c_char,
) {
    let first = (argc >= 2 && !argv.is_null())
        .then(|| {
            // SAFETY: glibc calls `.init_array` functions with main's argc and argv: argv holds
            // argc pointers to NUL-terminated strings, and argc >= 2 makes argv[1] one of them.
            let arg = unsafe { *argv.add(1) };
            // SAFETY: as above; a null entry is skipped.
            (!arg.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(arg) }.to_bytes())
        })
        .flatten();
    // Fails only if something allocated already: that allocator stays.
    let _ = CHOSEN.compare_exchange(
        UNDECIDED,
        allocator_for(first),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[used]
#[link_section = ".init_array"]
static CHOOSE_AT_LOAD: extern "C" fn(
    std::ffi::c_int,
    *const *const std::ffi::c_char,
    *const *const std::ffi::c_char,
) = choose_at_load;

/// The global allocator: mimalloc or the C library's, as [`chosen`] says.
pub struct ByRole;

// SAFETY: every call goes to one allocator, the same for the whole life of the process (fixed
// by the first allocation), so each block is reallocated and freed by the allocator that gave
// it out; both uphold GlobalAlloc's contract themselves.
unsafe impl GlobalAlloc for ByRole {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            if chosen() == MIMALLOC {
                MiMalloc.alloc(layout)
            } else {
                System.alloc(layout)
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            if chosen() == MIMALLOC {
                MiMalloc.alloc_zeroed(layout)
            } else {
                System.alloc_zeroed(layout)
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on; ptr came from the same allocator.
        unsafe {
            if chosen() == MIMALLOC {
                MiMalloc.dealloc(ptr, layout)
            } else {
                System.dealloc(ptr, layout)
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on; ptr came from the same allocator.
        unsafe {
            if chosen() == MIMALLOC {
                MiMalloc.realloc(ptr, layout, new_size)
            } else {
                System.realloc(ptr, layout, new_size)
            }
        }
    }
}

/// mimalloc's `mi_option_purge_delay` (the same index in its v2 and v3).
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// `up` calls this first thing: memory freed is given back to the system at once.
pub fn give_memory_back_at_once() {
    // SAFETY: mi_option_set takes two integers and only writes mimalloc's option table; the
    // option index is the one its header defines for purge_delay.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_up_gets_mimalloc() {
        assert_eq!(allocator_for(Some(b"up")), MIMALLOC);
        for other in [
            &b"demo-app"[..],
            b"sandbox-init",
            b"status",
            b"--version",
            b"upx",
        ] {
            assert_eq!(allocator_for(Some(other)), SYSTEM);
        }
        assert_eq!(allocator_for(None), SYSTEM);
    }
}
