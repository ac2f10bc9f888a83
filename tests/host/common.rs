//! What the host tests that build C programs share: where libmrcache.so and the launcher
//! are, one compiler invocation with the project's C flags, and a child's output as one text.

#![allow(dead_code)] // each test file uses part of it

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A file of the workspace's build in this test binary's profile (target/<profile>/, above
/// its deps/ folder): libmrcache.so (preload/) or the launcher (cli/), which `cargo test`
/// of this package does not rebuild: `cargo build --workspace` first.
pub fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "{} not built: cargo build --workspace (same profile) first",
        p.display()
    );
    p
}

pub fn lib() -> PathBuf {
    built("libmrcache.so")
}

/// libmrcache_engine.so, which the front loads from beside itself.
pub fn engine() -> PathBuf {
    built("libmrcache_engine.so")
}

/// The `mrcache` launcher.
pub fn launcher() -> PathBuf {
    built("mrcache")
}

/// Compiles `args` (sources, outputs, libraries) with the flags every C file here uses, with
/// `cc` or `MRCACHE_TEST_CC` (`ci/aarch64 test` runs these tests under qemu-user with
/// `aarch64-linux-gnu-gcc`).
pub fn cc(args: &[&str]) {
    let compiler = std::env::var("MRCACHE_TEST_CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&compiler)
        .args(["-O2", "-Wall", "-Wextra", "-Werror"])
        .args(args)
        .status()
        .expect("cc");
    assert!(st.success(), "{compiler} {args:?}");
}

/// Builds `tests/c/host/SRC` into `dir/out` with `flags`.
pub fn build_host(src: &str, dir: &Path, out: &str, flags: &[&str]) -> PathBuf {
    build_in("host", src, dir, out, flags)
}

/// Builds `tests/c/FOLDER/SRC` into `dir/out` with `flags`.
pub fn build_in(folder: &str, src: &str, dir: &Path, out: &str, flags: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(folder)
        .join(src);
    let out = dir.join(out);
    let mut args = vec!["-o", out.to_str().unwrap(), src.to_str().unwrap()];
    args.extend_from_slice(flags);
    cc(&args);
    out
}

/// Standard output then standard error, as text.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every logging and statistics knob on, pointing into `dir`: a process that never makes a
/// verbs call must still print nothing and write nothing there.
pub fn noisy_env(dir: &Path) -> Vec<(String, String)> {
    vec![
        ("MRCACHE_LOG".into(), "trace".into()),
        (
            "MRCACHE_LOG_FILE".into(),
            dir.join("log.%p").display().to_string(),
        ),
        ("MRCACHE_STATS".into(), "json".into()),
        (
            "MRCACHE_STATS_FILE".into(),
            dir.join("stats.%p").display().to_string(),
        ),
    ]
}

/// A fresh, empty directory under the target directory, unique to this test process.
pub fn tempdir(tag: &str) -> PathBuf {
    let d =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A fake-provider test's two parts, built under `dir` for `tag` (one pair per test: tests
/// run in parallel, and exec of a file another test is still writing fails with ETXTBSY):
/// `tests/c/FOLDER/SHIM.c`, linked with its version script `SHIM.map`, which stands in for
/// libibverbs' calls behind libmrcache.so, and the program `tests/c/FOLDER/PROG.c` linked
/// with `libs`. The fake providers store their ops through libibverbs' `void *(*)(void)`
/// slots and ignore most arguments.
pub fn shim_and_program(
    folder: &str,
    shim: &str,
    prog: &str,
    dir: &Path,
    tag: &str,
    libs: &[&str],
) -> (PathBuf, PathBuf) {
    let flags = ["-Wno-unused-parameter", "-Wno-cast-function-type"];
    let map = format!(
        "-Wl,--version-script={}/tests/c/{folder}/{shim}.map",
        env!("CARGO_MANIFEST_DIR")
    );
    let shim = build_in(
        folder,
        &format!("{shim}.c"),
        dir,
        &format!("lib{shim}_{tag}.so"),
        &[&flags[..], &["-shared", "-fPIC", &map]].concat(),
    );
    let prog = build_in(
        folder,
        &format!("{prog}.c"),
        dir,
        &format!("{prog}_{tag}"),
        &[&flags[..], libs].concat(),
    );
    (shim, prog)
}

/// `LD_PRELOAD` for libmrcache.so with `shim` after it.
pub fn preload_with(shim: &Path) -> String {
    format!("{} {}", lib().display(), shim.display())
}

/// Run `scenario` of the fake-provider program `tests/c/host/PROG.c` (built per scenario
/// under `dir`) behind libmrcache.so and `verbs_shim.c`, with the patch monitor and `env`.
pub fn fake_scenario(
    dir: &Path,
    prog: &str,
    scenario: &str,
    env: &[(&str, &str)],
) -> std::process::Output {
    let (shim, prog) = shim_and_program(
        "host",
        "verbs_shim",
        prog,
        dir,
        scenario,
        &["-libverbs", "-ldl", "-lpthread"],
    );
    std::process::Command::new(&prog)
        .arg(scenario)
        .env("LD_PRELOAD", preload_with(&shim))
        .env("MRCACHE_MONITOR", "patch")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// A child's output as text (printed), its exit checked to be 0, and its line that starts
/// with `prefix`.
pub fn result_line(out: &Output, prefix: &str) -> String {
    let t = text(out);
    println!("{t}");
    assert_eq!(out.status.code(), Some(0), "{t}");
    line(&t, prefix).to_string()
}

/// The line of `out` that starts with `prefix` (a panic naming it when there is none).
pub fn line<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in {out}"))
}
