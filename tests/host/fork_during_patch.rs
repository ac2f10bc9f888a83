//! A fork while another thread's first registration is patching libc: the child, whose
//! libc is as libc was when no jump was written yet, patches it at its own first
//! registration and caches, instead of finding the patch "started" (the flag inherited from
//! the parent) and turning caching off at its self-test (tests/c/host/fork_during_patch.c).

use crate::common;

use common::{lib, text};
use std::path::PathBuf;
use std::process::Command;

/// 20 processes, each forking for as long as its first registration runs (about three
/// children each, one or more of them forked inside the patch's membarrier registration).
#[test]
fn a_child_forked_before_the_first_jump_patches_libc_itself() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fork_while_patching");
    let flags = [
        "-Wno-unused-parameter",
        "-Wno-cast-function-type",
        "-libverbs",
        "-lpthread",
    ];
    let prog = common::build_host("fork_during_patch.c", &dir, "fork_during_patch", &flags);
    let (mut forks, mut cached) = (0, 0);
    for run in 0..20 {
        let out = Command::new("timeout")
            .args(["-s", "KILL", "60"])
            .arg(&prog)
            .env("LD_PRELOAD", lib())
            .env("MRCACHE_MONITOR", "patch")
            .output()
            .unwrap();
        let all = text(&out);
        assert_eq!(out.status.code(), Some(0), "run {run}: {all}");
        assert!(
            !all.contains("does not see: munmap inside libc"),
            "run {run}: a child inherited a patch in progress and left libc unpatched: {all}"
        );
        let counts = all
            .lines()
            .find_map(|l| l.strip_prefix("forks "))
            .expect(&all)
            .to_string();
        let (f, c) = counts.split_once(", children that cached ").expect(&all);
        forks += f.parse::<u32>().unwrap();
        cached += c.parse::<u32>().unwrap();
    }
    println!("{forks} children forked, {cached} cached");
}
