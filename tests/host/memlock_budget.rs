//! The locked-memory limit through libmrcache.so and the fake provider of
//! tests/c/host/memlock_budget.c, which charges each registration the pages it spans against
//! a budget (RLIMIT_MEMLOCK without CAP_IPC_LOCK, as the program sets for itself): the cache
//! never fails a registration that the fake provider alone makes.

use crate::common;

use common::line;
use std::path::PathBuf;
use std::process::Command;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("memlock_budget")
}

fn run(mode: &str, env: &[(&str, &str)]) -> String {
    let out = common::fake_scenario(&dir(), "memlock_budget", mode, env);
    let t = common::text(&out);
    println!("{t}");
    assert_eq!(out.status.code(), Some(0), "{t}");
    t
}

/// A 4 KiB registration inside an idle cached 2 MiB one, kept, then another 2 MiB buffer
/// under a 3 MiB limit: libibverbs pins 4 KiB + 2 MiB and succeeds; so must the cache (a
/// containing hit would keep all of the first 2 MiB pinned while the 4 KiB handle lives).
#[test]
fn a_kept_registration_inside_an_idle_one_leaves_room_for_the_next() {
    for shadow in ["1", "0"] {
        let out = run(
            "scenario",
            &[("MRCACHE_ADMIT", "always"), ("MRCACHE_SHADOW", shadow)],
        );
        assert_eq!(
            line(&out, "scenario:"),
            "scenario: small 1 big 1 errno 0 pinned 2101248",
            "MRCACHE_SHADOW={shadow}"
        );
    }
}

/// An idle entry whose memory went away is being deregistered by the background drain
/// (slowly) when a registration fails for its pages: the retry waits for it, as libibverbs
/// alone had given those pages back at the app's deregistration.
#[test]
fn a_registration_waits_for_a_deregistration_in_flight() {
    let out = run("drain", &[("MRCACHE_ADMIT", "always")]);
    assert_eq!(line(&out, "drain:"), "drain: big 1 errno 0");
}

/// Where pins are not charged (CAP_IPC_LOCK), a range inside a cached one still hits it.
#[test]
fn without_a_charged_limit_a_containing_range_still_hits() {
    let out = run("uncharged", &[("MRCACHE_ADMIT", "always")]);
    assert_eq!(line(&out, "uncharged:"), "uncharged: shares 1");
}

/// Seeded sequences of registrations and deregistrations under seeded budgets: every
/// registration the fake provider alone makes succeeds under the preload (a failure the
/// cache turns into a success, by sharing one registration between handles, is released at
/// once so both runs hold the same handles).
#[test]
fn random_sequences_fail_only_where_the_provider_alone_fails() {
    let configs: [&[(&str, &str)]; 3] = [
        &[("MRCACHE_ADMIT", "always"), ("MRCACHE_REMOTE", "keep")],
        &[
            ("MRCACHE_ADMIT", "always"),
            ("MRCACHE_REMOTE", "keep"),
            ("MRCACHE_REMOTE_SUPERSET", "1"),
        ],
        &[],
    ];
    let seeds: u64 = std::env::var("MEMLOCK_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    // The reference runs the same program with the shim only.
    let (shim, prog) = common::shim_and_program(
        "host",
        "verbs_shim",
        "memlock_budget",
        &dir(),
        "random",
        &["-libverbs", "-ldl", "-lpthread"],
    );
    let (mut ref_failures, mut better) = (0, 0);
    for seed in 1..=seeds {
        let reference = Command::new(&prog)
            .args(["random", &seed.to_string()])
            .env("LD_PRELOAD", &shim)
            .output()
            .unwrap();
        assert_eq!(reference.status.code(), Some(0), "seed {seed}");
        let ref_text = String::from_utf8_lossy(&reference.stdout).into_owned();
        ref_failures += ref_text.lines().filter(|l| l.contains(" fail ")).count();
        let ref_path = dir().join(format!("reference_{seed}"));
        std::fs::write(&ref_path, &ref_text).unwrap();
        for env in configs {
            let out = Command::new(&prog)
                .args(["random", &seed.to_string(), ref_path.to_str().unwrap()])
                .env("LD_PRELOAD", common::preload_with(&shim))
                .env("MRCACHE_MONITOR", "patch")
                .envs(env.iter().copied())
                .output()
                .unwrap();
            let t = common::text(&out);
            assert_eq!(out.status.code(), Some(0), "seed {seed} {env:?}: {t}");
            let l = line(&t, "random:");
            let worse: u32 = l
                .split(" worse ")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(worse, 0, "seed {seed} {env:?}: {t}");
            better += l
                .split(" better ")
                .nth(1)
                .unwrap()
                .trim()
                .parse::<u32>()
                .unwrap();
        }
    }
    println!(
        "{seeds} seeds x 3 configurations: {ref_failures} reference failures, {better} turned into successes"
    );
    // The budgets bite: the sequences reach the limit.
    assert!(ref_failures > 0);
}
