//! Whether libmrcache.so is in this process, and whether a verbs call resolved to it (the
//! measuring process needs it there, the control and the libibverbs-alone copy must not
//! reach it).

/// libmrcache.so is loaded in this process (its self-test export is there).
pub fn preloaded() -> bool {
    // SAFETY: dlsym on RTLD_DEFAULT for a name; nothing is called.
    !unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"mrcache_selftest_report".as_ptr()) }.is_null()
}

/// The object at `path` (as `verbs::object_of` names it) is libmrcache.so.
pub fn is_ours(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|b| b.starts_with("libmrcache"))
}
