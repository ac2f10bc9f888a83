//! A `_Fork()` child and grandchild keep what the parent's cache was told or found out:
//! the remote-key policy, a failed-closed monitor, and which handles are the first
//! process's. Host tests: the fake provider of tests/c/host/fork_fake.h, libibverbs'
//! passthrough in tests/c/host/fork_shim.c (preloaded after libmrcache.so), the program
//! tests/c/host/underscore_fork_child.c, which calls `_Fork()` directly (no atfork handler runs).
//! Each run is bounded by alarm() in every process and `timeout -s KILL 30`.

use crate::common;

use common::text;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("underscore_fork_child_keeps_state")
}

/// Runs `underscore_fork_child mode` preloaded with `env`; panics with its output unless it
/// printed "ok" and exited 0. One binary per test (tests run in parallel).
fn passes(mode: &str, name: &str, env: &[(&str, &str)]) {
    let libs = ["-libverbs", "-ldl", "-lpthread"];
    let (shim, prog) = common::shim_and_program(
        "host",
        "fork_shim",
        "underscore_fork_child",
        &dir(),
        name,
        &libs,
    );
    let out = Command::new("timeout")
        .args(["-s", "KILL", "30"])
        .arg(&prog)
        .arg(mode)
        .env("LD_PRELOAD", common::preload_with(&shim))
        .env("MRCACHE_MONITOR", "patch")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let why = match (out.status.code(), out.status.signal()) {
        (Some(0), _) => None,
        (Some(1), _) => Some("broken".to_string()),
        (Some(3), _) => Some("set-up failed".to_string()),
        (_, Some(libc::SIGALRM)) => Some("hung (killed by its own alarm)".to_string()),
        (_, Some(libc::SIGKILL)) => Some("hung (killed by the 30 s timeout)".to_string()),
        _ => Some(format!("failed ({})", out.status)),
    };
    if let Some(why) = why {
        panic!(
            "underscore_fork_child {mode} {env:?}: {why}:\n{}",
            text(&out)
        );
    }
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ok"),
        "{}",
        text(&out)
    );
}

/// `MRCACHE_REMOTE=revoke` on a device without memory windows: registrations with remote
/// access pass through uncached in the child and grandchild as in the parent.
#[test]
fn revoke_stays_in_fork_children() {
    passes("remote", "revoke", &[("MRCACHE_REMOTE", "revoke")]);
}

/// `MRCACHE_REMOTE=bypass`: the same.
#[test]
fn bypass_stays_in_fork_children() {
    passes("remote", "bypass", &[("MRCACHE_REMOTE", "bypass")]);
}

/// `MRCACHE_MONITOR=symbols` (libc's own munmap unseen): the parent fails closed at start;
/// its children and grandchildren do not cache either (no stale hit on a freed and
/// malloc'd-again 1 MiB buffer).
#[test]
fn failed_closed_stays_in_fork_children() {
    passes("blind", "blind", &[("MRCACHE_MONITOR", "symbols")]);
}

/// A grandchild's `ibv_dereg_mr` of the first process's MR does not reach the provider,
/// whether its parent renewed its cache before the `_Fork()` or not.
#[test]
fn grandchild_keeps_off_the_first_process_handles() {
    passes("handles", "handles", &[]);
}
