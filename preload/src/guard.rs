//! The re-entrancy guard and the panic shield every verbs hook runs inside.

use crate::provider::Provider;
use crate::runtime::cache;
use mrcache::cache::Cache;
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};

thread_local! {
    /// Depth of verbs hooks on this thread: a registration the provider makes while we are
    /// inside one of ours is passed through, never processed twice.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
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

/// Run `f`; a panic (a bug) falls back to `fallback` instead of unwinding into C.
pub fn shielded<T>(f: impl FnOnce() -> T, fallback: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| fallback())
}
