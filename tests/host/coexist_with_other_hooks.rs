//! mrcache and UCX's memory hooks in one process, on the host (no RDMA; a fake provider):
//! with UCX's hooks installed in bistro mode (jumps over libc's entry points) and in reloc
//! mode (GOT entries, "original" functions found with `dlsym(RTLD_NEXT)`), each way memory
//! goes away (a program's munmap, madvise, mremap, shmdt, and glibc's own munmap inside
//! free()) must reach both mrcache's cache and UCX's event handler, with caching on.

use crate::common;

use common::{cc, lib, text};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The test program, linked with UCX (its constructors patch libc before libmrcache.so's
/// runs) or, with `late`, loading it with dlopen from main (after).
fn build(dir: &Path, late: bool) -> Option<PathBuf> {
    if !Path::new("/usr/include/ucm/api/ucm.h").exists() {
        println!("skipped: libucx-dev is not installed (ci/install-deps.sh installs it)");
        return None;
    }
    std::fs::create_dir_all(dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/host");
    let watch = dir.join("libucm_watch.so");
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        watch.to_str().unwrap(),
        src.join("ucx/ucm_watch.c").to_str().unwrap(),
        "-lucm",
        "-lucs",
    ]);
    let prog = dir.join("ucx_coexist");
    let source = src.join("ucx_coexist.c");
    let mut args = vec![
        "-o",
        prog.to_str().unwrap(),
        source.to_str().unwrap(),
        "-Wl,-rpath,$ORIGIN",
        "-Wl,--no-as-needed",
    ];
    let search = format!("-L{}", dir.display());
    if late {
        args.extend(["-DLATE", "-ldl", "-libverbs"]);
    } else {
        args.extend([&search, "-lucm_watch", "-lucm", "-lucs", "-libverbs"]);
    }
    cc(&args);
    Some(prog)
}

const SCENARIOS: [&str; 10] = [
    "munmap",
    "madvise",
    "madvise_free",
    "mremap",
    "mremap_shrink",
    "mmap_fixed",
    "shmdt",
    "free",
    "heap_trim",
    "nested",
];

/// Runs every scenario in both of UCX's modes; `early` asks for UCX's memory events from a
/// library constructor too (UCX's own constructors patch libc anyway). Returns the failures.
fn run_all(prog: &Path, early: bool, preload: &str) -> Vec<String> {
    run_modes(prog, early, preload, &["bistro", "reloc"])
}

/// `run_all` in the given modes of UCX.
fn run_modes(prog: &Path, early: bool, preload: &str, modes: &[&str]) -> Vec<String> {
    let mut failures = Vec::new();
    for &mode in modes {
        for scenario in SCENARIOS {
            let out = Command::new(prog)
                .arg(scenario)
                .env("LD_PRELOAD", preload)
                .env("UCX_MEM_MMAP_HOOK_MODE", mode)
                .env("UCM_WATCH_EARLY", if early { "1" } else { "0" })
                .output()
                .unwrap();
            let text = text(&out);
            println!("{mode} {scenario}: {} {}", out.status, text.trim());
            if !out.status.success() || text.contains("caching is OFF") {
                failures.push(format!("{mode} {scenario}: {} {}", out.status, text.trim()));
            }
        }
    }
    failures
}

/// A program linked with UCX: libucs's constructor patches libc (bistro) before
/// libmrcache.so's constructor runs, and UCX's start-up test calls munmap & co. through our
/// not yet initialised hooks, which must still reach its jumps. Events asked for from main.
#[test]
fn both_see_every_unmap_under_ucx_hooks() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("coexist_with_other_hooks");
    let Some(prog) = build(&dir, false) else {
        return;
    };
    let failures = run_all(&prog, false, lib().to_str().unwrap());
    assert!(failures.is_empty(), "{failures:#?}");
}

/// As above, with the events asked for in a library constructor, before ours: in reloc mode
/// UCX has pointed our GOT entries for munmap & co. at its hooks by then, and our jumps must
/// still lead to our hooks (else UCX's hook calls libc's, which jumps back to UCX's).
#[test]
fn both_see_every_unmap_when_ucx_events_came_first() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("coexist_with_other_hooks_early");
    let Some(prog) = build(&dir, false) else {
        return;
    };
    let failures = run_all(&prog, true, lib().to_str().unwrap());
    assert!(failures.is_empty(), "{failures:#?}");
}

