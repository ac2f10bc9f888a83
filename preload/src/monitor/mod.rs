//! The memory monitor: every way a process can make a virtual range stop being backed by
//! the pages it had, reported to the invalidation queue before the kernel changes the
//! mapping. The memory hooks and their bodies (`memory`), where a hook forwards a call
//! (`forward`), patching libc's own entries (`patch`, `cross_modify`, `trampoline`), `dlclose` (`dl`),
//! `dlsym`'s answers for the memory functions and chaining with other patchers (`dlsym`,
//! `search`), the constructor's install (`load`) and the start-up self-test (`selftest`).
//!
//! Layer: below `runtime`, beside `verbs` (neither uses the other); uses only `trace`,
//! `sys` and `ffi` (docs/design/overview.md). What it needs from above (the verbs
//! hooks `dlsym` hands out) comes in as a parameter (`dlsym::route_dlsym`).

pub mod cross_modify;
pub mod dl;
pub mod dlsym;
pub mod forward;
pub mod load;
pub mod memory;
pub mod patch;
pub mod search;
pub mod selftest;
pub mod trampoline;
