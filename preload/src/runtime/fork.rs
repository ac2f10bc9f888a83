//! fork(): the cache must never make fork less safe than libibverbs alone.
//!
//! Kernels since 5.13 copy pinned pages at fork (libibverbs reports IBV_FORK_UNNEEDED), so
//! registrations survive a fork unchanged. On older kernels a registration the app has
//! released but the cache still holds can go stale at the parent's first write after the
//! fork (copy-on-write moves the parent to a new page), so the prepare handler deregisters
//! idle entries; and when the app turned libibverbs' fork tracking on, the ranges of entries
//! in use (registered through the provider, so without libibverbs' MADV_DONTFORK) are marked
//! DONTFORK through `ibv_dontfork_range` for the fork's duration and unmarked after, which
//! keeps libibverbs' reference counts balanced. The child forgets every entry (it cannot use
//! the parent's verbs objects) and serves its own registrations.
//!
//! glibc's `fork()` runs the atfork handlers; `_Fork()` (glibc 2.34+) skips them, so it is
//! hooked as well, signal-safely (see `signal_safe_fork`).

use crate::runtime;
use crate::sys::front::ThreadCell;
use crate::sys::front_abi::TLS_FORK_HELD;
use crate::verbs::real;
use mrcache::config::ForkMode;
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering::*};

pub use mrcache::fork::Decision;

/// The app turned on libibverbs' fork tracking with `ibv_fork_init()`.
pub static FORK_INIT_CALLED: AtomicBool = AtomicBool::new(false);

/// `ibv_is_fork_initialized()`: 2 (IBV_FORK_UNNEEDED) when the kernel copies pinned pages.
fn copy_on_fork() -> Option<bool> {
    let f = real::IS_FORK_INITIALIZED.get()?;
    // SAFETY: ibv_is_fork_initialized@IBVERBS_1.13 takes nothing, returns an enum (int).
    Some(unsafe { f() } == 2)
}

/// Decide the fork policy (`mrcache::fork::decide`) from MRCACHE_FORK, the kernel and
/// whether libibverbs' fork tracking is on (ibv_fork_init, RDMAV_FORK_SAFE, IBV_FORK_SAFE;
/// rdma-core v35-v50 answer UNNEEDED even with tracking on, so tracking is tracked here,
/// not asked).
pub fn decide(mode: ForkMode) -> Decision {
    let tracking =
        FORK_INIT_CALLED.load(Relaxed) || mrcache::fork::tracking_in_env(|k| std::env::var(k).ok());
    mrcache::fork::decide(mode, copy_on_fork(), tracking)
}

thread_local! {
    static HELD_STD: Cell<usize> = const { Cell::new(0) };
}
/// The ranges marked DONTFORK, from prepare to parent/child (the same thread runs all three
/// handlers; forks on other threads have their own): 0, none (no fork began here); `EMPTY`,
/// none marked; else a `Box<Vec>` of them. One word in the front's static TLS, written with
/// one store: a fork in a signal handler may interrupt prepare, and may have interrupted
/// the allocator.
static HELD: ThreadCell<usize> = ThreadCell::new(TLS_FORK_HELD, &HELD_STD);
const EMPTY: usize = 1;

/// Whether a fork began on this thread (prepare ran).
fn held() -> bool {
    HELD.try_with(|h| h.get() != 0).unwrap_or(true)
}

/// Keep `ranges` for parent/child (no allocation when there are none).
fn hold(ranges: Vec<(usize, usize)>) {
    let word = if ranges.capacity() == 0 {
        EMPTY
    } else {
        Box::into_raw(Box::new(ranges)) as usize
    };
    let _ = HELD.try_with(|h| h.set(word));
}

/// The ranges prepare kept (None: prepare did not run on this thread).
fn take_held() -> Option<Vec<(usize, usize)>> {
    match HELD.try_with(|h| h.replace(0)).ok()? {
        0 => None,
        EMPTY => Some(Vec::new()),
        // SAFETY: a pointer `hold` made with Box::into_raw, taken once (replaced by 0).
        boxed => Some(*unsafe { Box::from_raw(boxed as *mut Vec<(usize, usize)>) }),
    }
}

pub(crate) fn for_ranges(
    sym: &crate::sys::symbol::Symbol<real::RangeFn>,
    ranges: &[(usize, usize)],
) {
    if ranges.is_empty() {
        return;
    }
    let Some(f) = sym.get() else { return };
    for &(a, l) in ranges {
        // SAFETY: as above, on ranges of live registrations.
        unsafe { f(a as *mut c_void, l) };
    }
}

