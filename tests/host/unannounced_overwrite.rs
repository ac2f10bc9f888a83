//! A write over our munmap jump that no watched call announces
//! (/proc/self/mem; a raw-syscall mprotect, store, mprotect back) must not let a miss be
//! cached and later served stale (tests/c/host/overwrite_unannounced.c).

use crate::common;

use common::text;
use std::path::PathBuf;

fn run(scenario: &str) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("unannounced_overwrite");
    let out = common::fake_scenario(&dir, "overwrite_unannounced", scenario, &[]);
    println!("{}", text(&out));
    assert_eq!(out.status.code(), Some(0), "{scenario}: {}", text(&out));
}

#[test]
fn a_miss_after_an_unannounced_overwrite_is_not_cached_procmem() {
    run("procmem");
}

#[test]
fn a_miss_after_an_unannounced_overwrite_is_not_cached_rawsys() {
    run("rawsys");
}
