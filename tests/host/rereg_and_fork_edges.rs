//! Edges of rereg, fork and device memory, each run with its own scenario of
//! `tests/c/host/rereg_fork_edges.c` (a fake provider behind libmrcache.so and `rereg_shim.c`):
//! a fork child's rereg of the parent's MR moved it (rc 0, one provider rereg); a `_Fork`
//! child's dereg of a parent's shadow reached the provider when a parent thread held the
//! cache lock at the fork (26-57 of 300); refused rereg calls left errno 0; ON_DEMAND
//! registrations were counted as device memory.

use crate::common;

use common::text;
use std::path::PathBuf;
use std::process::Command;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rereg_and_fork_edges")
}

fn run(tag: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let libs = ["-libverbs", "-lpthread", "-Wno-unused-variable"];
    let (shim, exe) =
        common::shim_and_program("host", "rereg_shim", "rereg_fork_edges", &dir(), tag, &libs);
    let preload = common::preload_with(&shim);
    let out = Command::new("timeout")
        .args(["-s", "KILL", "120"])
        .arg(&exe)
        .args(args)
        .env("LD_PRELOAD", preload)
        .env("MRCACHE_MONITOR", "patch")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {t}");
    t
}

#[test]
fn a_fork_child_cannot_rereg_the_parents_cached_mr() {
    for scenario in ["forkrereg", "forkrereg_plain"] {
        let t = run(scenario, &[scenario], &[]);
        assert!(
            // Refused as a command the provider cannot carry out here
            // (IBV_REREG_MR_ERR_CMD, EOPNOTSUPP), not as the program's bad input (it was
            // IBV_REREG_MR_ERR_INPUT, EINVAL); the fake provider has a rereg op of its own.
            t.contains("child: rereg of the parent's cached MR (shared with a shadow): rc -4 errno 95, provider rereg calls 0"),
            "{scenario}: {t}"
        );
        assert!(
            t.contains("child: dereg of the parent's shadow: rc 0 provider deregs 0"),
            "{t}"
        );
    }
}

#[test]
fn a_fork_child_never_sends_a_parents_shadow_to_the_provider() {
    let t = run("forklock", &["forklock", "300"], &[]);
    assert!(
        t.contains("300 _Fork children; child dereg of the parent's shadow failed in 0, reached the provider in 0"),
        "{t}"
    );
}

#[test]
fn refused_rereg_calls_set_errno() {
    let t = run("rereg_bad", &["rereg_bad"], &[]);
    // A shared registration's rereg is IBV_REREG_MR_ERR_CMD with EOPNOTSUPP (was
    // IBV_REREG_MR_ERR_INPUT, EINVAL: read by a program as its own mistake).
    assert!(
        t.contains("rereg of primary while shadow held: rc -4 errno 95"),
        "{t}"
    );
    assert!(t.contains("rereg of shadow in use: rc -4 errno 95"), "{t}");
    // Bad flags stay bad input, with errno set, and never reach the provider (its count is
    // still the flags-0 call's).
    assert!(
        t.contains("rereg(bad flags 0x40) of sole handle: rc -1 errno 22 provider_reregs 1"),
        "{t}"
    );
    // No flag at all is not refused: libibverbs hands it to the provider (rxe
    // answers IBV_REREG_MR_ERR_CMD, EOPNOTSUPP; this fake provider accepts it). It was
    // refused with IBV_REREG_MR_ERR_INPUT, EINVAL.
    assert!(
        t.contains("rereg(flags 0) of sole handle: rc 0 errno 0 provider_reregs 1"),
        "{t}"
    );
}

#[test]
fn on_demand_registrations_are_not_called_device_memory() {
    let stats = dir().join("odp.json");
    let _ = std::fs::remove_file(&stats);
    run(
        "odp",
        &["odp"],
        &[
            ("MRCACHE_STATS", "json"),
            ("MRCACHE_STATS_FILE", stats.to_str().unwrap()),
        ],
    );
    let json = std::fs::read_to_string(&stats).unwrap();
    assert!(json.contains(r#""bypassed":{"on-demand":2}"#), "{json}");
}
