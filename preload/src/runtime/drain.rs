//! The background drain: idle entries whose memory went away are deregistered (their pinned
//! pages given back), a fork's flush is done, and the patched sites and watched pages are
//! checked again, once a cycle (20 ms).
//!
//! On a thread of ours only while the program has threads of its own (glibc's
//! `__libc_single_threaded` is false). A program without threads keeps glibc's
//! single-threaded rules, which a thread of ours would end for good: `fork()` (even from a
//! signal handler that interrupted `malloc`) takes no allocator lock, and a `_Fork()` child
//! may call `malloc`, since no other thread can hold its lock. There the cycle runs on the
//! calling thread, in a registration of the full path, once a cycle has passed since the
//! last; meanwhile the fast path sends the first call after that time down the full path
//! (`cycle_due`), so hits keep to the drain thread's rule: a change to the watched pages is
//! seen within a cycle of the next call.

use super::{RUNTIME, cache, flush_after_fork};
use mrcache::config::Monitor;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

static DRAIN_RUNNING: AtomicBool = AtomicBool::new(false);

/// One cycle's length.
const CYCLE_NS: u64 = 20_000_000;

/// Without a drain thread: when the next cycle is due (`CLOCK_MONOTONIC_COARSE`, ns);
/// 0 while the drain thread runs (or before the first registration).
static NEXT_CYCLE: AtomicU64 = AtomicU64::new(0);

/// In a fork child: the drain thread is gone.
pub(super) fn after_fork_child() {
    DRAIN_RUNNING.store(false, Relaxed);
}

/// The coarse monotonic clock (vDSO, a few ns; ticks of a few ms, plenty for a cycle).
fn coarse_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills ts; async-signal-safe, no allocation.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Without a drain thread, whether a cycle is due: the fast path then sends the call down
/// the full path, whose registration runs it. One load while the drain thread runs.
#[inline]
pub fn cycle_due() -> bool {
    let next = NEXT_CYCLE.load(Relaxed);
    next != 0 && coarse_ns() >= next
}

/// Called by every registration of the full path before its checks and lookup: without a
/// drain thread, runs the cycle here when one is due (before the lookup: a change to the
/// watched pages the cycle finds must keep this very call from a hit the watch word would
/// allow).
pub fn cycle_here() {
    if DRAIN_RUNNING.load(Relaxed) || !crate::sys::thread::program_single_threaded() {
        return;
    }
    let now = coarse_ns();
    if now >= NEXT_CYCLE.load(Relaxed) {
        NEXT_CYCLE.store(now + CYCLE_NS, Relaxed);
        // The app's errno is the registration's to set, not the cycle's (an ioctl the
        // kernel does not know leaves ENOTTY).
        let saved = crate::sys::errno();
        cycle();
        crate::sys::set_errno(saved);
    }
}

/// Called by every registration of the full path (after its lookup: a new thread's
/// start-up unmaps would otherwise race this very registration): starts the drain thread
/// once the program has threads of its own.
pub fn ensure_drain_thread() {
    // Load first: a swap on every registration would write this line from every thread.
    if DRAIN_RUNNING.load(Relaxed)
        || crate::sys::thread::program_single_threaded()
        || DRAIN_RUNNING.swap(true, Relaxed)
    {
        return;
    }
    NEXT_CYCLE.store(0, Relaxed);
    crate::sys::thread::spawn_settled(c"mrcache-drain", || {
        loop {
            std::thread::sleep(std::time::Duration::from_nanos(CYCLE_NS));
            cycle();
        }
    });
}

/// One cycle of the drain, on the drain thread or inline.
fn cycle() {
    if let Some(rt) = RUNTIME.get()
        && let Some(cache) = cache()
    {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            if rt.monitor == Monitor::Patch {
                crate::runtime::closed::check_patches(cache);
                if cache.caching_stopped().is_none() {
                    crate::monitor::patch::drain_tick();
                }
            }
            flush_after_fork(cache);
            cache.drain_pending()
        }));
    }
}
