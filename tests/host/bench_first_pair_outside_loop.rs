//! The rxe benchmarks' timed loops hold no one-time set-up. The preload sets
//! itself up at the process's first registration (configuration, libc patching, the
//! self-test, the drain thread: 91-134 ms in the rxe guest on the Xeon host at load 6-9),
//! and bench/regmr.c and bench/evict.c timed that first pair inside their 1 s loops: every
//! pass-through (`MRCACHE_REMOTE=bypass`) measured 0.54-0.8x libibverbs alone whatever the
//! per-call cost. Now each makes its first pair before the loop and prints it apart
//! (`first_pair_ns`).
//!
//! Run unmodified on the host behind libmrcache.so, verbs_shim.so (the calls passed
//! through) and fake_device.so (a device, context and PD whose provider registers nothing),
//! with the test-only `MRCACHE_TEST_INIT_DELAY_MS` stalling the set-up: the first pair
//! holds the whole stall (a lower bound: the stall is a sleep), and the loop's own time
//! (iters x ns_per_pair, 10 ms asked) holds none of it (an upper bound at 1/200 of the
//! stall: only a 2 s pause of the whole process could break it).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

const STALL_MS: u64 = 2000;

fn build(dir: &Path) -> (String, PathBuf, PathBuf) {
    let flags = ["-Wno-unused-parameter", "-Wno-cast-function-type"];
    let root = env!("CARGO_MANIFEST_DIR");
    let shim = common::build_in(
        "host",
        "verbs_shim.c",
        dir,
        "libverbs_shim.so",
        &[
            &flags[..],
            &[
                "-shared",
                "-fPIC",
                &format!("-Wl,--version-script={root}/tests/c/host/verbs_shim.map"),
            ],
        ]
        .concat(),
    );
    let device = common::build_in(
        "host",
        "fake_device.c",
        dir,
        "libfake_device.so",
        &[
            &flags[..],
            &[
                "-shared",
                "-fPIC",
                &format!("-Wl,--version-script={root}/tests/c/host/fake_device.map"),
            ],
        ]
        .concat(),
    );
    let bench = |name: &str| {
        common::build_in(
            "../../bench",
            &format!("{name}.c"),
            dir,
            name,
            &["-O2", "-D_GNU_SOURCE", "-libverbs"],
        )
    };
    let preload = format!(
        "{} {} {}",
        common::lib().display(),
        shim.display(),
        device.display()
    );
    (preload, bench("regmr"), bench("evict"))
}

/// The BENCH line's fields of `prog args` run with the set-up stalled.
fn run(prog: &Path, args: &[&str], env: &[(&str, &str)], preload: &str) -> Vec<(String, f64)> {
    let out = Command::new(prog)
        .args(args)
        .env("LD_PRELOAD", preload)
        .env("MRCACHE_TEST_INIT_DELAY_MS", STALL_MS.to_string())
        .env("MRCACHE_STATS", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let line = common::result_line(&out, "BENCH ");
    line.split_whitespace()
        .filter_map(|w| {
            let (k, v) = w.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn field(fields: &[(String, f64)], name: &str) -> Option<f64> {
    fields.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
}

fn check(what: &str, fields: &[(String, f64)]) {
    let stall = STALL_MS as f64 * 1e6;
    let first = field(fields, "first_pair_ns").unwrap_or_else(|| {
        panic!("{what}: no first_pair_ns: the first pair is not reported apart")
    });
    assert!(
        first >= stall,
        "{what}: the first pair took {first} ns, less than the set-up's stall of {stall} ns"
    );
    let loop_ns = field(fields, "iters").unwrap() * field(fields, "ns_per_pair").unwrap();
    assert!(
        loop_ns < stall,
        "{what}: the timed loop took {loop_ns} ns for 10 ms asked: it holds the set-up's stall ({stall} ns)"
    );
}

#[test]
fn the_benchmarks_time_no_set_up() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench_first_pair_outside_loop");
    let (preload, regmr, evict) = build(&dir);
    let f = run(&regmr, &["0.01", "local", "4k"], &[], &preload);
    check("regmr local 4k (cached)", &f);
    let f = run(
        &regmr,
        &["0.01", "remote", "4k"],
        &[("MRCACHE_REMOTE", "bypass")],
        &preload,
    );
    check("regmr remote 4k, MRCACHE_REMOTE=bypass", &f);
    let f = run(
        &evict,
        &["8", "0.01", "cyclic", "65536", "local"],
        &[("MRCACHE_MAX_ENTRIES", "4")],
        &preload,
    );
    check("evict cyclic 8 x 64Ki through 4 entries", &f);
}
