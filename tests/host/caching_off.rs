//! A process whose cache is off goes straight to libibverbs (`CACHING_OFF`): with
//! `MRCACHE_ENABLE=0` or a bad value, every registration and deregistration of
//! tests/c/host/caching_off.c (200 pairs, the last 100 from two threads) reaches libibverbs
//! (verbs_shim.so counts them), and `ibv_dereg_mr(NULL)` is still EINVAL, not a crash. With
//! the cache on, the same pairs are cached: no registration reaches libibverbs.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

/// (registrations, deregistrations that reached libibverbs, dereg(NULL)'s return).
fn run(tag: &str, env: &[(&str, &str)]) -> (i64, i64, i64) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("caching_off");
    let (shim, prog) = common::shim_and_program(
        "host",
        "verbs_shim",
        "caching_off",
        &dir,
        tag,
        &["-libverbs", "-ldl", "-lpthread"],
    );
    let out = Command::new(&prog)
        .env(
            "LD_PRELOAD",
            format!("{} {}", common::lib().display(), shim.display()),
        )
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let line = common::result_line(&out, "caching_off: ");
    let n: Vec<i64> = line
        .split(|c: char| !c.is_ascii_digit() && c != '-')
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[0], n[1], n[2])
}

#[test]
fn a_process_with_the_cache_off_registers_every_call_through_libibverbs() {
    for (tag, env) in [
        ("enable0", [("MRCACHE_ENABLE", "0")]),
        ("bad_value", [("MRCACHE_MAX_ENTRIES", "lots")]),
    ] {
        let (regs, deregs, null) = run(tag, &env);
        assert_eq!((regs, deregs), (200, 200), "{tag}");
        assert_eq!(null, libc::EINVAL as i64, "{tag}");
    }
    // The same program with the cache on: cached, so libibverbs sees none of it.
    let (regs, deregs, null) = run("on", &[("MRCACHE_MONITOR", "patch")]);
    assert_eq!((regs, deregs), (0, 0));
    assert_eq!(null, libc::EINVAL as i64);
}
