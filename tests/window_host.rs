//! `MRCACHE_REMOTE=revoke` off the happy path, on the host: a fake provider whose window
//! binds and completions the test controls (tests/c/host/w6_late.c), behind libmrcache.so
//! and w6_shim.so (the libibverbs calls that set up our QP, which libibverbs itself cannot
//! make on a fake context).

mod common;

use common::{lib, text};
use std::path::PathBuf;
use std::process::Command;

/// After one unbind timed out (its completion held back past the limit, then delivered
/// late), the next revoke on that PD must not return while its window's key still reaches
/// memory: it returned on the stale completion (issue 20, W6).
#[test]
fn a_revoke_after_a_timed_out_unbind_waits_for_its_own_key() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("window_host");
    let flags = ["-Wno-unused-parameter", "-Wno-cast-function-type"];
    let map = format!(
        "-Wl,--version-script={}/tests/c/host/w6_shim.map",
        env!("CARGO_MANIFEST_DIR")
    );
    let shim = common::build_host(
        "w6_shim.c",
        &dir,
        "libw6_shim.so",
        &[&flags[..], &["-shared", "-fPIC", &map]].concat(),
    );
    let prog = common::build_host(
        "w6_late.c",
        &dir,
        "w6_late",
        &[&flags[..], &["-libverbs"]].concat(),
    );
    let out = Command::new(&prog)
        .env(
            "LD_PRELOAD",
            format!("{} {}", lib().display(), shim.display()),
        )
        .env("MRCACHE_MONITOR", "patch")
        .env("MRCACHE_REMOTE", "revoke")
        .env("MRCACHE_TEST_COMPLETION_LIMIT_MS", "200")
        .output()
        .unwrap();
    println!("{}", text(&out));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
