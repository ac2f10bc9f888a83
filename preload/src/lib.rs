//! `libmrcache.so`: the thin unsafe shell that is loaded with `LD_PRELOAD`.

/// Exported so that tools (and tests) can tell the library is loaded: `dlsym(RTLD_DEFAULT,
/// "mrcache_version")` returns a NUL-terminated version string.
#[unsafe(no_mangle)]
pub static mrcache_version: [u8; mrcache::VERSION.len() + 1] = {
    let mut out = [0u8; mrcache::VERSION.len() + 1];
    let v = mrcache::VERSION.as_bytes();
    let mut i = 0;
    while i < v.len() {
        out[i] = v[i];
        i += 1;
    }
    out
};
