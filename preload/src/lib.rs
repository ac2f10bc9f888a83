//! `libmrcache.so`: the thin unsafe shell that is loaded with `LD_PRELOAD`.
//!
//! One folder per layer, each using only the layers below it (docs/design/overview.md,
//! "The layers of libmrcache.so"; `ci/modules` checks that no circle appears):
//!
//! ```text
//! abi       the exported entry points (verbs hooks, dlsym, the constructor)
//! calls     what each verbs hook does: registration through the cache, rereg, flushes
//! runtime   process state: set-up, the fast hit path's gate, guard, fork, report
//! verbs     the verbs side: real libibverbs functions, the provider, memory windows
//! monitor   the memory monitor: memory hooks' bodies, patching libc, chaining, self-test
//! trace     where log, trace and statistics lines go
//! sys, ffi  system calls, the loader's tables, our own threads; the verbs structs
//! ```

// Under `cargo test` the hooks are not exported (`#[cfg_attr(not(test), unsafe(no_mangle))]`:
// the test binary's own munmap, dlclose and fork stay libc's), so what only they call
// looks unused there.
#![cfg_attr(test, allow(dead_code))]

mod abi;
mod calls;
mod ffi;
mod monitor;
mod runtime;
mod sys;
mod trace;
mod verbs;
