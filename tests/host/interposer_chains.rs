//! Interposer chains are kept and `posix_madvise` leaves errno alone, on the
//! host. A memory interposer (glibc's libmemusage, `tests/c/host/
//! chain_interposer.c`) counts the same calls with libmrcache.so preloaded before or after
//! it as without it; a `munmap` the program defines itself (MVAPICH2's mem_hooks) gets every
//! call; and the cache still sees each unmap that went through the chain (a fake provider
//! counts registrations, as in `tests/c/host/fake_zap.c`).

use crate::common;

use common::{lib, text};
use std::path::{Path, PathBuf};
use std::process::Command;

const MEMUSAGE: &str = "/lib/x86_64-linux-gnu/libmemusage.so";

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("interposer_chains")
}

/// Builds `tests/c/host/SRC` into `out` (one output per test: tests run in parallel).
fn build(src: &str, out: &str, flags: &[&str]) -> PathBuf {
    let dir = dir();
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c/host")
        .join(src);
    let out = dir.join(out);
    // The fake provider stores its ops through libibverbs' `void *(*)(void)` slots.
    let mut args = vec![
        "-Wno-unused-parameter",
        "-Wno-cast-function-type",
        "-o",
        out.to_str().unwrap(),
        src.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    common::cc(&args);
    out
}

fn interposer(out: &str, tag: &str) -> PathBuf {
    let define = format!("-DCHAIN_TAG=\"{tag}\"");
    build(
        "chain_interposer.c",
        out,
        &["-shared", "-fPIC", &define, "-ldl"],
    )
}

/// Runs `prog args` with `preload` (joined with ':') and `env`: exit status and output.
fn run(prog: &Path, args: &[&str], preload: &[&Path], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(prog);
    cmd.args(args).env_remove("LD_PRELOAD");
    if !preload.is_empty() {
        let list: Vec<_> = preload.iter().map(|p| p.to_str().unwrap()).collect();
        cmd.env("LD_PRELOAD", list.join(":"));
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (out.status.code().unwrap_or(-1), text(&out))
}

/// The lines of `out` that start with `prefix` (colour codes removed).
fn lines_with(out: &str, prefix: &str) -> Vec<String> {
    out.lines()
        .map(strip_colour)
        .filter(|l| l.trim_start().starts_with(prefix))
        .collect()
}

fn strip_colour(line: &str) -> String {
    let mut s = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            s.push(c);
        }
    }
    s
}

/// The interposer's summary line (it prints one at exit).
fn counts(out: &str, tag: &str) -> String {
    let l = lines_with(out, &format!("{tag}:"));
    assert_eq!(l.len(), 1, "one summary line from {tag} expected:\n{out}");
    l[0].clone()
}

/// The monitors a chain is checked under: the default (libc patched) and symbols only.
const MONITORS: [&str; 2] = ["patch", "symbols"];

#[test]
fn a_test_interposer_counts_the_same_calls_with_mrcache_before_or_after_it() {
    let prog = build("chain_calls.c", "chain_calls_interposer", &[]);
    let so = interposer("libchain_interposer.so", "interposer");
    let (rc, out) = run(&prog, &[], &[&so], &[]);
    assert_eq!(rc, 0, "{out}");
    let alone = counts(&out, "interposer");
    // The program's own calls reach it: 5 rounds of each (3 munmap, 3 mmap-like and 2
    // mprotect a round).
    for count in [
        " munmap=15 ",
        " mprotect=10 ",
        " pkey_mprotect=5 ",
        " posix_madvise=5 ",
        " process_madvise=5 ",
        " remap_file_pages=5",
    ] {
        assert!(alone.contains(count), "{count}: {alone}");
    }
    let ours = lib();
    for monitor in MONITORS {
        for (order, preload) in [
            ("mrcache first", [ours.as_path(), so.as_path()]),
            ("mrcache last", [so.as_path(), ours.as_path()]),
        ] {
            let (rc, out) = run(&prog, &[], &preload, &[("MRCACHE_MONITOR", monitor)]);
            assert_eq!(rc, 0, "{order}, {monitor}: {out}");
            assert_eq!(
                counts(&out, "interposer"),
                alone,
                "{order}, MRCACHE_MONITOR={monitor}: the interposer's counts differ from \
                 its counts without mrcache"
            );
        }
    }
}

#[test]
fn two_interposers_around_mrcache_count_the_same_calls() {
    let prog = build("chain_calls.c", "chain_calls_two", &[]);
    let a = interposer("libchain_a.so", "first");
    let b = interposer("libchain_b.so", "second");
    let (rc, out) = run(&prog, &[], &[&a, &b], &[]);
    assert_eq!(rc, 0, "{out}");
    let alone = (counts(&out, "first"), counts(&out, "second"));
    let ours = lib();
    for (order, preload) in [
        (
            "mrcache, first, second",
            [ours.as_path(), a.as_path(), b.as_path()],
        ),
        (
            "first, second, mrcache",
            [a.as_path(), b.as_path(), ours.as_path()],
        ),
        (
            "first, mrcache, second",
            [a.as_path(), ours.as_path(), b.as_path()],
        ),
    ] {
        let (rc, out) = run(&prog, &[], &preload, &[]);
        assert_eq!(rc, 0, "{order}: {out}");
        assert_eq!(
            (counts(&out, "first"), counts(&out, "second")),
            alone,
            "{order}: the interposers' counts differ from theirs without mrcache"
        );
    }
}

