//! Memory the CPU cannot read (device memory behind a peer-memory client) is never cached:
//! checked on the host with a fake provider that accepts any address
//! (tests/c/host/dev_memory.c) behind libmrcache.so and verbs_shim.so.

use crate::common;

use common::text;
use std::path::PathBuf;
use std::process::Command;

/// Runs `dev_memory SCENARIO`: asserts it exits 0 and returns its report's `bypassed` map.
fn run(scenario: &str) -> serde_json::Value {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("device_memory_not_cached");
    let (shim, prog) = common::shim_and_program(
        "host",
        "verbs_shim",
        "dev_memory",
        &dir,
        scenario,
        &["-libverbs"],
    );
    let stats = dir.join(format!("stats.{scenario}.json"));
    let _ = std::fs::remove_file(&stats);
    let out = Command::new(&prog)
        .arg(scenario)
        .env("LD_PRELOAD", common::preload_with(&shim))
        .env("MRCACHE_MONITOR", "patch")
        .env("MRCACHE_STATS", "json")
        .env("MRCACHE_STATS_FILE", &stats)
        .output()
        .unwrap();
    println!("{}", text(&out));
    if out.status.code() == Some(77) {
        return serde_json::Value::Null;
    }
    assert_eq!(out.status.code(), Some(0), "{scenario}: {}", text(&out));
    let report = std::fs::read_to_string(&stats).expect("stats file");
    let v: serde_json::Value = serde_json::from_str(report.trim()).expect("one JSON report");
    v["bypassed"].clone()
}

/// 64 KiB inside a `PROT_NONE` reservation (how CUDA reserves device memory's addresses),
/// registered twice: both reach the provider, counted as `device-memory`.
#[test]
fn a_prot_none_range_is_passed_through_every_time() {
    let b = run("prot_none");
    if b.is_null() {
        // qemu-user (ci/aarch64 test) answers process_vm_readv with ENOSYS: the library then
        // takes every range as readable, as under a seccomp filter that refuses it.
        println!("skipped: process_vm_readv is not implemented here");
        return;
    }
    assert_eq!(b["device-memory"], 2, "{b}");
}

/// The same where nothing is mapped at all.
#[test]
fn an_unmapped_range_is_passed_through_every_time() {
    let b = run("unmapped");
    assert_eq!(b["device-memory"], 2, "{b}");
}

/// The first page of `[vvar]`: the kernel's own `VM_IO | VM_PFNMAP` mapping, readable by
/// the CPU but refused by get_user_pages, as a device's mapping is.
#[test]
fn a_pfnmap_range_is_passed_through_every_time() {
    let b = run("vvar");
    if b.is_null() {
        println!("skipped: no [vvar] mapping");
        return;
    }
    assert_eq!(b["device-memory"], 2, "{b}");
}

/// The control: ordinary memory is still cached (the second registration is a hit).
#[test]
fn readable_memory_is_still_cached() {
    let b = run("readable");
    assert!(b.get("device-memory").is_none_or(|n| n == 0), "{b}");
}
