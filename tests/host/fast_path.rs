//! The preload's fast path for hits and releases (preload/src/runtime/fast.rs) keeps the full
//! path's guarantees: checked on the host with a fake provider (tests/c/host/fast_hit.c)
//! and, behind libmrcache.so, a stand-in for libibverbs' reg/dereg (verbs_shim.c), since
//! libibverbs itself cannot handle a fake context.

use crate::common;

use common::text;
use std::path::PathBuf;

fn run(scenario: &str, env: &[(&str, &str)]) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fast_path");
    let out = common::fake_scenario(&dir, "fast_hit", scenario, env);
    assert_eq!(out.status.code(), Some(0), "{scenario}: {}", text(&out));
}

/// A provider that registers through the public API from inside our miss path: that
/// registration and its deregistration both pass through to libibverbs (the guard's
/// rule), neither is served by nor handed to the cache, and the cached entry survives.
#[test]
fn nested_registration_and_its_deregistration_pass_through() {
    run("nested", &[]);
}

/// `MRCACHE_FORK=flush`: `_Fork()` (no atfork handlers) leaves the flush to the parent's
/// next registration, which must not be a fast hit on the entry to flush.
#[test]
fn first_registration_after_fork_flushes_before_any_hit() {
    run("fork_flush", &[("MRCACHE_FORK", "flush")]);
}

/// `MRCACHE_MONITOR=patch`: our jump in libc's munmap overwritten between two hits on one
/// thread; the registration after it must not be served from the cache.
#[test]
fn a_hit_after_our_jump_is_overwritten_is_not_served() {
    run("patch_overwrite", &[]);
}

/// The watch on the patched pages (docs/design/monitor.md, "The patch check"): hits skip the
/// site check only while no watched page changed. With the watch clean and a thread
/// hitting, libc's `mprotect` makes munmap's page writable and our jump is overwritten: no
/// hit that starts after the overwrite is served. Rounds: each process stops caching after
/// its overwrite.
#[test]
fn a_hit_after_mprotect_and_an_overwrite_is_not_served() {
    for _ in 0..10 {
        run("watch_mprotect", &[]);
    }
}

/// The same through `pkey_mprotect` (pkey -1).
#[test]
fn a_hit_after_pkey_mprotect_and_an_overwrite_is_not_served() {
    for _ in 0..5 {
        run("watch_pkey", &[]);
    }
}

/// munmap's page made writable before the first registration by a system call no hook sees
/// (`syscall(SYS_mprotect)`), and left so: the watch never clears, and a plain store over
/// our jump (no call at all) is seen before the next hit.
#[test]
fn a_page_left_writable_keeps_every_hit_checking() {
    run("watch_writable", &[]);
}

/// madvise(MADV_DONTNEED) over munmap's page drops our copy of it (the page reverts to
/// libc's file, without our jump): seen by the madvise hook, no hit after it is served.
#[test]
fn a_hit_after_madvise_drops_our_jump_is_not_served() {
    run("watch_madvise", &[]);
}

/// A second `ibv_dereg_mr` of an MR released on the fast path (and of one whose memory
/// went away while held) returns EINVAL; the provider never sees it.
#[test]
fn a_second_deregistration_is_einval() {
    run("double_dereg", &[]);
}
