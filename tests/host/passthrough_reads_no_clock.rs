//! What a registration passed through to libibverbs costs the preloaded process beyond
//! libibverbs' own call: no clock read on every call. In the TCG guest a
//! `clock_gettime` is a system call and an emulated HPET read (1.4-4.5 us against a 70 us
//! registration), and the admission figures' timing made every pass-through pay two to
//! four of them. Counted on the host (tests/c/host/pass_clock.c, a fake provider): the
//! reads the test thread made inside the pairs that passed through.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

/// (pairs passed through, clock reads in them, device-memory probes in them) of `scenario`.
fn run(scenario: &str, env: &[(&str, &str)]) -> (u64, u64, u64) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("passthrough_reads_no_clock")
        .join(scenario);
    let (shim, prog) = common::shim_and_program(
        "host",
        "verbs_shim",
        "pass_clock",
        &dir,
        scenario,
        &["-libverbs", "-ldl"],
    );
    let clock = common::build_in(
        "host",
        "clock_count.c",
        &dir,
        "libclock_count.so",
        &["-shared", "-fPIC"],
    );
    let out = Command::new(&prog)
        .arg(scenario)
        .env(
            "LD_PRELOAD",
            format!(
                "{} {} {}",
                common::lib().display(),
                clock.display(),
                shim.display()
            ),
        )
        .env("MRCACHE_MONITOR", "patch")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let line = common::result_line(&out, &format!("{scenario}: "));
    let n: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[0], n[2], n[3])
}

/// At most one clock read in two pass-through pairs (sampled timing: each of the few
/// places that time a pair reads the clock on about one call in `SAMPLE_EVERY` = 16,
/// about 0.375 a pair in the scan case); every pair read it two or more times before.
fn check(scenario: &str, passed: u64, reads: u64, at_least: u64) {
    assert!(
        passed >= at_least,
        "{scenario}: only {passed} pairs passed through (want {at_least} or more)"
    );
    assert!(
        reads * 2 <= passed,
        "{scenario}: {reads} clock reads in {passed} pairs passed through ({:.2} a pair; at most 0.5 allowed)",
        reads as f64 / passed as f64
    );
}

/// Under `bypass` a remote call is never timed: once the first call opened the lane
/// (`Lane::Bypass`) no pair reads the clock at all. (Seen failing before the lane took
/// them, when every remote call walked the full path and its sampled timings: "bypass:
/// 238 clock reads in 4000 pairs".)
#[test]
fn remote_bypass_reads_no_clock_per_call() {
    let (passed, reads, probes) = run("bypass", &[("MRCACHE_REMOTE", "bypass")]);
    check("bypass", passed, reads, 4000);
    assert!(
        reads * 1000 <= passed,
        "bypass: {reads} clock reads in {passed} pairs (the lane reads none)"
    );
    assert_eq!(
        probes, 0,
        "bypass: {probes} device-memory probes in {passed} pairs"
    );
}

#[test]
fn scan_passthrough_reads_no_clock_per_call() {
    let (passed, reads, probes) = run(
        "scan",
        &[("MRCACHE_ADMIT", "auto"), ("MRCACHE_MAX_ENTRIES", "8")],
    );
    check("scan", passed, reads, 2000);
    // The device-memory probe (process_vm_readv and two more system calls) is for a
    // registration the cache makes: the scan rule's pass-throughs are as without the cache.
    assert_eq!(
        probes, 0,
        "scan: {probes} device-memory probes in {passed} pairs passed through"
    );
}