#[test]
fn libmemusage_counts_the_same_mmaps_and_munmaps_with_mrcache_before_or_after_it() {
    if !Path::new(MEMUSAGE).exists() {
        println!("skipped: no {MEMUSAGE}");
        return;
    }
    let prog = build("chain_calls.c", "chain_calls_memusage", &[]);
    let memusage = Path::new(MEMUSAGE);
    let env = [("MEMUSAGE_TRACE_MMAP", "1")];
    let summary = |out: &str| {
        let mut l = Vec::new();
        for p in ["mmap(", "mremap|", "munmap|"] {
            l.extend(lines_with(out, p));
        }
        l
    };
    let (rc, out) = run(&prog, &[], &[memusage], &env);
    assert_eq!(rc, 0, "{out}");
    let alone = summary(&out);
    assert_eq!(
        alone.len(),
        5,
        "libmemusage's mmap summary expected:\n{out}"
    );
    assert!(
        alone
            .iter()
            .any(|l| l.trim_start().starts_with("munmap|") && l.contains(" 15 ")),
        "{alone:?}"
    );
    let ours = lib();
    for (order, preload) in [
        ("mrcache first", [ours.as_path(), memusage]),
        ("mrcache last", [memusage, ours.as_path()]),
    ] {
        let (rc, out) = run(&prog, &[], &preload, &env);
        assert_eq!(rc, 0, "{order}: {out}");
        assert_eq!(
            summary(&out),
            alone,
            "{order}: libmemusage's mmap counts differ from its counts without mrcache"
        );
    }
}

#[test]
fn the_cache_sees_unmaps_that_went_through_an_interposer() {
    let prog = build("chain_zap.c", "chain_zap", &["-libverbs"]);
    let so = interposer("libchain_interposer_zap.so", "interposer");
    let ours = lib();
    let mut chains: Vec<(&str, Vec<&Path>)> = vec![
        ("mrcache, interposer", vec![&ours, &so]),
        ("interposer, mrcache", vec![&so, &ours]),
    ];
    if Path::new(MEMUSAGE).exists() {
        chains.push(("mrcache, libmemusage", vec![&ours, Path::new(MEMUSAGE)]));
        chains.push(("libmemusage, mrcache", vec![Path::new(MEMUSAGE), &ours]));
    }
    for (name, preload) in &chains {
        for how in ["munmap", "madvise", "mprotect"] {
            let (rc, out) = run(&prog, &[how], preload, &[]);
            assert_eq!(rc, 0, "{name}: {how} not reported: {out}");
        }
    }
}

#[test]
fn a_munmap_defined_in_the_program_gets_every_call() {
    let prog = build(
        "chain_zap.c",
        "chain_zap_own_munmap",
        &["-DOWN_MUNMAP", "-libverbs", "-ldl"],
    );
    let so = interposer("libchain_interposer_own.so", "interposer");
    let own = |out: &str| lines_with(out, "own munmap:");
    let (rc, out) = run(&prog, &["count"], &[], &[]);
    assert_eq!(rc, 0, "{out}");
    let alone = own(&out);
    assert_eq!(alone, ["own munmap: 5"], "{out}");
    let ours = lib();
    for preload in [vec![ours.as_path()], vec![&ours, &so], vec![&so, &ours]] {
        let (rc, out) = run(&prog, &["count"], &preload, &[]);
        assert_eq!(rc, 0, "{preload:?}: {out}");
        assert_eq!(own(&out), alone, "{preload:?}: {out}");
        // With registrations: the program's munmap sees each of its 10 calls and the
        // cache each unmap (a second registration after every one).
        let (rc, out) = run(&prog, &["munmap"], &preload, &[]);
        assert_eq!(rc, 0, "{preload:?}: unmaps not reported: {out}");
        assert_eq!(own(&out), ["own munmap: 10"], "{preload:?}: {out}");
    }
}

#[test]
fn posix_madvise_returns_the_error_and_leaves_errno_alone() {
    let prog = build("chain_posix_madvise.c", "chain_posix_madvise", &[]);
    // glibc's own behaviour first: the check is right.
    let (rc, out) = run(&prog, &[], &[], &[]);
    assert_eq!(rc, 0, "without mrcache: {out}");
    let ours = lib();
    let (rc, out) = run(&prog, &[], &[&ours], &[]);
    assert_eq!(rc, 0, "with mrcache: {out}");
}
