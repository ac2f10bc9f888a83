//! A protection change that takes access away drops the cached registrations of its range,
//! on the host, without RDMA: a fake provider (`tests/c/host/fake_protect.c`) refuses to pin
//! for writing a page the process cannot write, as the kernel does, so a registration
//! after `mprotect(PROT_READ)` fails with EFAULT as without the cache instead of a hit on
//! pages the NIC would write.

use crate::common;

use common::{lib, text};
use std::path::PathBuf;
use std::process::Command;

/// Builds `fake_protect.c` into `out` (one binary per test: tests run in parallel).
fn build(out: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mprotect_drops_entries");
    let flags = [
        "-Wno-unused-parameter",
        "-Wno-cast-function-type",
        "-libverbs",
        "-ldl",
    ];
    common::build_host("fake_protect.c", &dir, out, &flags)
}

/// Runs `fake_protect args` preloaded (libibverbs cannot run the fake context alone; the
/// program checks that the fake provider itself refuses): exit status and output.
fn run(out: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(build(out))
        .args(args)
        .env("LD_PRELOAD", lib())
        .env("MRCACHE_MONITOR", "patch")
        .output()
        .unwrap();
    (out.status.code(), text(&out))
}

fn refused_after(how: &str) {
    let (rc, out) = run(&format!("fake_protect_{how}"), &[how]);
    assert_eq!(rc, Some(0), "{out}");
}

#[test]
fn registering_for_write_after_mprotect_read_fails_as_without_the_cache() {
    refused_after("mprotect");
}

#[test]
fn registering_for_write_after_pkey_mprotect_read_fails_as_without_the_cache() {
    refused_after("pkey_mprotect");
}

#[test]
fn registering_for_write_after_libc_own_mprotect_fails_as_without_the_cache() {
    refused_after("libc_mprotect");
}

/// A JIT toggling another page between RW and RX keeps every hit on the buffer.
#[test]
fn mprotect_of_another_page_keeps_the_hits() {
    let (rc, out) = run("fake_protect_storm", &["storm", "2000"]);
    assert_eq!(rc, Some(0), "{out}");
    println!("{out}");
    assert!(out.contains("registrations 1\n"), "{out}");
}
