//! Our jumps as recorded, by site index: where each was written, its hook and bytes, the
//! bytes kept before it, and the hook of another patcher it took over. `sites` writes
//! them; the checks, the watch and the hooks read them.

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, AtomicUsize};

/// Jumps we wrote: (address of the jump, hook, its bytes), for `intact`. Written in the constructor
/// (before threads), read anywhere. Nine libc targets (with mprotect); the rest is room for the unit tests'
/// stubs (the constructor patches libc in the test binary too).
pub(super) const SITES: usize = 32;
pub(super) static SITE_AT: [AtomicUsize; SITES] = [const { AtomicUsize::new(0) }; SITES];
pub(super) static SITE_HOOK: [AtomicUsize; SITES] = [const { AtomicUsize::new(0) }; SITES];
/// Our jump's bytes at the site, little-endian in the low five bytes (x86-64) or four (aarch64: one `B`).
pub(super) static SITE_CODE: [AtomicU64; SITES] = [const { AtomicU64::new(0) }; SITES];
pub(super) static SITE_NAME: [AtomicUsize; SITES] = [const { AtomicUsize::new(0) }; SITES];
/// How many bytes of endbr64 we kept before the jump (checked too: a patcher may write its
/// own short jump over them).
pub(super) static SITE_ENDBR: [AtomicUsize; SITES] = [const { AtomicUsize::new(0) }; SITES];
/// How many bytes of the function's own instructions we kept after the endbr64 and before
/// the jump (`Prologue::keep`), and every kept byte from the entry on (endbr64 included; the
/// first eight, and the last eight where there are more), checked like the jump. On
/// aarch64: 4 per word kept before the `B`, and the kept words, two to a `SITE_KEPT` slot.
pub(super) static SITE_KEEP: [AtomicUsize; SITES] = [const { AtomicUsize::new(0) }; SITES];
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(super) static SITE_KEPT: [[AtomicU64; 2]; SITES] =
    [const { [const { AtomicU64::new(0) }; 2] }; SITES];
/// Whether the kept bytes are the function's own, as in its file: then an `int3` over the
/// first byte of a kept instruction is a breakpoint (a uprobe, a debugger) that runs that
/// instruction elsewhere and resumes on our jump, not an overwrite.
/// Our jump at the entry of site `i`, in front of its kept instructions, where another
/// patcher's jump there was taken back (`adopt_overwritten`); 0: none. The bytes after it
/// are never run then: the site is intact with it in place, or with the bytes we first
/// wrote and kept back (the other patcher wrote back what it had found).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(super) static SITE_ADOPTED: [AtomicU64; SITES] = [const { AtomicU64::new(0) }; SITES];
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(super) static SITE_BREAK_OK: [AtomicBool; SITES] = [const { AtomicBool::new(false) }; SITES];
/// The hook another patcher (UCX's bistro, libfabric's memhooks) had put at the entry we
/// took over: our hook calls it instead of issuing the system call, so both see the call.
pub(super) static SITE_CHAINED: [AtomicUsize; SITES] = [const { AtomicUsize::new(0) }; SITES];
