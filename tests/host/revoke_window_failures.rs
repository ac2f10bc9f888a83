//! `MRCACHE_REMOTE=revoke` off the happy path, on the host: a fake provider whose window
//! binds and completions the test controls (tests/c/host/revoke_after_unbind_timeout.c),
//! behind libmrcache.so and window_shim.so (the libibverbs calls that set up our QP, which
//! libibverbs itself cannot make on a fake context).

use crate::common;

use common::text;
use std::path::PathBuf;
use std::process::Command;

/// After one unbind timed out (its completion held back past the limit, then delivered
/// late), the next revoke on that PD must not return while its window's key still reaches
/// memory: it returned on the stale completion.
#[test]
fn a_revoke_after_a_timed_out_unbind_waits_for_its_own_key() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("revoke_window_failures");
    let (shim, prog) = common::shim_and_program(
        "host",
        "window_shim",
        "revoke_after_unbind_timeout",
        &dir,
        "late",
        &["-libverbs"],
    );
    let out = Command::new(&prog)
        .env("LD_PRELOAD", common::preload_with(&shim))
        .env("MRCACHE_MONITOR", "patch")
        .env("MRCACHE_REMOTE", "revoke")
        .env("MRCACHE_TEST_COMPLETION_LIMIT_MS", "200")
        .output()
        .unwrap();
    println!("{}", text(&out));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// `ibv_rereg_mr` of a revocable registration's handle (its rkey a window's) on a provider
/// with a rereg op: the app's only handle is re-registered by the provider, on
/// the cached MR with the app's rights, its window revoked, its dereg the MR's; a second
/// live handle is refused as a command the provider cannot carry out here (ERR_CMD,
/// EOPNOTSUPP). Before, both were refused (IBV_REREG_MR_ERR_INPUT, EINVAL).
#[test]
fn rereg_of_a_windows_handle_answers_as_the_provider() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("revoke_window_failures_rereg");
    let (shim, prog) = common::shim_and_program(
        "host",
        "window_shim",
        "rereg_revocable",
        &dir,
        "rereg",
        &["-libverbs"],
    );
    let mut failed = vec![];
    for scenario in [
        "sole", "shared", "refused", "noop", "own", "recycle", "shadow",
    ] {
        let out = Command::new(&prog)
            .arg(scenario)
            .env("LD_PRELOAD", common::preload_with(&shim))
            .env("MRCACHE_MONITOR", "patch")
            .env("MRCACHE_REMOTE", "revoke")
            .env(
                "MRCACHE_REMOTE_SUPERSET",
                if scenario == "own" { "1" } else { "0" },
            )
            .env("MRCACHE_STATS", "1")
            .output()
            .unwrap();
        let t = text(&out);
        println!("{t}");
        // Every sole rereg revokes its window: counted as a revoke (the dereg after it
        // revokes nothing more).
        let counted = scenario != "recycle" || t.contains("200 granted, 200 revoked");
        if out.status.code() != Some(0) || !t.contains(&format!("{scenario}: ok")) || !counted {
            failed.push(scenario);
        }
    }
    assert!(failed.is_empty(), "failed: {failed:?}");
}
