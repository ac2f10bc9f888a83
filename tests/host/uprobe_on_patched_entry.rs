//! A uprobe on libc's mmap or munmap entry, which libmrcache.so has patched:
//! tests/c/host/uprobe_entry.c, run with a private copy of libc so the probe (perf_event_open,
//! uprobe PMU, this process only) touches nothing else on the machine. Needs root (or
//! CAP_PERFMON) and a kernel with the uprobe PMU; skipped with the reason otherwise.

use crate::common;

use common::text;
use std::path::PathBuf;

/// Runs `scenario` for `rounds` rounds; None when skipped (printed why).
fn run(scenario: &str, rounds: u32) -> Option<String> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("uprobe_on_patched_entry_{scenario}"));
    let (shim, prog) = common::shim_and_program(
        "host",
        "verbs_shim",
        "uprobe_entry",
        &dir,
        scenario,
        &["-libverbs", "-ldl", "-lpthread"],
    );
    // The probe is on the file: a copy of our own, so no other process is hit.
    let libs = dir.join("lib");
    std::fs::create_dir_all(&libs).unwrap();
    let libc = libs.join("libc.so.6");
    let system = std::process::Command::new("sh")
        .args(["-c", "cc -print-file-name=libc.so.6"])
        .output()
        .unwrap();
    let system = PathBuf::from(String::from_utf8_lossy(&system.stdout).trim());
    let system = std::fs::canonicalize(&system).unwrap_or(system);
    std::fs::copy(&system, &libc).unwrap();
    let libc = std::fs::canonicalize(&libc).unwrap();
    let out = std::process::Command::new(&prog)
        .args([scenario, &rounds.to_string()])
        .env("LD_LIBRARY_PATH", &libs)
        .env("LD_PRELOAD", common::preload_with(&shim))
        .env("MRCACHE_MONITOR", "patch")
        .env("UPROBE_LIBC", &libc)
        .output()
        .unwrap();
    let t = text(&out);
    println!("{scenario}: {t} ({:?})", out.status);
    if out.status.code() == Some(77) {
        return None;
    }
    assert_eq!(
        out.status.code(),
        Some(0),
        "{scenario}: {t} ({:?})",
        out.status
    );
    Some(t)
}

/// A program that never calls verbs: attach, glibc's own munmap (large free), detach, again:
/// every freed block unmapped (the probe's removal wrote libc's first byte back over a jump
/// written at the entry: `mov eax, <garbage>; syscall`, ENOSYS, every large free leaked).
#[test]
fn munmap_keeps_working_across_a_uprobe() {
    run("plain_munmap", 20);
}

/// The same with the probe on mmap (the removal left `stc; retf` at the entry: SIGSEGV).
#[test]
fn mmap_keeps_working_across_a_uprobe() {
    run("plain_mmap", 20);
}

/// A cached registration, the probe attached, the buffer unmapped through libc's munmap and
/// mapped again: the next registration is a miss (the kernel ran libc's first instruction
/// out of line and resumed after a jump written there), probe attached or detached.
#[test]
fn no_stale_hit_with_a_uprobe_on_munmap() {
    run("verbs_munmap", 20);
}

/// The same with the remap by MAP_FIXED through libc's mmap, the probe on mmap.
#[test]
fn no_stale_hit_with_a_uprobe_on_mmap() {
    run("verbs_mmap", 20);
}

/// The probe on each other patched entry (madvise, mprotect, mremap, brk, sbrk, shmat,
/// shmdt; mremap's and sbrk's hooks are reached through a trampoline that takes back the
/// kept `sub rsp`/`push r12`): every call through libc's entry, attached and detached, gives
/// libc's result.
#[test]
fn other_entries_keep_their_meaning_across_a_uprobe() {
    for name in [
        "madvise", "mprotect", "mremap", "brk", "sbrk", "shmat", "shmdt",
    ] {
        if run(&format!("entry_{name}"), 10).is_none() {
            return;
        }
    }
}
