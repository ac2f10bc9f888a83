//! `libmrcache_engine.so`: the thin unsafe shell over the core that libmrcache.so (the
//! front, `preload/front`, the library loaded with `LD_PRELOAD`) loads and attaches at the
//! first verbs call.
//!
//! One folder per layer, each using only the layers below it (docs/design/overview.md,
//! "The layers of libmrcache.so"; `ci/modules` checks that no circle appears):
//!
//! ```text
//! abi       the entry points the front's slots lead to (verbs hooks, dlsym), attach
//! calls     what each verbs hook does: registration through the cache, rereg, flushes
//! runtime   process state: set-up, the fast hit path's gate, guard, fork, report
//! verbs     the verbs side: real libibverbs functions, the provider, memory windows
//! monitor   the memory monitor: memory hooks' bodies, patching libc, chaining, self-test
//! trace     where log, trace and statistics lines go
//! sys, ffi  system calls, the loader's tables, our own threads; the verbs structs
//! ```

// The engine exports one function, `mrcache_engine_attach` (`abi`); the front's slots lead
// to the hooks. Under `cargo test` nothing attaches, so what only the hooks call looks
// unused there.
#![cfg_attr(test, allow(dead_code))]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

mod abi;
mod calls;
mod ffi;
mod monitor;
mod runtime;
mod sys;
mod trace;
mod verbs;
