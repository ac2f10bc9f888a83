//! The hooks' mode word, and the fast path of a hit and of its release: `Cache::try_hit` /
//! `Cache::try_release` called before the re-entrancy guard, the panic shield and the full
//! path's runtime checks, when the mode word says those checks would all pass.
//!
//! A verbs hook reads the word once and learns all it needs before the full path: caching
//! off for good (`OFF`: straight to libibverbs), tracing (`TRACED`: the traced path), armed
//! (`ARMED`: the fast path may serve), with or without the patch check (`CHECK_PATCHES`).
//!
//! The full path arms the gate after a registration that passed every check (runtime set
//! up, cache on and current, no `_Fork` in progress, no fork flush pending); whatever makes
//! one of them false disarms it: `_Fork` (before the real call, and in the parent once its
//! flush is pending), a fork child (its cache is replaced, its threads are gone). Arming
//! cannot undo a disarm: the full path reads the gate before its checks and arms with a
//! compare-and-swap that fails if a disarm came in between (each bumps the epoch).
//!
//! Done here on every call, as on the full path: the patch check (`MRCACHE_MONITOR=patch`:
//! a jump overwritten since the last registration must stop caching before any hit; the
//! full path does that; here every site is read only while the watch word says a watched
//! page may have changed, `patch::watch_clean`) and the re-entrancy check: a registration nested in one of our
//! calls on this thread, and its deregistration, pass through as on the full path. In a
//! program without threads (no drain thread, `runtime::drain`) the first call after a drain
//! cycle falls due takes the full path, whose registration runs the cycle before its lookup.
//!
//! Safe without the guard and the shield: `try_hit` and `try_release` promise no cache
//! lock, no allocation, no registrar call and no panic, so nothing here can re-enter a
//! hook or unwind into C.

use crate::ffi::{IbvMr, IbvPd};
use crate::monitor::patch;
use crate::runtime::guard;
use crate::verbs::provider::Provider;
use mrcache::cache::{Cache, Request};
use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::*};

const ARMED: u64 = 1;
/// Armed with `MRCACHE_MONITOR=patch`.
const CHECK_PATCHES: u64 = 2;
/// Every call is traced (`MRCACHE_LOG=trace`); set once, at set-up.
pub const TRACED: u64 = 4;
/// Caching is off for good (`MRCACHE_ENABLE=0`, or a configuration error that turned it
/// off): every registration and deregistration is libibverbs' own; set once, at set-up.
pub const OFF: u64 = 8;
/// One disarm.
const EPOCH: u64 = 16;

/// The mode word: `ARMED | CHECK_PATCHES | TRACED | OFF` and, above them, the count of
/// disarms.
static GATE: AtomicU64 = AtomicU64::new(0);

/// The mode word, read once by a hook (`TRACED`, `OFF`; `hit` and `release` take it).
#[inline(always)]
pub fn mode() -> u64 {
    GATE.load(Acquire)
}

/// Set `TRACED` or `OFF` for the rest of the process (set-up). A disarm keeps them.
pub fn set_mode(bits: u64) {
    GATE.fetch_or(bits & (TRACED | OFF), SeqCst);
}
/// The cache the gate was armed for; set before arming.
static CACHE: AtomicPtr<Cache<Provider>> = AtomicPtr::new(std::ptr::null_mut());

/// The gate, read by the full path before its checks (for `arm`).
pub fn seen() -> u64 {
    GATE.load(SeqCst)
}

/// After a full-path registration on `cache` that passed every check since it read `seen`:
/// let the fast path serve it (unless a disarm came in between).
pub fn arm(seen: u64, cache: &'static Cache<Provider>, check_patches: bool) {
    if seen & ARMED != 0 {
        return;
    }
    CACHE.store(cache as *const _ as *mut _, SeqCst);
    let flags = ARMED | if check_patches { CHECK_PATCHES } else { 0 };
    let _ = GATE.compare_exchange(seen, seen | flags, SeqCst, Relaxed);
}

/// Send every call down the full path until it arms the gate again. Lock-free and
/// allocation-free: `_Fork` calls it, maybe in a signal handler.
pub fn disarm() {
    let _ = GATE.fetch_update(SeqCst, SeqCst, |g| {
        Some((g & !(ARMED | CHECK_PATCHES)).wrapping_add(EPOCH))
    });
}

/// The cache, when the mode word `g` says armed and this thread is not inside one of our
/// calls; and whether to check the patches.
#[inline]
fn open(g: u64) -> Option<(&'static Cache<Provider>, bool)> {
    if g & ARMED == 0 || guard::nested() || crate::runtime::drain::cycle_due() {
        return None;
    }
    Some((armed_in(g)?, g & CHECK_PATCHES != 0))
}

/// The cache, when the gate's word `g` says armed.
#[inline(always)]
fn armed_in(g: u64) -> Option<&'static Cache<Provider>> {
    if g & ARMED == 0 {
        return None;
    }
    // SAFETY: CACHE is stored before the gate is armed and only ever holds caches that
    // are never freed (the runtime's, or a fork child's leaked replacement).
    unsafe { CACHE.load(Acquire).as_ref() }
}

/// An exact hit on the fast path, `mode` the mode word the hook read; None: take the full
/// path (nothing was changed).
#[inline(always)]
pub fn hit(
    mode: u64,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> Option<*mut IbvMr> {
    let (cache, check_patches) = open(mode)?;
    // The watch word first: while no watched page changed since the last full check, no
    // site can have changed either (docs/design/monitor.md, "The patch check").
    if check_patches && !patch::watch_clean() && patch::overwritten().is_some() {
        return None;
    }
    // The PD is not dereferenced: `try_hit` reads no context, and a null or foreign PD
    // matches no entry's key (the full path checks it).
    let req = Request {
        pd: pd as usize,
        context: 0,
        addr: addr as usize,
        len,
        iova,
        access,
    };
    cache.try_hit(&req).map(|h| h as *mut IbvMr)
}

/// The cache the gate was last armed for, armed now or not, even inside one of our calls:
/// for what may be done lock-free and allocation-free there (noting a nested
/// registration's MR in its registry, also while a fork shut the gate). None before the
/// gate was first armed (no cache has buried an MR yet). In a fork child before its first
/// call this is the parent's cache, whose registry the child's own never reads.
pub fn last_armed_cache() -> Option<&'static Cache<Provider>> {
    // SAFETY: as `armed_in`: CACHE only ever holds caches that are never freed.
    unsafe { CACHE.load(Acquire).as_ref() }
}

/// The cache, when the fast path is open (the gate armed, this thread in none of our
/// calls): the pass-through lane's (`calls::register_lane`).
#[inline]
pub fn cache_if_open() -> Option<&'static Cache<Provider>> {
    open(mode()).map(|(cache, _)| cache)
}

/// The release of a hit on the fast path, `mode` the mode word the hook read; false: take
/// the full path (nothing was changed).
#[inline]
pub fn release(mode: u64, mr: *mut IbvMr) -> bool {
    open(mode).is_some_and(|(cache, _)| cache.try_release(mr as usize).is_some())
}
