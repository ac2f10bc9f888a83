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
    assert_eq!(
        common::line(&out, "engine:"),
        "engine: 0",
        "libmrcache_engine.so was loaded: {out}"
    );
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
    assert_ne!(
        common::line(&out, "engine:"),
        "engine: 0",
        "libmrcache_engine.so was not loaded: {out}"
    );
    assert_eq!(common::line(&out, "atfork:"), "atfork: 1");
}

/// `readelf` of `lib` with `args`.
fn readelf(lib: &Path, args: &[&str]) -> String {
    let out = Command::new("readelf")
        .args(args)
        .arg(lib)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The NEEDED entries of `lib`.
fn needed(lib: &Path) -> Vec<String> {
    readelf(lib, &["-dW"])
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split('[').nth(1)?.split(']').next()?.to_string()))
        .collect()
}

/// The front the loader maps into every process exports exactly the entry points mrcache
/// interposes (and `mrcache_version`), needs only libc and the loader, and holds nothing
/// else a process would pay for: no unwinder, no allocator, no runtime.
#[test]
fn the_front_exports_the_entry_points_and_needs_only_libc() {
    let front = common::lib();
    let needed = needed(&front);
    assert!(!needed.is_empty(), "no NEEDED entry read from readelf");
    for lib in &needed {
        assert!(
            lib.starts_with("libc.so") || lib.starts_with("ld-linux"),
            "libmrcache.so needs {lib} (all: {needed:?}): the loader maps it into every process"
        );
    }
    let mut exported: Vec<String> = readelf(&front, &["--dyn-syms", "-W"])
        .lines()
        .filter(|l| l.contains(" GLOBAL ") && !l.contains(" UND "))
        .filter_map(|l| l.split_whitespace().nth(7))
        .map(|name| name.split('@').next().unwrap_or(name).to_string())
        .collect();
    exported.sort_unstable();
    exported.dedup();
    let mut want = vec![
        "_Fork",
        "brk",
        "dlclose",
        "dlsym",
        "dlvsym",
        "ibv_close_device",
        "ibv_dealloc_pd",
        "ibv_dereg_mr",
        "ibv_fork_init",
        "ibv_reg_dmabuf_mr",
        "ibv_reg_mr",
        "ibv_reg_mr_iova",
        "ibv_reg_mr_iova2",
        "ibv_rereg_mr",
        "madvise",
        "mmap",
        "mmap64",
        "mprotect",
        "mrcache_patch_watch_clean",
        "mrcache_selftest_report",
        "mrcache_version",
        "mremap",
        "munmap",
        "pkey_mprotect",
        "posix_madvise",
        "process_madvise",
        "realloc",
        "remap_file_pages",
        "sbrk",
        "shmat",
        "shmdt",
    ];
    want.sort_unstable();
    assert_eq!(exported, want, "the front's exported symbols");
    let size = std::fs::metadata(&front).unwrap().len();
    let loaded: u64 = readelf(&front, &["-lW"])
        .lines()
        .filter(|l| l.trim_start().starts_with("LOAD"))
        .filter_map(|l| {
            u64::from_str_radix(l.split_whitespace().nth(5)?.trim_start_matches("0x"), 16).ok()
        })
        .sum();
    assert!(
        loaded < 64 * 1024,
        "the front maps {loaded} bytes from its file of {size}: it is meant to be a few pages"
    );
}

/// The engine the front loads at the first verbs call needs only libc and the loader (no
/// unwinder library: build.rs links the unwinder statically), exports only its attach
/// function (no hook, no unwinder symbol binds anything of the process to it), and reaches
/// each allocator function one way only.
#[test]
fn the_engine_needs_only_libc_and_exports_only_its_attach_function() {
    let engine = common::engine();
    let needed = needed(&engine);
    assert!(!needed.is_empty(), "no NEEDED entry read from readelf");
    for lib in &needed {
        assert!(
            lib.starts_with("libc.so") || lib.starts_with("ld-linux"),
            "libmrcache_engine.so needs {lib} (all: {needed:?})"
        );
    }
    let exported: Vec<String> = readelf(&engine, &["--dyn-syms", "-W"])
        .lines()
        .filter(|l| l.contains(" GLOBAL ") && !l.contains(" UND "))
        .filter_map(|l| l.split_whitespace().nth(7).map(str::to_string))
        .collect();
    assert_eq!(
        exported,
        ["mrcache_engine_attach"],
        "the engine's exported symbols"
    );
    // Each of libc's allocator functions is reached one way only, through a PLT slot
    // (JUMP_SLOT) or through a GOT entry (GLOB_DAT): a patcher that rewrites every object's
    // PLT slots (UCX's reloc mode) would otherwise take over some of the library's
    // allocator calls and not others (tests/host/coexist_with_other_hooks.rs shows the crash that follows).
    // Rust calls them through the GOT on x86-64 and through the PLT on aarch64; the static
    // unwinder's copy calls glibc's `__libc_malloc` and `__libc_free` instead.
    let relocs = readelf(&engine, &["-rW"]);
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