/// No lock is held from here to the parent or child handler: the program's own handlers
/// run between (its prepare after ours, its parent and child before ours: ours are
/// registered at the first verbs call) and may make verbs calls, or wait for a thread that
/// makes one. The fork is marked in progress instead: registrations meanwhile pass
/// through uncached, releases work as ever.
///
/// A fork from a signal handler that interrupted one of our calls on this thread (or this
/// very handler) may not wait for the cache lock: the interrupted frame may hold it. Then
/// the fork gets `_Fork()`'s treatment (`signal_safe_fork`), only atomic stores: no idle
/// entry is deregistered and no range marked DONTFORK before it, the parent flushes idle
/// entries (when the policy says so) at its next registration, the child replaces the
/// inherited cache at its first call.
///
/// So does any fork of a program without threads of its own (`drain::program_single_threaded`)
/// unless ranges in use are to be marked DONTFORK: glibc's fork() then takes no allocator
/// lock, so a signal handler may fork while the program is in its own `malloc`, where
/// deregistering (libibverbs frees) or a `Vec` would corrupt the heap.
pub extern "C" fn prepare() {
    // Run twice for one fork (handlers registered twice by any path): once is enough.
    // (Not borrowed: a fork in a signal handler may interrupt this very store.)
    if held() {
        return;
    }
    if runtime::get().is_none() {
        return;
    }
    runtime::begin_fork();
    let lock_free = crate::sys::thread::program_single_threaded()
        && !runtime::get()
            .and_then(|r| r.fork.as_ref())
            .is_some_and(|d| d.dontfork_in_use);
    let inside = crate::runtime::guard::Guard::enter();
    let (Some(_inside), false) = (inside, lock_free) else {
        // Inside one of our calls on this thread, or no thread to wait for: the `_Fork`
        // way (no log line: that allocates, and the interrupted frame may be in the
        // allocator).
        runtime::COUNTERS.add(mrcache::stats::Counter::Forks, 1);
        hold(Vec::new());
        return;
    };
    let mut ranges = Vec::new();
    if let Some((cache, decision)) = runtime::fork_state() {
        // Apply pending unmaps first: an entry in use whose memory went away is dead, and
        // its range (now maybe other memory) must not be marked DONTFORK.
        cache.drain_pending();
        let flushed = if decision.flush_idle {
            cache.flush_all()
        } else {
            0
        };
        if decision.dontfork_in_use {
            ranges = cache.fork_ranges();
        }
        for_ranges(&real::DONTFORK_RANGE, &ranges);
        runtime::note_fork(flushed, ranges.len());
    }
    hold(ranges);
}

pub extern "C" fn parent() {
    if let Some(ranges) = take_held() {
        for_ranges(&real::DOFORK_RANGE, &ranges);
        runtime::after_fork_parent();
    }
}

pub extern "C" fn child() {
    let ranges = take_held();
    runtime::fork_child_ranges(ranges.unwrap_or_default());
    runtime::fork_child();
}

/// `_Fork()` skips the atfork handlers, and is async-signal-safe: it may run in a signal
/// handler that interrupted a thread holding the cache lock, the allocator's or the loader's.
/// So it does only atomic stores around the real call: the parent flushes idle entries (when
/// the fork policy says so) at its next registration, the child replaces the inherited cache
/// at its first call. Ranges in use are not marked DONTFORK here (that takes locks): with
/// libibverbs' fork tracking on a kernel that does not copy pinned pages at fork (< 5.13),
/// use fork(). (glibc's fork() calls its internal _Fork directly, never this.)
/// The `_Fork` hook's body (`abi::_Fork`).
pub fn signal_safe_fork() -> libc::pid_t {
    // Looked up at the first call, without a lock (`elf::next_after_own`): a program that
    // calls _Fork runs on a libc that defines it, where the walk finds it.
    let Some(real) = crate::sys::symbol::FORK.get() else {
        crate::sys::set_errno(libc::ENOSYS);
        return -1;
    };
    runtime::before_signal_safe_fork();
    // SAFETY: as above.
    let pid = unsafe { real() };
    if pid == 0 {
        runtime::after_signal_safe_fork_child();
    } else {
        runtime::after_fork_parent();
    }
    pid
}
