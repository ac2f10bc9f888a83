//! mrcache core: everything the LD_PRELOAD library does that can be tested without
//! LD_PRELOAD. The exported hooks live in the `preload/` crate and stay thin over this.

/// The version shared by the launcher and `libmrcache.so`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
