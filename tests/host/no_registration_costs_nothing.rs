//! A process under the preload that never registers memory pays nothing but the loader's
//! work: glibc's libmemusage counts the same allocations with and without the preload, and
//! libc's code stays byte for byte its file (no entry point patched), with no thread
//! started and no atfork handler registered (tests/c/host/untouched_libc.c); one
//! registration then does all of that (the positive control).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

const MEMUSAGE: &str = "/lib/x86_64-linux-gnu/libmemusage.so";

/// libmemusage's summary of `program args`, preloaded alone or before libmrcache.so.
fn memusage(program: &Path, args: &[&str], with_mrcache: bool) -> String {
    let mut preload = MEMUSAGE.to_string();
    if with_mrcache {
        preload = format!("{preload}:{}", common::lib().display());
    }
    let out = Command::new(program)
        .args(args)
        .env("LD_PRELOAD", preload)
        .env_remove("MEMUSAGE_OUTPUT")
        .env_remove("MEMUSAGE_PROG_NAME")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `/bin/true`, and untouched_libc.c's memory calls (which the hooks see): libmemusage's
/// summary (glibc's; it reports from a destructor, so a program that closes stderr at exit
/// or leaves by `_exit`, as coreutils and dash do, shows nothing) is the same.
#[test]
fn libmemusage_counts_the_same_allocations_with_and_without_the_preload() {
    if !Path::new(MEMUSAGE).exists() {
        println!("skipped: no {MEMUSAGE} (glibc's libc6 on Debian amd64)");
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no_registration_costs_nothing");
    let (_, idle) = common::shim_and_program(
        "host",
        "verbs_shim",
        "untouched_libc",
        &dir,
        "memusage",
        &["-libverbs", "-ldl"],
    );
    // (`/bin/true` with an argument closes stderr at exit.)
    for (program, args) in [(Path::new("/bin/true"), &[][..]), (&idle, &["idle"][..])] {
        let plain = memusage(program, args, false);
        let preloaded = memusage(program, args, true);
        assert!(
            plain.contains("Memory usage summary"),
            "{}: no summary: {plain}",
            program.display()
        );
        assert_eq!(
            plain,
            preloaded,
            "{}: libmemusage's summary differs",
            program.display()
        );
    }
}

fn untouched(mode: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no_registration_costs_nothing");
    let (shim, prog) = common::shim_and_program(
        "host",
        "verbs_shim",
        "untouched_libc",
        &dir,
        mode,
        &["-libverbs", "-ldl"],
    );
    let counter = common::build_host(
        "atfork_count.c",
        &dir,
        &format!("libatfork_count_{mode}.so"),
        &["-shared", "-fPIC", "-ldl"],
    );
    let out = Command::new(&prog)
        .arg(mode)
        .env(
            "LD_PRELOAD",
            format!("{} {}", counter.display(), common::preload_with(&shim)),
        )
        .env("MRCACHE_MONITOR", "patch")
        .output()
        .unwrap();
    let t = common::text(&out);
    println!("{t}");
    assert_eq!(out.status.code(), Some(0), "{t}");
    t
}

#[test]
fn a_process_that_never_registers_keeps_libc_unpatched_with_no_thread_or_atfork_handler() {
    let out = untouched("idle");
    assert!(
        common::line(&out, "libc code:").ends_with(" 0 differ"),
        "libc's code was changed: {out}"
    );
    assert_eq!(common::line(&out, "threads:"), "threads: 1");
    assert_eq!(common::line(&out, "atfork:"), "atfork: 0");
}

/// The positive control: the same checks see the first registration's patching and atfork
/// handlers.
#[test]
fn the_first_registration_patches_libc_and_registers_the_atfork_handlers() {
    let out = untouched("register");
    assert!(
        !common::line(&out, "libc code:").ends_with(" 0 differ"),
        "libc was not patched: {out}"
    );
    assert_eq!(common::line(&out, "atfork:"), "atfork: 1");
}

/// The library the loader maps into every process needs only libc and the loader: no
/// unwinder library (libgcc_s.so.1 costs a process that never uses verbs about 0.15 ms of
/// start-up, its constructor's `cpuid` included; build.rs links the same unwinder
/// statically), and no unwinder symbol escapes into the process's scope, where it would
/// bind a C++ program's exceptions to our copy.
#[test]
fn the_library_needs_only_libc_and_the_loader() {
    let out = Command::new("readelf")
        .args(["-dW", "--dyn-syms"])
        .arg(common::lib())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next())
        .collect();
    assert!(
        !needed.is_empty(),
        "no NEEDED entry read from readelf:\n{text}"
    );
    for lib in &needed {
        assert!(
            lib.starts_with("libc.so") || lib.starts_with("ld-linux"),
            "libmrcache.so needs {lib} (all: {needed:?}): the loader maps it into every process"
        );
    }
    let exported: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" GLOBAL ") && !l.contains(" UND "))
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter(|name| name.starts_with("_Unwind") || name.starts_with("__gcc_personality"))
        .collect();
    assert!(
        exported.is_empty(),
        "unwinder symbols exported: {exported:?}"
    );
    // Each of libc's allocator functions is reached one way only, through a PLT slot
    // (JUMP_SLOT) or through a GOT entry (GLOB_DAT): a patcher that rewrites every object's
    // PLT slots (UCX's reloc mode) would otherwise take over some of the library's
    // allocator calls and not others (tests/host/coexist_with_other_hooks.rs shows the crash that follows).
    // Rust calls them through the GOT on x86-64 and through the PLT on aarch64; the static
    // unwinder's copy calls glibc's `__libc_malloc` and `__libc_free` instead.
    let out = Command::new("readelf")
        .args(["-rW"])
        .arg(common::lib())
        .output()
        .unwrap();
    let relocs = String::from_utf8_lossy(&out.stdout);
    let kinds = |name: &str| -> Vec<&str> {
        let mut k: Vec<&str> = relocs
            .lines()
            .filter(|l| {
                l.split_whitespace()
                    .nth(4)
                    .is_some_and(|s| s.starts_with(name))
            })
            .filter_map(|l| l.split_whitespace().nth(2))
            .collect();
        k.sort_unstable();
        k.dedup();
        k
    };
    let split: Vec<(&str, Vec<&str>)> =
        ["malloc@", "free@", "calloc@", "realloc@", "posix_memalign@"]
            .into_iter()
            .map(|f| (f, kinds(f)))
            .filter(|(_, k)| k.len() > 1)
            .collect();
    assert!(
        split.is_empty(),
        "allocator functions reached both through the PLT and the GOT: {split:?}"
    );
}

/// The constructor looks no symbol up: glibc's loader, asked to log every lookup
/// (`LD_DEBUG=symbols`), is asked for none of the functions the hooks forward to that no
/// object's relocations name, and `dlsym`'s own lookup (`_dl_find_dso_for_object`) never
/// runs. Each hook finds libc's function and the next definition at its first call, from the
/// loader's list and the objects' symbol tables.
#[test]
fn the_constructor_looks_up_no_symbol() {
    let out = Command::new("/bin/true")
        .env("LD_DEBUG", "symbols")
        .env("LD_PRELOAD", common::lib())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("symbol=free;"),
        "LD_DEBUG=symbols logged no lookup: {log}"
    );
    let looked_up: Vec<(&str, usize)> = [
        "_Fork",
        "posix_madvise",
        "process_madvise",
        "remap_file_pages",
        "_dl_find_dso_for_object",
    ]
    .into_iter()
    .map(|name| (name, log.matches(&format!("symbol={name};")).count()))
    .filter(|&(_, n)| n > 0)
    .collect();
    assert!(
        looked_up.is_empty(),
        "looked up before any hook was called (name, lookups): {looked_up:?}"
    );
}
