//! `dlsym`/`dlvsym` under libmrcache.so, on the host (no RDMA): lookups through a handle of a
//! dlopen'd libibverbs hand out our hooks (the NCCL pattern), and every other lookup
//! answers exactly as without the preload, `RTLD_NEXT` relative to its caller included.

use crate::common;

use common::{lib, text};
use std::path::{Path, PathBuf};
use std::process::Command;

fn tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dlsym")
}

/// Builds `tests/c/host/SRC` into the test's directory as `out`.
fn build(src: &str, out: &str, flags: &[&str]) -> PathBuf {
    common::build_host(src, &tmp(), out, flags)
}

/// Runs `prog ARGS` plain and preloaded; both must exit 0. Returns the preloaded output.
fn plain_and_preloaded(prog: &Path, args: &[&std::ffi::OsStr]) -> String {
    for preload in [false, true] {
        let mut cmd = Command::new(prog);
        cmd.args(args);
        if preload {
            cmd.env("LD_PRELOAD", lib());
        }
        let out = cmd.output().unwrap();
        let text = text(&out);
        assert!(
            out.status.success(),
            "{} (preload {preload}): {}\n{text}",
            prog.display(),
            out.status
        );
        if preload {
            return text;
        }
    }
    unreachable!()
}

#[test]
fn lookups_of_other_names_answer_as_without_the_preload() {
    let dir = tmp();
    let map = |lib: &str| {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/host/dlsym/{lib}.map"));
        format!("-Wl,--version-script={}", path.display())
    };
    // Both define mrc_probe@MRC_1: a lookup relative to the wrong object finds next_a's.
    build(
        "dlsym/next_a.c",
        "libnext_a.so",
        &["-shared", "-fPIC", "-ldl", &map("next_a")],
    );
    build(
        "dlsym/next_b.c",
        "libnext_b.so",
        &["-shared", "-fPIC", &map("next_b")],
    );
    let prog = build(
        "dlsym_next.c",
        "dlsym_next",
        &[
            &format!("-L{}", dir.display()),
            "-Wl,--no-as-needed",
            "-lnext_a",
            "-lnext_b",
            "-ldl",
            "-Wl,-rpath,$ORIGIN",
        ],
    );
    let text = plain_and_preloaded(&prog, &[]);
    assert!(text.contains("dlsym_next: ok"), "{text}");
}

#[test]
fn lookups_through_a_dlopened_libibverbs_get_our_hooks() {
    let prog = build("dlsym_verbs.c", "dlsym_verbs", &["-ldl"]);
    let text = plain_and_preloaded(&prog, &[]);
    assert!(text.contains("dlsym_verbs: ok (preload loaded)"), "{text}");
}

/// Builds `tests/c/host/dlsym/SRC.c` as `libSRC.so` with `flags`.
fn build_lib(src: &str, flags: &[&str]) -> PathBuf {
    let mut all = vec!["-shared", "-fPIC"];
    all.extend_from_slice(flags);
    build(&format!("dlsym/{src}.c"), &format!("lib{src}.so"), &all)
}

#[test]
fn rtld_next_of_a_verbs_name_is_relative_to_its_caller() {
    build_lib("wrap_verbs", &[]);
    build_lib("late_verbs", &[]);
    let prog = build(
        "dlsym_wrap.c",
        "dlsym_wrap",
        &[
            &format!("-L{}", tmp().display()),
            "-Wl,--no-as-needed",
            "-lwrap_verbs",
            "-libverbs",
            "-ldl",
            "-Wl,-rpath,$ORIGIN",
        ],
    );
    let text = plain_and_preloaded(&prog, &[]);
    assert!(text.contains("dlsym_wrap: ok (preload loaded)"), "{text}");
}

#[test]
fn rtld_next_from_a_local_plugin_finds_its_libibverbs() {
    let plugin = build_lib("local_verbs", &["-Wl,--no-as-needed", "-libverbs"]);
    let prog = build("dlsym_local.c", "dlsym_local", &["-ldl"]);
    let text = plain_and_preloaded(&prog, &[plugin.as_os_str()]);
    assert!(text.contains("dlsym_local: ok (preload loaded)"), "{text}");
    // The program links libibverbs too: loaded before the plugin, still its next.
    let linked = &["-ldl", "-Wl,--no-as-needed", "-libverbs"];
    let prog = build("dlsym_local.c", "dlsym_local_linked", linked);
    let text = plain_and_preloaded(&prog, &[plugin.as_os_str()]);
    assert!(text.contains("dlsym_local: ok (preload loaded)"), "{text}");
}

/// Our `dlsym` answers `RTLD_NEXT` lookups of libc's memory functions from the program
/// itself (with libc's entry, for UCX's bistro): like libc's, a success must clear an error
/// a failed lookup left pending, or `dlsym(); if (dlerror()) fail` idioms fail.
#[test]
fn a_memory_lookup_we_answer_clears_dlerror() {
    let prog = build("dlsym_dlerror.c", "dlsym_dlerror", &["-ldl"]);
    let text = plain_and_preloaded(&prog, &[]);
    assert!(text.contains("dlsym_dlerror: ok"), "{text}");
}
