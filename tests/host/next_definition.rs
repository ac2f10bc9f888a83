//! A memory hook finds the next definition of its name at its first call, as `dlsym(RTLD_NEXT)`
//! answers it, without calling `dlsym` (which may run inside an allocator or a signal
//! handler, and clears a pending `dlerror()`): through a library with only a SysV hash
//! table, to an interposer whose function is an IFUNC, past a definition kept only as a
//! hidden version (tests/c/host/next_definition.c).

use crate::common;

use common::{lib, text};
use std::path::{Path, PathBuf};
use std::process::Command;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("next_definition")
}

fn library(out: &str, flags: &[&str]) -> PathBuf {
    let map = format!(
        "-Wl,--version-script={}/tests/c/host/next_definition_compat.map",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut all = vec!["-shared", "-fPIC"];
    all.extend_from_slice(flags);
    if flags.contains(&"-DCOMPAT_MUNMAP") {
        all.push(&map);
    }
    common::build_host(
        "next_definition_libs.c",
        &dir(),
        out,
        &[&all[..], &["-ldl"]].concat(),
    )
}

/// The program `out`, linked against a library of its own with only a SysV hash table
/// (one per program: the tests build in parallel).
fn program(out: &str) -> PathBuf {
    let sysv = library(
        &format!("lib{out}_sysv.so"),
        &["-DSYSV_PLAIN", "-Wl,--hash-style=sysv"],
    );
    let d = dir();
    common::build_host(
        "next_definition.c",
        &d,
        out,
        &[
            sysv.to_str().unwrap(),
            &format!("-Wl,-rpath,{}", d.display()),
            "-ldl",
        ],
    )
}

fn run(prog: &Path, arg: &str, preload: &[&Path]) -> String {
    run_args(prog, &[arg], preload)
}

fn run_args(prog: &Path, args: &[&str], preload: &[&Path]) -> String {
    let list: Vec<_> = preload.iter().map(|p| p.to_str().unwrap()).collect();
    let out = Command::new(prog)
        .args(args)
        .env("LD_PRELOAD", list.join(":"))
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    t
}

/// The hooks' first calls behind a library with only a SysV hash table leave a pending
/// `dlerror()` in place: no `dlsym` runs in a hook. Seen failing when such an object sent
/// the lookup to libc's `dlsym`: `dlerror: (null)`.
#[test]
fn a_pending_dlerror_survives_the_first_hook_call_behind_a_sysv_library() {
    let prog = program("next_definition_dlerror");
    let plain = run(&prog, "dlerror", &[]);
    assert_eq!(common::line(&plain, "dlerror:"), "dlerror: kept", "{plain}");
    let out = run(&prog, "dlerror", &[&lib()]);
    assert_eq!(common::line(&out, "dlerror:"), "dlerror: kept", "{out}");
}

/// An interposer after libmrcache.so whose `munmap` is an IFUNC gets every call, as without
/// mrcache: its resolver is called as the loader calls it. Seen failing with the resolver
/// called as `munmap`: `unmap: 0 of 10 gone, munmap returned ...` and 0 calls.
#[test]
fn an_ifunc_interposer_after_the_library_gets_every_call() {
    let prog = program("next_definition_ifunc");
    let ifunc = library("libnext_definition_ifunc.so", &["-DIFUNC_MUNMAP"]);
    let lib = lib();
    for preload in [vec![ifunc.as_path()], vec![lib.as_path(), ifunc.as_path()]] {
        let out = run(&prog, "unmap", &preload);
        assert_eq!(
            common::line(&out, "unmap:"),
            "unmap: 10 of 10 gone, munmap returned 0",
            "{preload:?}: {out}"
        );
        assert!(out.contains("ifunc munmap: 10 calls"), "{preload:?}: {out}");
    }
}

/// A `munmap` kept only as a hidden version (`munmap@COMPAT_1`) after libmrcache.so is no
/// next definition: `dlsym(RTLD_NEXT)` never answers one. Seen failing with the walk taking
/// it: `unmap: 0 of 10 gone, munmap returned -1`.
#[test]
fn a_hidden_version_is_not_the_next_definition() {
    let prog = program("next_definition_compat");
    let compat = library("libnext_definition_compat.so", &["-DCOMPAT_MUNMAP"]);
    let out = run(&prog, "unmap", &[&lib(), &compat]);
    assert_eq!(
        common::line(&out, "unmap:"),
        "unmap: 10 of 10 gone, munmap returned 0",
        "{out}"
    );
}

/// Loaded with `dlopen` after libc, the library's `munmap` goes to libc's, not to a
/// plugin's own `munmap` loaded `RTLD_LOCAL` after it: the walk covers only the objects
/// loaded at start-up, and a library that libc does not follow asks `dlsym` in its
/// constructor. Seen failing when the walk ran to the end of the list: `dlopened: munmap
/// returned -1, page STILL MAPPED`.
#[test]
fn a_dlopened_library_forwards_within_its_scope() {
    let prog = program("next_definition_dlopened");
    let plugin = library("libnext_definition_private.so", &["-DPRIVATE_MUNMAP"]);
    let lib = lib();
    let out = run_args(
        &prog,
        &["dlopened", lib.to_str().unwrap(), plugin.to_str().unwrap()],
        &[],
    );
    assert_eq!(
        common::line(&out, "dlopened:"),
        "dlopened: munmap returned 0, page gone",
        "{out}"
    );
}

/// `dlmopen`ed into a namespace of its own (not in the base namespace's list), the
/// library's `realloc` and `_Fork` still reach libc's. Seen failing when only the walk
/// answered: `namespace: realloc NULL, _Fork failed`.
#[test]
fn a_library_in_a_namespace_of_its_own_finds_libc() {
    let prog = program("next_definition_namespace");
    let lib = lib();
    let out = run_args(&prog, &["namespace", lib.to_str().unwrap()], &[]);
    assert_eq!(
        common::line(&out, "namespace:"),
        "namespace: realloc ok, _Fork ok",
        "{out}"
    );
}
