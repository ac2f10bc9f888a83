//! Programs built with a sanitizer (ASan, TSan, UBSan) run under the preload. A sanitizer's
//! runtime looks up the functions it intercepts (`dlsym(RTLD_NEXT, "mmap")`, ...) while it
//! sets itself up, before our constructor: our `dlsym` is then called at a time when every
//! interceptor's pointer to the real function is still NULL, and must reach none of them
//! (docs/design/monitor.md, "Sanitizer builds").
//!
//! Each program is run without the preload, with `LD_PRELOAD=libmrcache.so` (the sanitizer
//! runtime then comes after ours: `verify_asan_link_order=0`) and with the sanitizer's
//! runtime preloaded first, with and without `MRCACHE_ENABLE=0`; exit status and standard
//! output must match the run without the preload. A verbs program built with ASan (and one
//! with TSan), with a fake provider as in tests/host/fast_path.rs, must run with the cache
//! off and say why in one line: the sanitizer's allocator unmaps memory unseen.

use crate::common;

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
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sanitizer_builds");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn src(name: &str) -> String {
    format!("{}/tests/c/host/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Builds `tests/c/host/SRC` with `-fsanitize=SAN` into `out`.
fn build(src_name: &str, san: &str, out: &str, extra: &[&str]) -> PathBuf {
    build_with("cc", src_name, san, out, extra)
}

/// Builds `tests/c/host/SRC` with `-fsanitize=SAN` into `out`, with the compiler `cc`.
fn build_with(cc: &str, src_name: &str, san: &str, out: &str, extra: &[&str]) -> PathBuf {
    let out = dir().join(out);
    let sanitize = if san.is_empty() {
        "-fno-sanitize=all".to_string()
    } else {
        format!("-fsanitize={san}")
    };
    let st = Command::new(cc)
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
        "{cc} {sanitize} {extra:?} {src_name}: the sanitizer runtimes come with gcc (libasan8, libtsan2, liblsan0, libubsan1) and clang (ci/install-deps.sh)"
    );
    out
}

/// The sanitizer's shared runtime, as the compiler links it.
fn runtime(san: &str) -> String {
    let name = match san {
        "address" => "libasan.so",
        "thread" => "libtsan.so",
        "leak" => "liblsan.so",
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

/// How san_verbs.c is built: the compiler, the sanitizer, flags (`-static-libasan`), and
/// whether its runtime is a shared object (then also tested preloaded first).
struct VerbsBuild<'a> {
    cc: &'a str,
    san: &'a str,
    flags: &'a [&'a str],
    shared_runtime: bool,
    /// The runtime's options each run needs besides `QUARANTINE_OFF`.
    env: &'a [(&'a str, &'a str)],
}

