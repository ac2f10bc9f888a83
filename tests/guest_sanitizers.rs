//! Programs built with a sanitizer (ASan, TSan, UBSan) run under the preload. A sanitizer's
//! runtime looks up the functions it intercepts (`dlsym(RTLD_NEXT, "mmap")`, ...) while it
//! sets itself up, before our constructor: our `dlsym` is then called at a time when every
//! interceptor's pointer to the real function is still NULL, and must reach none of them
//! (docs/design.md, "Sanitizer builds run: the early dlsym path").
//!
//! Each program is run without the preload, with `LD_PRELOAD=libmrcache.so` (the sanitizer
//! runtime then comes after ours: `verify_asan_link_order=0`) and with the sanitizer's
//! runtime preloaded first, with and without `MRCACHE_ENABLE=0`; exit status and standard
//! output must match the run without the preload. A verbs program built with ASan (and one
//! with TSan), with a fake provider as in tests/fast_path_host.rs, must run with the cache
//! off and say why in one line: the sanitizer's allocator unmaps memory unseen.

mod common;

use common::{lib, text};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(120);
/// ASan keeps freed blocks in quarantine; off, a free unmaps a large block at once (as
/// TSan's allocator does), which san_verbs.c needs. Other ASAN_OPTIONS stay.
const QUARANTINE_OFF: (&str, &str) = (
    "ASAN_OPTIONS",
    "verify_asan_link_order=0:quarantine_size_mb=0",
);

fn dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("guest_sanitizers");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn src(name: &str) -> String {
    format!("{}/tests/c/guest/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Builds `tests/c/guest/SRC` with `-fsanitize=SAN` into `out`.
fn build(src_name: &str, san: &str, out: &str, extra: &[&str]) -> PathBuf {
    let out = dir().join(out);
    let sanitize = if san.is_empty() {
        "-fno-sanitize=all".to_string()
    } else {
        format!("-fsanitize={san}")
    };
    let st = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread"])
        .arg(&sanitize)
        .arg("-o")
        .arg(&out)
        .arg(src(src_name))
        .args(extra)
        .status()
        .expect("cc");
    assert!(
        st.success(),
        "cc {sanitize} {src_name}: the sanitizer runtimes come with gcc (libasan8, libtsan2, libubsan1; ci/install-deps.sh)"
    );
    out
}

/// The sanitizer's shared runtime, as the compiler links it.
fn runtime(san: &str) -> String {
    let name = match san {
        "address" => "libasan.so",
        "thread" => "libtsan.so",
        _ => "libubsan.so",
    };
    let out = Command::new("cc")
        .arg(format!("-print-file-name={name}"))
        .output()
        .expect("cc");
    let path = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(Path::new(&path).is_file(), "no {name} ({path})");
    path
}

/// Runs `prog` (killed after TIMEOUT: a hang fails the test), the preload given only to it.
fn run(prog: &Path, preload: Option<&str>, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(prog);
    cmd.env_remove("LD_PRELOAD")
        .env_remove("MRCACHE_ENABLE")
        // Ours before the runtime is refused by ASan's own check, on purpose; that check
        // is not what is tested here.
        .env("ASAN_OPTIONS", "verify_asan_link_order=0")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(p) = preload {
        cmd.env("LD_PRELOAD", p);
    }
    let child = cmd.spawn().unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(TIMEOUT) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!(
                "{} {preload:?} {env:?}: still running after {TIMEOUT:?}",
                prog.display()
            );
        }
    }
}

const OURS_FIRST: &str = "libmrcache.so";

/// The orders the preload is tested in: ours alone (the runtime the program links comes
/// after it), and the sanitizer's runtime first.
fn preloads(san: &str, after: &str) -> Vec<(String, String)> {
    let ours = format!("{}{after}", lib().display());
    vec![
        (OURS_FIRST.into(), ours.clone()),
        ("runtime first".into(), format!("{}:{ours}", runtime(san))),
    ]
}

