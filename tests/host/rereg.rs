//! `ibv_rereg_mr` of handles the cache handed out, through the
//! preload on the host: a fake provider (tests/c/host/rereg_handles.c) and, behind
//! libmrcache.so, a stand-in for libibverbs' reg/dereg/rereg (rereg_shim.c).

use crate::common;

use common::text;
use std::path::PathBuf;
use std::process::Command;

fn run(scenario: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rereg");
    let (shim, prog) = common::shim_and_program(
        "host",
        "rereg_shim",
        "rereg_handles",
        &dir,
        scenario,
        &["-libverbs", "-ldl"],
    );
    let preload = common::preload_with(&shim);
    let out = Command::new(&prog)
        .arg(scenario)
        .env("LD_PRELOAD", preload)
        .env("MRCACHE_MONITOR", "patch")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{scenario}: {}", text(&out));
    text(&out)
}

/// The app's only handle, its buffer unmapped, moved with CHANGE_TRANSLATION right
/// after the munmap.
#[test]
fn rereg_of_the_only_handle_right_after_munmap_works() {
    run("undrained");
}

/// The same once a verbs call drained the unmap (the entry is dead, still held).
#[test]
fn rereg_of_the_only_handle_after_the_drain_works() {
    run("drained");
}

/// The same 150 ms after the munmap (the background drain runs every 20 ms).
#[test]
fn rereg_of_the_only_handle_later_works() {
    run("late");
}

/// Rereg of an MR the cache holds idle is a double release: EINVAL, one line, nothing
/// reaches libibverbs or the provider, later hits still cover the old buffer.
#[test]
fn rereg_of_an_idle_cached_mr_is_a_double_release() {
    let out = run("idle");
    assert_eq!(
        out.matches("already deregistered").count(),
        1,
        "one line naming the double release: {out}"
    );
}

/// The same for a shadow copy the app released.
#[test]
fn rereg_of_a_released_shadow_is_a_double_release() {
    let out = run("shadow");
    assert_eq!(
        out.matches("already deregistered").count(),
        1,
        "one line naming the double release: {out}"
    );
}
