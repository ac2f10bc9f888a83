//! What libmrcache.so (the front, `preload/front`) and libmrcache_engine.so agree on: the
//! front's entry points, each a jump through a slot that the engine fills when the front
//! attaches it, and what the front hands the engine then. Written against `core` alone:
//! both compile this file.

use core::ffi::{CStr, c_void};
use core::sync::atomic::AtomicUsize;

/// Raised whenever `FrontInfo` or the slots change: a front and an engine of different
/// builds refuse each other.
pub const ABI: u32 = 1;

/// Words of each thread's block in the front's static TLS (`FrontInfo::tls`), zero at a
/// thread's start: the engine's per-thread state of its hooks (`sys::front::ThreadCell`).
pub const TLS_WORDS: usize = 8;
/// Their use: the call a memory hook forwards (2 words), the hooks open on this thread, the
/// verbs hooks' depth, the ranges held across a fork.
pub const TLS_FORWARDING: usize = 0;
pub const TLS_OPEN_HERE: usize = 2;
pub const TLS_DEPTH: usize = 3;
pub const TLS_FORK_HELD: usize = 4;
/// The front's own: this thread is opening or attaching the engine.
pub const TLS_FRONT_IN_ATTACH: usize = 7;

/// The engine's file, beside the front's.
pub const ENGINE_FILE: &[u8] = b"libmrcache_engine.so";

/// The engine's one export: `fn(*const FrontInfo) -> c_int` (1: attached, the slots hold
/// its entry points; 0: refused, the slots are untouched).
pub const ATTACH: &CStr = c"mrcache_engine_attach";

/// What a slot's entry point does before the engine is attached.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Goes on to the next definition of its name after the front (libc's, or another
    /// interposer's): a memory call, `dlclose`, `_Fork`.
    Forward,
    /// Attaches the engine (a verbs call; without the engine, libibverbs' own function).
    Verbs,
    /// Attaches the engine (`mrcache info`'s exports; without the engine, 0).
    Engine,
    /// `dlsym`, `dlvsym`: libc's, unless the answer depends on the engine.
    Lookup,
}

/// The slots, in order: (name, kind).
pub const SLOTS: usize = 30;

pub const DLSYM: usize = 28;
pub const DLVSYM: usize = 29;

/// Slot `i`'s entry point's name and kind.
pub const fn slot(i: usize) -> (&'static CStr, Kind) {
    use Kind::*;
    match i {
        0 => (c"munmap", Forward),
        1 => (c"madvise", Forward),
        2 => (c"mremap", Forward),
        3 => (c"mmap", Forward),
        4 => (c"mmap64", Forward),
        5 => (c"brk", Forward),
        6 => (c"sbrk", Forward),
        7 => (c"shmat", Forward),
        8 => (c"shmdt", Forward),
        9 => (c"realloc", Forward),
        10 => (c"mprotect", Forward),
        11 => (c"pkey_mprotect", Forward),
        12 => (c"posix_madvise", Forward),
        13 => (c"process_madvise", Forward),
        14 => (c"remap_file_pages", Forward),
        15 => (c"dlclose", Forward),
        16 => (c"_Fork", Forward),
        17 => (c"ibv_reg_mr", Verbs),
        18 => (c"ibv_reg_mr_iova", Verbs),
        19 => (c"ibv_reg_mr_iova2", Verbs),
        20 => (c"ibv_dereg_mr", Verbs),
        21 => (c"ibv_rereg_mr", Verbs),
        22 => (c"ibv_reg_dmabuf_mr", Verbs),
        23 => (c"ibv_dealloc_pd", Verbs),
        24 => (c"ibv_close_device", Verbs),
        25 => (c"ibv_fork_init", Verbs),
        26 => (c"mrcache_selftest_report", Engine),
        27 => (c"mrcache_patch_watch_clean", Engine),
        DLSYM => (c"dlsym", Lookup),
        _ => (c"dlvsym", Lookup),
    }
}

/// The libibverbs symbol version a verbs slot's entry point is exported under.
pub const fn verbs_version(i: usize) -> &'static CStr {
    match i {
        18 => c"IBVERBS_1.7",
        19 => c"IBVERBS_1.8",
        22 => c"IBVERBS_1.12",
        _ => c"IBVERBS_1.1",
    }
}

/// The slot of the entry point named `name`, if the front has one.
pub fn slot_of(name: &[u8]) -> Option<usize> {
    (0..SLOTS).find(|&i| slot(i).0.to_bytes() == name)
}

/// What the front hands the engine to attach it (`ATTACH`).
#[repr(C)]
pub struct FrontInfo {
    /// `ABI`.
    pub abi: u32,
    /// The front's load base, dynamic section and the span of its segments: the engine's
    /// walks start after the front's place in the loader's list, and the entry points the
    /// engine watches are the front's.
    pub base: usize,
    pub dynamic: usize,
    pub lo: usize,
    pub hi: usize,
    /// The last object loaded at start-up, noted by the front's constructor.
    pub last_at_start: *mut c_void,
    /// The slots (`SLOTS` of them), which the engine fills.
    pub slots: *const AtomicUsize,
    /// Calls `f(a, b, c)` from the front's code: `dlsym(RTLD_NEXT)` from there starts after
    /// the front, as it did for lookups made from libmrcache.so.
    pub call_from_front: unsafe extern "C" fn(f: usize, a: usize, b: usize, c: usize) -> usize,
    /// This thread's `TLS_WORDS` words in the front's static TLS block.
    pub tls: unsafe extern "C" fn() -> *mut usize,
}
