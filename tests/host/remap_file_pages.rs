//! `remap_file_pages` over a registered shared file mapping is reported.
//! Host test: a fake provider counts registrations (tests/c/host/remap_file_pages.c),
//! libmrcache.so preloaded with the patch monitor.

use crate::common;

use common::{lib, text};
use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn remap_file_pages_over_a_registered_mapping_is_reported() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("remap_file_pages");
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/host/remap_file_pages.c");
    let prog = dir.join("remap_file_pages");
    common::cc(&[
        "-o",
        prog.to_str().unwrap(),
        src.to_str().unwrap(),
        // The fake provider stores its ops through libibverbs' `void *(*)(void)` slots;
        // remap_file_pages is deprecated in glibc's header, and called on purpose here.
        "-Wno-cast-function-type",
        "-Wno-deprecated-declarations",
        "-libverbs",
    ]);
    let out = Command::new("timeout")
        .args(["-s", "KILL", "30"])
        .arg(&prog)
        .env("LD_PRELOAD", lib())
        .env("MRCACHE_MONITOR", "patch")
        .output()
        .unwrap();
    match out.status.code() {
        Some(0) => {}
        Some(77) => println!("skipped: {}", text(&out)),
        Some(1) => panic!("remap_file_pages was not reported:\n{}", text(&out)),
        _ => panic!("remap_file_pages: {}:\n{}", out.status, text(&out)),
    }
}
