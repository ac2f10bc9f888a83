//! Memory hooks checked on the host, without RDMA: hooks that run before libmrcache.so's
//! constructor (an allocator or another preloaded library initialising first) behave
//! exactly like libc's, and zapping calls the VM's older kernel refuses are reported (a
//! fake provider counts registrations).

use crate::common;

use common::{lib, text};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `tests/c/host/NAME.c` with `flags` under the target directory.
fn build(name: &str, out: &str, flags: &[&str]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("early_and_refused_hooks");
    // The fake providers store their ops through libibverbs' `void *(*)(void)` slots and
    // ignore most arguments.
    let mut all = vec!["-Wno-unused-parameter", "-Wno-cast-function-type"];
    all.extend_from_slice(flags);
    common::build_host(&format!("{name}.c"), &dir, out, &all)
}

fn shared_object(name: &str) -> PathBuf {
    build(name, &format!("lib{name}.so"), &["-shared", "-fPIC"])
}

/// Runs `prog args` with libmrcache.so preloaded (the patch monitor): its exit status and
/// everything it printed.
fn run_preloaded(prog: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(prog)
        .args(args)
        .env("LD_PRELOAD", lib())
        .env("MRCACHE_MONITOR", "patch")
        .output()
        .unwrap();
    (out.status.code(), text(&out))
}

/// Runs `fake_zap SCENARIO` under the preload: Ok(true) reported, Ok(false) a stale hit,
/// Err when this kernel refuses the call (printed, and the test passes vacuously).
fn fake_zap(scenario: &str) -> Result<bool, String> {
    // One binary per scenario: tests run in parallel, and exec of a file another test is
    // still writing fails (ETXTBSY).
    let prog = build("fake_zap", &format!("fake_zap_{scenario}"), &["-libverbs"]);
    let (status, text) = run_preloaded(&prog, &[scenario]);
    match status {
        Some(0) => Ok(true),
        Some(1) => Ok(false),
        Some(77) => Err(text),
        _ => panic!("fake_zap {scenario}: {text}"),
    }
}

#[test]
fn process_madvise_on_ourselves_is_reported() {
    match fake_zap("process_madvise") {
        Ok(reported) => assert!(reported, "process_madvise(DONTNEED) was not reported"),
        Err(why) => println!("skipped: {why}"),
    }
}

#[test]
fn madvise_guard_install_is_reported() {
    match fake_zap("guard") {
        Ok(reported) => assert!(reported, "MADV_GUARD_INSTALL was not reported"),
        Err(why) => println!("skipped: {why}"),
    }
}

#[test]
fn brk_before_our_constructor_keeps_libc_break_in_step() {
    let early = shared_object("early_brk");
    // Ours first in the list: the later library's constructor runs before ours.
    let preload = format!("{} {}", lib().display(), early.display());
    let out = Command::new("sh")
        .args(["-c", "echo ok"])
        .env("LD_PRELOAD", &preload)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    // Without libmrcache.so the same library passes (the test itself is sound).
    let out = Command::new("sh")
        .args(["-c", "echo ok"])
        .env("LD_PRELOAD", &early)
        .output()
        .unwrap();
    assert!(out.status.success());
}

/// A program that reads `__curbrk` holds its own copy of it (a copy relocation), which is
/// the one libc's code keeps: our brk and sbrk must keep that one, not libc's original.
#[test]
fn sbrk_and_brk_keep_a_copied_curbrk_in_step() {
    let prog = build("curbrk_copy", "curbrk_copy", &[]);
    // Without libmrcache.so the program passes (the test itself is sound).
    let plain = Command::new(&prog).output().unwrap();
    assert!(plain.status.success(), "{}", text(&plain));
    let (status, text) = run_preloaded(&prog, &[]);
    assert_eq!(status, Some(0), "{text}");
}

/// mrcache's drain thread (and, when tracing, its writer) has its malloc arena by the time
/// the first registration returns, not at some later drain while the program reuses freed
/// addresses (tests/c/host/arena_settled.c says why).
#[test]
fn our_threads_take_their_arena_before_the_first_registration_returns() {
    let prog = build("arena_settled", "arena_settled", &["-libverbs"]);
    for (log, want) in [(None, "1"), (Some("trace"), "2")] {
        let mut cmd = Command::new(&prog);
        cmd.arg(want).env("LD_PRELOAD", lib());
        if let Some(level) = log {
            cmd.env("MRCACHE_LOG", level)
                .env("MRCACHE_LOG_FILE", "/dev/null");
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "MRCACHE_LOG={log:?}: {}", text(&out));
    }
}

/// The same thread starts (and the registration returns) when the first registration is
/// made in a library constructor, under the loader lock (tests/c/host/settled_in_ctor.c).
#[test]
fn our_thread_starts_when_the_first_registration_is_in_a_constructor() {
    let ctor = build(
        "settled_in_ctor",
        "libsettled_in_ctor.so",
        &["-shared", "-fPIC", "-libverbs"],
    );
    let prog = build("arena_settled", "arena_settled_dlopen", &["-libverbs"]);
    let out = Command::new(&prog)
        .args(["1", ctor.to_str().unwrap()])
        .env("LD_PRELOAD", lib())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
}

/// `dlclose` of a plugin unloads a dependency only it used; a cached registration of the
/// dependency's static buffer must go with it (and with the dependency closed directly).
#[test]
fn dlclose_reports_the_dependencies_it_unloads() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("early_and_refused_hooks");
    let dep = build("dl/dep", "libdep.so", &["-shared", "-fPIC"]);
    let plug = build(
        "dl/plug",
        "libplug.so",
        &[
            "-shared",
            "-fPIC",
            &format!("-L{}", dir.display()),
            "-ldep",
            "-Wl,-rpath,$ORIGIN",
        ],
    );
    let prog = build("dlclose_deps", "dlclose_deps", &["-libverbs", "-ldl"]);
    for how in ["dep", "plug"] {
        let (status, text) =
            run_preloaded(&prog, &[how, plug.to_str().unwrap(), dep.to_str().unwrap()]);
        match status {
            Some(0) => {}
            Some(77) => println!("skipped ({how}): {text}"),
            _ => panic!("dlclose {how}: {text}"),
        }
    }
}

/// `MRCACHE_LOG=trace` writes a line for each of the program's verbs calls, including those
/// still in the ring when the program exits (drained by the exit flush, after glibc has run
/// thread-local destructors), as text and as JSON.
#[test]
fn trace_lines_reach_the_log_up_to_exit() {
    let prog = build("fake_zap", "fake_zap_trace", &["-libverbs"]);
    for format in ["text", "json"] {
        let out = Command::new(&prog)
            .arg("guard")
            .env("LD_PRELOAD", lib())
            .env("MRCACHE_MONITOR", "patch")
            .env("MRCACHE_LOG", "trace")
            .env("MRCACHE_LOG_FORMAT", format)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.code() == Some(77) {
            println!("skipped: {err}");
            return;
        }
        let calls = |name: &str| {
            err.lines()
                .filter(|l| match format {
                    "text" => l.contains(&format!("] {name}(")),
                    _ => l.contains(&format!("\"call\":\"{name}\"")),
                })
                .count()
        };
        // The first registration starts the runtime (and tracing); two more follow, each
        // with its deregistration.
        assert!(calls("ibv_reg_mr") >= 2, "{format}: {err}");
        assert!(calls("ibv_dereg_mr") >= 3, "{format}: {err}");
    }
}