/// san_plain.c built with `san`: the same exit status and standard output with the preload
/// (in both orders, cache enabled and `MRCACHE_ENABLE=0`) as without.
fn plain(san: &str) {
    let prog = build("san_plain.c", san, &format!("san_plain_{san}"), &[]);
    let base = run(&prog, None, &[]);
    assert_eq!(
        base.status.code(),
        Some(7),
        "{san} without the preload: {}",
        text(&base)
    );
    let mut failed = Vec::new();
    for (order, preload) in preloads(san, "") {
        for enable in [&[][..], &[("MRCACHE_ENABLE", "0")][..]] {
            // With ours first, our mmap and munmap forward to TSan's interceptors (the next
            // definitions), so it sees every mapping change and reports no false race.
            let env = enable.to_vec();
            let out = run(&prog, Some(&preload), &env);
            if out.status.code() != base.status.code() || out.stdout != base.stdout {
                failed.push(format!(
                    "{san}, {order}, {env:?}: status {:?} (want {:?}), output:\n{}",
                    out.status,
                    base.status.code(),
                    text(&out)
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// A program built without a sanitizer, with the sanitizer's runtime preloaded before
/// ours: the runtime sets itself up lazily, at the first call it intercepts, which can be
/// one our constructor makes (libc's dlvsym failing allocates its error message), and
/// looks its functions up through our dlsym then.
fn lazy(san: &str) {
    let prog = build("san_plain.c", "", &format!("san_plain_lazy_{san}"), &[]);
    let base = run(&prog, None, &[]);
    assert_eq!(
        base.status.code(),
        Some(7),
        "without the preload: {}",
        text(&base)
    );
    let preload = format!("{}:{}", runtime(san), lib().display());
    for env in [&[][..], &[("MRCACHE_ENABLE", "0")][..]] {
        let out = run(&prog, Some(&preload), env);
        assert!(
            out.status.code() == base.status.code() && out.stdout == base.stdout,
            "{san} runtime preloaded, {env:?}: status {:?}, output:\n{}",
            out.status,
            text(&out)
        );
    }
}

#[test]
fn a_preloaded_asan_runtime_sets_up_lazily_under_the_preload() {
    lazy("address");
}

#[test]
fn a_preloaded_tsan_runtime_sets_up_lazily_under_the_preload() {
    lazy("thread");
}

#[test]
fn asan_programs_run_under_the_preload() {
    plain("address");
}

#[test]
fn tsan_programs_run_under_the_preload() {
    plain("thread");
}

#[test]
fn ubsan_programs_run_under_the_preload() {
    plain("undefined");
}

/// san_verbs.c built with `san`, behind libmrcache.so and verbs_shim.so. The sanitizer's
/// allocator unmaps freed memory with its own system calls, which no hook sees: a cached
/// registration of a heap buffer would outlive its memory (san_verbs.c provokes it and
/// exits 1 on the stale hit). So the cache must turn itself off at the first registration,
/// with one line that names the sanitizer, and pass every call through; the program runs
/// to its end. With `MRCACHE_ENABLE=0` every call passes through, silently.
fn verbs(san: &str, name: &str) {
    let flags = ["-Wno-unused-parameter", "-Wno-cast-function-type"];
    let map = format!(
        "-Wl,--version-script={}/tests/c/host/verbs_shim.map",
        env!("CARGO_MANIFEST_DIR")
    );
    let shim = common::build_host(
        "verbs_shim.c",
        &dir(),
        &format!("libverbs_shim_{san}.so"),
        &[&flags[..], &["-shared", "-fPIC", &map]].concat(),
    );
    let prog = build(
        "san_verbs.c",
        san,
        &format!("san_verbs_{san}"),
        &[&flags[..], &["-libverbs"]].concat(),
    );
    let mut failed = Vec::new();
    for (order, preload) in preloads(san, &format!(":{}", shim.display())) {
        let out = run(
            &prog,
            Some(&preload),
            &[("MRCACHE_STATS", "1"), QUARANTINE_OFF],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let off: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("caching is OFF"))
            .collect();
        let ok = out.status.code() == Some(0)
            && stdout == "uncached: 15 registrations\n"
            && off.len() == 1
            && off[0].contains(name);
        if !ok {
            failed.push(format!(
                "{san}, {order}: status {:?}, output:\n{}",
                out.status,
                text(&out)
            ));
        }
        println!("{san}, {order}: {}", off.join(" | "));
        let out = run(
            &prog,
            Some(&preload),
            &[("MRCACHE_ENABLE", "0"), QUARANTINE_OFF],
        );
        if out.status.code() != Some(0)
            || out.stdout != b"uncached: 15 registrations\n"
            || !out.stderr.is_empty()
        {
            failed.push(format!(
                "{san}, {order}, MRCACHE_ENABLE=0: status {:?}, output:\n{}",
                out.status,
                text(&out)
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn an_asan_verbs_program_runs_with_the_cache_off() {
    verbs("address", "AddressSanitizer");
}

#[test]
fn a_tsan_verbs_program_runs_with_the_cache_off() {
    verbs("thread", "ThreadSanitizer");
}
