//! The re-entrancy guard and the panic shield every verbs hook runs inside.

use crate::runtime::cache;
use crate::sys::front::ThreadCell;
use crate::sys::front_abi::TLS_DEPTH;
use crate::verbs::provider::Provider;
use mrcache::cache::Cache;
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

thread_local! {
    static DEPTH_STD: Cell<u32> = const { Cell::new(0) };
}
/// Depth of verbs hooks on this thread: a registration the provider makes while we are
/// inside one of ours is passed through, never processed twice. In the front's static TLS
/// (a fork in a signal handler reads it).
static DEPTH: ThreadCell<u32> = ThreadCell::new(TLS_DEPTH, &DEPTH_STD);

/// Guards held now, on all threads. A thread always reads its own increments, so zero
/// means this thread holds none: the fast path then skips the thread-local lookup (which
/// costs a `__tls_get_addr` call in a shared library). Miss paths write it; hits only read.
static ENTERED: AtomicUsize = AtomicUsize::new(0);

/// Whether this thread is inside one of our hooks (or cannot tell: its thread-locals are
/// being destroyed).
#[inline]
pub fn nested() -> bool {
    ENTERED.load(Relaxed) != 0 && inside_here()
}

/// Apart and not inlined: the compiler would otherwise compute the thread-local's address
/// (the `__tls_get_addr` call) before the test of `ENTERED`, on every call.
#[inline(never)]
#[cold]
fn inside_here() -> bool {
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(true)
}

/// In a fork child: only this thread's guard (if any) survived.
pub fn after_fork_child() {
    let mine = DEPTH.try_with(|d| d.get() as usize).unwrap_or(0);
    ENTERED.store(mine, Relaxed);
}

pub struct Guard;

impl Guard {
    pub fn enter() -> Option<Guard> {
        DEPTH
            .try_with(|d| {
                if d.get() > 0 {
                    None
                } else {
                    d.set(1);
                    ENTERED.fetch_add(1, Relaxed);
                    Some(Guard)
                }
            })
            .ok()
            .flatten()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(0));
        ENTERED.fetch_sub(1, Relaxed);
    }
}

/// Run `f` on the cache inside the re-entrancy guard and the panic shield; `passthrough`
/// when nested in another of our hooks, when there is no cache, or after a panic.
pub fn with_cache<T>(
    passthrough: impl Fn() -> T,
    f: impl FnOnce(&'static Cache<Provider>) -> T,
) -> T {
    let Some(_guard) = Guard::enter() else {
        return passthrough();
    };
    shielded(
        || match cache() {
            Some(cache) => f(cache),
            None => passthrough(),
        },
        &passthrough,
    )
}

/// Run `f`; a panic (a bug) falls back to `fallback` instead of unwinding into C. The
/// thread's cancellation is off meanwhile (`NoCancel`): no cancel unwinds through us either.
#[inline]
pub fn shielded<T>(f: impl FnOnce() -> T, fallback: impl FnOnce() -> T) -> T {
    let _no_cancel = crate::sys::thread::NoCancel::new();
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| fallback())
}
