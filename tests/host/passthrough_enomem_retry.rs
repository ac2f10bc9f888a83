//! The pass-through's ENOMEM/EAGAIN retry (`Cache::give_back_idle`) through libmrcache.so
//! and the fake provider of tests/c/host/passthrough_enomem.c: retried once only when
//! something idle was given back, errno kept, an entry in use kept, no hit on a given-back
//! MR, reentrancy and fork.

use crate::common;

use common::line;
use std::path::PathBuf;

fn run(mode: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("passthrough_enomem_retry");
    let out = common::fake_scenario(
        &dir,
        "passthrough_enomem",
        mode,
        &[("MRCACHE_REMOTE", "bypass"), ("MRCACHE_STATS", "1")],
    );
    let t = common::text(&out);
    println!("{t}");
    assert_eq!(out.status.code(), Some(0), "{t}");
    t
}

#[test]
fn a_pass_through_that_keeps_failing_is_retried_once_errno_kept() {
    let out = run("always");
    // One idle entry: one retry; none left: no retry. errno 12 both times.
    assert_eq!(
        line(&out, "always:"),
        "always: calls 2 1 errno 12 12 null 1 1"
    );
}

#[test]
fn eagain_without_idle_entries_keeps_its_errno() {
    let out = run("eagain");
    assert_eq!(line(&out, "eagain:"), "eagain: calls 1 errno 11 null 1");
}

#[test]
fn an_entry_in_use_is_not_given_back() {
    let out = run("in_use");
    assert_eq!(
        line(&out, "in_use:"),
        "in_use: calls 1 errno 12 null 1 local_ok 1"
    );
}

#[test]
fn a_retried_pass_through_deregisters_through_the_provider() {
    let out = run("retry");
    let l = line(&out, "retry:");
    assert!(
        l.starts_with("retry: rc 0 dereg 0 pinned 0 calls 2"),
        "{out}"
    );
    assert!(l.ends_with("local_again 1"), "{out}");
}

#[test]
fn hits_racing_give_back_idle_never_see_a_deregistered_mr() {
    let out = run("race");
    let l = line(&out, "race:");
    assert!(l.contains(" 0 dead"), "{out}");
}

#[test]
fn a_provider_registering_from_inside_a_failing_pass_through() {
    let out = run("nested");
    assert_eq!(
        line(&out, "nested:"),
        "nested: calls 2 1 errno 12 12 null 1 1"
    );
}

#[test]
fn forks_during_failing_pass_throughs() {
    let out = run("fork");
    assert_eq!(line(&out, "fork:"), "fork: 50 of 50 children ok");
}

/// No idle entry to give back (the only one is in use): the failed pass-through's errno is
/// libibverbs' ENOMEM, even while other threads contend for the cache lock that
/// `give_back_idle` takes (a futex wait sets errno).
#[test]
fn a_failed_pass_through_keeps_enomem_under_lock_contention() {
    let out = run("errno");
    let l = line(&out, "errno:");
    assert!(l.contains(" 0 not ENOMEM"), "{out}");
}
