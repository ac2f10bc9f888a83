//! mrcache core: everything the LD_PRELOAD library does that can be tested without
//! LD_PRELOAD. The exported hooks live in the `preload/` crate and stay thin over this; the
//! `mrcache` launcher and its command line in the `cli/` crate.
//!
//! - [`cache::Cache`]: the registration cache policy over a [`cache::Registrar`].
//! - [`invalidation::InvalidationQueue`]: how memory hooks report unmaps, lock-free.
//! - [`access`]: which registrations may be cached and which entry may serve a request.
//! - [`admission`]: whether caching a size class pays (cost model), and the scan-resistant rule.
//! - [`config`]: the `MRCACHE_*` environment variables.
//! - [`node`]: what the default byte cap depends on (ranks per node, the memlock limit).
//!
//! What is `pub` here is what `libmrcache.so` (preload/), the `mrcache` launcher (cli/) and
//! the integration tests (tests/) use; everything else is `pub(crate)`. The range index and
//! the lock-free ring under the queues are internal.

#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![deny(missing_docs)]

pub mod access;
pub mod admission;
pub mod cache;
pub mod config;
pub mod fork;
pub(crate) mod index;
pub mod invalidation;
pub mod log;
pub mod node;
pub(crate) mod ring;
pub mod selftest;
pub mod stats;
pub mod summary;
pub mod trace;

/// The version shared by the launcher and `libmrcache.so`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
