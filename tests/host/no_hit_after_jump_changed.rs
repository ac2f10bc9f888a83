//! The watch word (docs/design/monitor.md, "The patch check"):
//! tests/c/host/hit_after_jump_changed.c. Each scenario changes our jump in libc's munmap
//! after the watch cleared, by a path the design claims to see, and then hits: none may be
//! served.

use crate::common;

use common::text;
use std::path::PathBuf;

fn run(scenario: &str, env: &[(&str, &str)]) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no_hit_after_jump_changed");
    let out = common::fake_scenario(&dir, "hit_after_jump_changed", scenario, env);
    println!("{scenario}: {}", text(&out));
    assert_eq!(out.status.code(), Some(0), "{scenario}: {}", text(&out));
}

/// libc's munmap page replaced (hooked MAP_FIXED mmap) by a read-only MAP_SHARED view of a
/// memfd with the same bytes: /proc/self/maps shows it not writable, yet a store through a
/// writable alias of the memfd changes our jump with no system call.
#[test]
fn a_shared_alias_of_the_page_is_not_read_only() {
    run("memfd_alias", &[]);
}

/// The same with a MAP_PRIVATE read-only mapping of a file: pwrite(2) to the file changes
/// the page (not yet copied on write) with no mprotect and no unmap.
#[test]
fn a_private_file_page_follows_its_file() {
    run("file_private", &[]);
}

/// A modified copy moved over the page with mremap(MREMAP_FIXED): the new range is hooked.
#[test]
fn mremap_fixed_over_the_page_is_seen() {
    run("mremap_fixed", &[]);
}

/// The mprotect hooks fail as libc's do: -1 and errno.
#[test]
fn mprotect_hooks_keep_errno() {
    run("errno", &[]);
}

/// libc's own mprotect, reached through libc's handle (a stated gap): how many hits are
/// served before the drain thread notices.
#[test]
fn libc_own_mprotect_window() {
    run("libc_mprotect", &[]);
}

/// memfd_alias with a store that takes munmap past our hook, then the cached buffer
/// unmapped and mapped again at the same address: the hit hands out the old registration.
#[test]
fn a_shared_alias_store_leads_to_a_stale_hit() {
    run("memfd_stale", &[]);
}

/// The same sequences with MRCACHE_PATCH_CHECK=every-hit (the check on every hit): held.
#[test]
fn every_hit_check_catches_the_same_sequences() {
    for s in [
        "memfd_alias",
        "file_private",
        "memfd_stale",
        "libc_mprotect",
    ] {
        run(s, &[("MRCACHE_PATCH_CHECK", "every-hit")]);
    }
}

/// The word clean, munmap's page made writable by a system call no hook sees (a stated
/// gap) and left so: the design says a page left writable keeps every hit checking; 200 ms
/// later a plain store over our jump.
#[test]
fn a_page_made_writable_after_a_clean_keeps_hits_checking() {
    run("writable_after_clean", &[]);
}

/// A hooked mprotect patcher at random offsets from the drain's cycle (held in 40 rounds).
#[test]
fn hooked_patcher_at_random_offsets_from_the_drain() {
    for _ in 0..20 {
        run("race", &[]);
    }
}

/// Clean at fork(); the child overwrites past the hooks and hits for 1 s (held: the
/// child's first registration takes the full path).
#[test]
fn fork_child_overwrite() {
    run("fork_child", &[]);
}

/// A fork child that closed its descriptors and opened a file at the number of the watch's
/// inherited /proc/self/maps descriptor keeps that file (the library closed it once).
#[test]
fn a_fork_child_keeps_its_own_descriptor() {
    run("fork_fd", &[]);
}

/// The same when the child's own file is its parent's /proc/PID/maps, the file the
/// inherited descriptor names: only closing at the fork itself is sure to close ours.
#[test]
fn a_fork_child_keeps_its_own_open_of_the_parents_maps() {
    run("fork_fd_maps", &[]);
}

/// mprotect from the page before, one byte into munmap's page (held).
#[test]
fn mprotect_one_byte_into_the_page_is_seen() {
    run("partial", &[]);
}

/// madvise advice the hook does not count as zapping keeps our jump (held).
#[test]
fn non_zapping_advice_keeps_the_jump() {
    run("advice", &[]);
}
