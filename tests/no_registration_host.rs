//! A process under the preload that never registers memory pays nothing but the loader's
//! work: glibc's libmemusage counts the same allocations with and without the preload
//! (tests/c/host/untouched_libc.c).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

const MEMUSAGE: &str = "/lib/x86_64-linux-gnu/libmemusage.so";

/// libmemusage's summary of `program args`, preloaded alone or before libmrcache.so.
fn memusage(program: &Path, args: &[&str], with_mrcache: bool) -> String {
    let mut preload = MEMUSAGE.to_string();
    if with_mrcache {
        preload = format!("{preload}:{}", common::lib().display());
    }
    let out = Command::new(program)
        .args(args)
        .env("LD_PRELOAD", preload)
        .env_remove("MEMUSAGE_OUTPUT")
        .env_remove("MEMUSAGE_PROG_NAME")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `/bin/true`, and untouched_libc.c's memory calls (which the hooks see): libmemusage's
/// summary (glibc's; it reports from a destructor, so a program that closes stderr at exit
/// or leaves by `_exit`, as coreutils and dash do, shows nothing) is the same.
#[test]
fn libmemusage_counts_the_same_allocations_with_and_without_the_preload() {
    if !Path::new(MEMUSAGE).exists() {
        println!("skipped: no {MEMUSAGE} (glibc's libc6 on Debian amd64)");
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no_registration_host");
    let (_, idle) = common::shim_and_program(
        "host",
        "verbs_shim",
        "untouched_libc",
        &dir,
        "memusage",
        &["-libverbs", "-ldl"],
    );
    // (`/bin/true` with an argument closes stderr at exit.)
    for (program, args) in [(Path::new("/bin/true"), &[][..]), (&idle, &["idle"][..])] {
        let plain = memusage(program, args, false);
        let preloaded = memusage(program, args, true);
        assert!(
            plain.contains("Memory usage summary"),
            "{}: no summary: {plain}",
            program.display()
        );
        assert_eq!(
            plain,
            preloaded,
            "{}: libmemusage's summary differs",
            program.display()
        );
    }
}
