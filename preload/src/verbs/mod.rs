//! The verbs side: the real libibverbs functions under our hooks (`real`), the `Registrar`
//! that registers through the verbs provider (`provider`), which of its registrations are
//! made on demand (`odp`), and the memory windows of `MRCACHE_REMOTE=revoke` (`window`).
//!
//! Layer: below `runtime`; uses only `trace`, `sys` and `ffi` (docs/design/overview.md,
//! "The layers of libmrcache.so"). What it needs from above (logging at the configured level) comes in as
//! a parameter (`Provider::new`).

pub mod odp;
pub mod provider;
pub mod real;
pub mod window;
