//! The registry of MRs that are not the cache's: an address left behind in it by
//! a nested `ibv_dereg_mr` must never make a cached MR's deregistration a pass-through's.

use crate::common;

use common::text;
use std::path::PathBuf;
use std::process::Command;

#[test]
fn a_nested_pass_through_dereg_never_frees_a_cached_mr() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nested_dereg");
    let (shim, prog) = common::shim_and_program(
        "host",
        "verbs_shim",
        "nested_dereg",
        &dir,
        "nested",
        &["-libverbs", "-ldl"],
    );
    let out = Command::new(&prog)
        .env(
            "LD_PRELOAD",
            format!("{} {}", common::lib().display(), shim.display()),
        )
        .env("MRCACHE_MONITOR", "patch")
        .env("MRCACHE_REMOTE", "bypass")
        .output()
        .unwrap();
    let t = text(&out);
    println!("{t}");
    assert_eq!(out.status.code(), Some(0), "{t}");
}
