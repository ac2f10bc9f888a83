//! Patching libc while other threads run: threads that a library's constructor started
//! before ours, looping through libc's munmap, madvise, mmap, mremap, brk, sbrk, shmat and
//! shmdt entry points while the first registration writes our jumps (a program without
//! verbs, which leaves libc unpatched, runs as without the preload), and a
//! thread calling munmap through another patcher's jump while the first registration takes
//! it back. No run may crash; a verbs program either caches or fails closed with one line
//! that says why, and never gets a stale hit. Many short bounded runs (counts below).

use crate::common;

use common::{lib, text};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("patch_under_threads")
}

fn src(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(name)
        .display()
        .to_string()
}

/// libpatch_hammer.so and a program `prog` linked with it (one build per test: tests run
/// in parallel, and a file being written cannot be executed).
fn build(prog: &str, out: &str, extra: &[&str]) -> (PathBuf, PathBuf) {
    let d = dir().join(out);
    std::fs::create_dir_all(&d).unwrap();
    let lib = d.join("libpatch_hammer.so");
    common::cc(&[
        "-shared",
        "-fPIC",
        "-pthread",
        "-o",
        lib.to_str().unwrap(),
        &src("host/patch_hammer_lib.c"),
    ]);
    let exe = d.join(out);
    let rpath = format!("-Wl,-rpath,{}", d.display());
    let prog_src = src(prog);
    let mut args = vec![
        "-o",
        exe.to_str().unwrap(),
        &prog_src,
        "-L",
        d.to_str().unwrap(),
        "-lpatch_hammer",
        &rpath,
    ];
    args.extend_from_slice(extra);
    common::cc(&args);
    (exe, d)
}

/// Runs `exe args` `n` times under the preload with `env`; calls `check` on each run's
/// (status, stdout, stderr). Returns the seconds taken.
fn runs(
    exe: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    n: usize,
    check: impl Fn(usize, Option<i32>, &str, &str),
) -> f64 {
    let t = Instant::now();
    for i in 0..n {
        let out = Command::new(exe)
            .args(args)
            .envs(env.iter().copied())
            .env("LD_PRELOAD", lib())
            .output()
            .unwrap();
        check(
            i,
            out.status.code(),
            &String::from_utf8_lossy(&out.stdout),
            &String::from_utf8_lossy(&out.stderr),
        );
        if out.status.code().is_none() {
            panic!("run {i} of {n}: killed: {:?}: {}", out.status, text(&out));
        }
    }
    t.elapsed().as_secs_f64()
}

#[test]
fn threads_running_while_libc_is_patched_are_not_disturbed() {
    let (exe, _) = build("host/patch_hammer.c", "patch_hammer", &[]);
    let plain = Command::new(&exe)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert_eq!(text(&plain), "ok ran\n");
    let n = 200;
    let secs = runs(&exe, &[], &[], n, |i, status, out, err| {
        assert_eq!(
            (status, out, err),
            (Some(0), "ok ran\n", ""),
            "run {i}: differs from the plain run"
        );
    });
    println!("{n} runs with 7 threads in libc's patched calls: {secs:.1} s");
}

/// What a verbs run of patch_hammer_verbs may print: a hit or a miss (the threads' unmaps
/// can overflow the invalidation queue, which then drops everything), never stale; when not
/// caching, one line that says why.
fn cached_or_closed(i: usize, status: Option<i32>, out: &str, err: &str, why: &str) {
    assert_eq!(status, Some(0), "run {i}: {out}{err}");
    let words: Vec<&str> = out.split_whitespace().collect();
    assert!(
        matches!(words[..], ["hit" | "miss", "seen", "ran"]),
        "run {i}: {out}{err}"
    );
    let lines: Vec<&str> = err.lines().filter(|l| !l.starts_with("patcher:")).collect();
    match lines[..] {
        [] => {}
        [line] => assert!(
            line.contains("caching is OFF") && line.contains(why),
            "run {i}: unexpected line: {line}"
        ),
        _ => panic!("run {i}: more than one line: {err}"),
    }
}

#[test]
fn a_verbs_program_whose_threads_ran_at_load_caches_or_fails_closed() {
    let (exe, _) = build(
        "host/patch_hammer_verbs.c",
        "patch_hammer_verbs",
        &["-Wno-cast-function-type", "-libverbs"],
    );
    let n = 100;
    let secs = runs(&exe, &["early"], &[], n, |i, status, out, err| {
        cached_or_closed(i, status, out, err, "the monitor does not see")
    });
    println!("{n} verbs runs, threads running at load: {secs:.1} s");
}

#[test]
fn a_foreign_jump_is_taken_back_under_traffic() {
    let (exe, d) = build(
        "host/patch_hammer_verbs.c",
        "patch_hammer_adopt",
        &["-Wno-cast-function-type", "-libverbs"],
    );
    let patcher = d.join("libpatcher.so");
    common::cc(&[
        "-shared",
        "-fPIC",
        "-o",
        patcher.to_str().unwrap(),
        &src("guest/so/patcher.c"),
        "-ldl",
    ]);
    let n = 600;
    let args = ["adopt", patcher.to_str().unwrap()];
    let env = [("HAMMER_LATE", "1"), ("HAMMER_ONLY", "munmap")];
    let secs = runs(&exe, &args, &env, n, |i, status, out, err| {
        cached_or_closed(i, status, out, err, "mrcache")
    });
    println!("{n} runs, munmap through libfabric's jump while it is taken back: {secs:.1} s");
}

/// patch_hammer_verbs (threads from a DT_NEEDED constructor running libc's patched calls
/// while ours patches) under `seccomp_refuse MODE`, `n` runs. Each must fail closed with one
/// line naming `why`, pass every registration through ("miss seen ran"), and leave no
/// writable and executable mapping.
fn refused(mode: &str, why: &str, n: usize) {
    let (exe, d) = build(
        "host/patch_hammer_verbs.c",
        &format!("patch_refused_{mode}"),
        &["-Wno-cast-function-type", "-libverbs"],
    );
    let wrapper = d.join("seccomp_refuse");
    common::cc(&[
        "-o",
        wrapper.to_str().unwrap(),
        &src("host/seccomp_refuse.c"),
    ]);
    let exe_arg = exe.display().to_string();
    let secs = runs(
        &wrapper,
        &[mode, &exe_arg, "early", "maps"],
        &[],
        n,
        |i, status, out, err| {
            let off: Vec<&str> = err
                .lines()
                .filter(|l| l.contains("caching is OFF"))
                .collect();
            assert!(
                status == Some(0)
                    && out.starts_with("miss seen ran\n")
                    && out.ends_with("rwx 0\n")
                    && err.lines().count() == 1
                    && off.len() == 1
                    && off[0].contains(why),
                "run {i} under seccomp_refuse {mode}: status {status:?}\n{out}{err}"
            );
        },
    );
    println!("{n} runs under seccomp_refuse {mode}: {secs:.1} s");
}

/// A seccomp filter fails membarrier(PRIVATE_EXPEDITED_SYNC_CORE) alone (QUERY and
/// REGISTER succeed) while seven threads run: no entry may be patched without the barrier.
#[test]
fn a_refused_sync_core_barrier_patches_nothing_and_fails_closed() {
    refused("sync-core", "SYNC_CORE", 10);
}

/// A seccomp filter refuses mprotect(PROT_READ|PROT_EXEC) alone: libc's code is never
/// made writable (the restoring call is tried first), and caching is off.
#[test]
fn a_refused_restoring_mprotect_leaves_no_code_writable() {
    refused("restore-rx", "mprotect", 10);
}