/// Whether `cc` is installed (clang is optional: MSan and HWASan need it).
fn have(cc: &str) -> bool {
    Command::new(cc)
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// san_verbs.c built with `san`, behind libmrcache.so and verbs_shim.so. The sanitizer's
/// allocator unmaps freed memory with its own system calls, which no hook sees: a cached
/// registration of a heap buffer would outlive its memory (san_verbs.c provokes it and
/// exits 1 on the stale hit). So the cache must turn itself off at the first registration,
/// with one line that names the sanitizer, and pass every call through; the program runs
/// to its end. With `MRCACHE_ENABLE=0` every call passes through, silently.
fn verbs(san: &str, name: &str) {
    verbs_built(
        &VerbsBuild {
            cc: "cc",
            san,
            flags: &[],
            shared_runtime: true,
            env: &[],
        },
        name,
    );
}

fn verbs_built(b: &VerbsBuild, name: &str) {
    let san = b.san;
    // Not the runtime's own file name (`-static-libasan` in a name ending `.so` reads to
    // ASan's start-up check as a second, shared ASan runtime).
    let linked = if b.flags.is_empty() { "" } else { "_linked_in" };
    let tag = format!("{}_{san}{linked}", b.cc);
    let flags = ["-Wno-unused-parameter", "-Wno-cast-function-type"];
    let map = format!(
        "-Wl,--version-script={}/tests/c/host/verbs_shim.map",
        env!("CARGO_MANIFEST_DIR")
    );
    let shim = common::build_host(
        "verbs_shim.c",
        &dir(),
        &format!("libverbs_shim_{tag}.so"),
        &[&flags[..], &["-shared", "-fPIC", &map]].concat(),
    );
    let prog = build_with(
        b.cc,
        "san_verbs.c",
        san,
        &format!("san_verbs_{tag}"),
        &[&flags[..], b.flags, &["-libverbs"]].concat(),
    );
    // The program as it runs without libmrcache.so: where the machine cannot run it (HWASan
    // on x86-64 needs a kernel with the tagged address ABI), clang's runtimes are skipped.
    let env = [&[QUARANTINE_OFF][..], b.env].concat();
    let alone = run(&prog, Some(&shim.display().to_string()), &env);
    if alone.status.code() != Some(0) || alone.stdout != b"uncached: 15 registrations\n" {
        assert_eq!(
            b.cc,
            "clang",
            "{tag} without libmrcache.so:\n{}",
            text(&alone)
        );
        println!("SKIPPED: {tag} does not run here:\n{}", text(&alone));
        return;
    }
    let after = format!(":{}", shim.display());
    let orders = if b.shared_runtime {
        preloads(san, &after)
    } else {
        // The runtime is in the program: nothing to preload first.
        vec![(OURS_FIRST.into(), format!("{}{after}", lib().display()))]
    };
    let mut failed = Vec::new();
    for (order, preload) in orders {
        let out = run(
            &prog,
            Some(&preload),
            &[&[("MRCACHE_STATS", "1")][..], &env].concat(),
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
                "{tag}, {order}: status {:?}, output:\n{}",
                out.status,
                text(&out)
            ));
        }
        println!("{tag}, {order}: {}", off.join(" | "));
        let out = run(
            &prog,
            Some(&preload),
            &[&[("MRCACHE_ENABLE", "0")][..], &env].concat(),
        );
        if out.status.code() != Some(0)
            || out.stdout != b"uncached: 15 registrations\n"
            || !out.stderr.is_empty()
        {
            failed.push(format!(
                "{tag}, {order}, MRCACHE_ENABLE=0: status {:?}, output:\n{}",
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

#[test]
fn an_lsan_verbs_program_runs_with_the_cache_off() {
    verbs("leak", "LeakSanitizer");
}

/// A runtime linked into the program (`-static-lib*`) exports none of the symbols the
/// loaded objects' tables are searched for: it is found in the executable's `.symtab`.
fn static_runtime(san: &str, flag: &str, name: &str) {
    verbs_built(
        &VerbsBuild {
            cc: "cc",
            san,
            flags: &[flag],
            shared_runtime: false,
            env: &[],
        },
        name,
    );
}

#[test]
fn a_static_asan_verbs_program_runs_with_the_cache_off() {
    static_runtime("address", "-static-libasan", "AddressSanitizer");
}

#[test]
fn a_static_tsan_verbs_program_runs_with_the_cache_off() {
    static_runtime("thread", "-static-libtsan", "ThreadSanitizer");
}

/// clang's runtimes (linked into the program, as clang does by default): MSan and HWASan,
/// which gcc does not have. Skipped, saying so, where clang is not installed.
fn clang_runtime(san: &str, flags: &[&str], name: &str) {
    if !have("clang") {
        println!("SKIPPED: no clang (ci/install-deps.sh installs it): {san} not tested");
        return;
    }
    verbs_built(
        &VerbsBuild {
            cc: "clang",
            san,
            flags,
            shared_runtime: false,
            // libibverbs, libnl and libmrcache.so are not built with MSan: what they write
            // reads to it as uninitialised. Its allocator is what is tested, not its reports.
            env: &[("MSAN_OPTIONS", "report_umrs=0")],
        },
        name,
    );
}

#[test]
fn an_msan_verbs_program_runs_with_the_cache_off() {
    clang_runtime("memory", &[], "MemorySanitizer");
}

#[test]
fn an_hwasan_verbs_program_runs_with_the_cache_off() {
    // clang 14's x86-64 HWASan objects do not link with relaxed GOT relocations.
    clang_runtime("hwaddress", &["-Wl,--no-relax"], "HWAddressSanitizer");
}