/// UCX loaded with dlopen after our constructor (as Open MPI loads its UCX component): its
/// constructors write their jumps over ours; the runtime's set-up takes them back and
/// chains to UCX's hooks before anything is cached.
#[test]
fn both_see_every_unmap_when_ucx_is_loaded_later() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("coexist_with_other_hooks_late");
    let Some(prog) = build(&dir, true) else {
        return;
    };
    let failures = run_all(&prog, false, lib().to_str().unwrap());
    assert!(failures.is_empty(), "{failures:#?}");
}

/// UCX's bistro patches the definition `dlsym(RTLD_NEXT)` from libucm finds, else the one
/// `dlsym(RTLD_DEFAULT)` finds. With `LD_PRELOAD=libucm.so:libmrcache.so` the former would
/// be ours; with libucm after libc in the search order (a program linked with libucs only,
/// as ucx_perftest and MPICH's programs are) the former finds nothing and the latter would
/// be ours: UCX would write its jumps over our own hooks, and nothing of ours would see an
/// unmap. Our `dlsym` answers with libc's entry (which holds our jump) instead; UCX patches
/// that, and we chain to it as in the other orders.
#[test]
fn both_see_every_unmap_when_ucx_would_patch_our_own_hooks() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("coexist_with_other_hooks_order");
    let Some(prog) = build(&dir, false) else {
        return;
    };
    let ucm = format!("/usr/lib/{}-linux-gnu/libucm.so.0", std::env::consts::ARCH);
    let mut failures = run_all(&prog, false, &format!("{ucm}:{}", lib().display()));
    let last = common::build_host(
        "ucx_coexist.c",
        &dir,
        "ucx_coexist_libucm_last",
        &[
            &format!("-L{}", dir.display()),
            "-Wl,--no-as-needed",
            "-lucm_watch",
            "-lucs",
            "-libverbs",
            "-Wl,-rpath,$ORIGIN",
        ],
    );
    // Not reloc: in this order UCX 1.13 deadlocks by itself (its malloc hook re-enters its
    // allocator from the dlsym its sbrk event handler makes), with or without mrcache.
    failures.extend(run_modes(
        &last,
        false,
        lib().to_str().unwrap(),
        &["bistro"],
    ));
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A third patcher in libfabric 1.17's memhooks form, loaded with dlopen, chained to at the
/// set-up, then stopped (its kept bytes written back) and dlclosed: mrcache must not call
/// into the unloaded library afterwards, and must keep seeing munmap.
#[test]
fn chained_patcher_may_be_dlclosed() {
    if cfg!(target_arch = "aarch64") && stat_says_no_threads() {
        // On aarch64 the patcher's first word (a movz) is taken over only while the process
        // is alone (docs/design/monitor.md, "aarch64"), which the library reads in /proc/self/stat;
        // Debian 12's qemu-user 7.2 (`ci/aarch64 test`) writes 0 threads there, so it is
        // never alone and fails closed. Seen passing under Debian 13's qemu-user 10.0.
        println!("skipped: /proc/self/stat says 0 threads (qemu-user 7.2)");
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("coexist_patcher");
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/host");
    let patcher = dir.join("libfake_patcher.so");
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        patcher.to_str().unwrap(),
        src.join("patcher/fake_patcher.c").to_str().unwrap(),
        "-ldl",
    ]);
    let prog = common::build_host(
        "patcher_coexist.c",
        &dir,
        "patcher_coexist",
        &["-ldl", "-libverbs", "-Wl,-rpath,$ORIGIN"],
    );
    let out = Command::new(&prog)
        .env("LD_PRELOAD", lib())
        .output()
        .unwrap();
    let text = text(&out);
    println!("{}: {}", out.status, text.trim());
    assert!(out.status.success(), "{}: {text}", out.status);
}

/// Whether `/proc/self/stat`'s thread count (field 20) is 0, as no kernel writes it.
fn stat_says_no_threads() -> bool {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(17).map(|n| n == "0"))
        .unwrap_or(false)
}
