//! The front (libmrcache.so) attaching the engine (libmrcache_engine.so) at the first verbs
//! call (docs/design/overview.md, "The front and the engine"): a first call racing a
//! constructor's verbs call under the loader's lock, the engine found beside a symbolic link
//! or a relative preload path after a `chdir`, a front without its engine, and a front
//! loaded with `dlopen` where the static TLS has no room left
//! (tests/c/host/engine_attach.c).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("engine_attach")
}

/// (verbs shim, program) for `tag`.
fn program(tag: &str) -> (PathBuf, PathBuf) {
    common::shim_and_program(
        "host",
        "verbs_shim",
        "engine_attach",
        &dir().join(tag),
        tag,
        &["-libverbs", "-ldl", "-lpthread", "-rdynamic"],
    )
}

/// Run `cmd`, killing it after 20 s (a hang is a failure, not a stuck test run).
fn run(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("still running after 20 s (killed): {}", common::text(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A thread's `dlopen` runs a constructor that makes a verbs call while the main thread
/// makes the process's first one: the main thread's `dlopen` of the engine waits for the
/// loader's lock that the constructor's thread holds, so that thread must not wait for the
/// main thread's attach. Both finish, and both are served by the cache (the constructor's
/// thread loads and attaches the engine itself). Ten runs.
#[test]
fn a_first_call_racing_a_constructors_verbs_call_attaches_without_waiting() {
    let (shim, prog) = program("race");
    let lib = common::build_host(
        "engine_attach_lib.c",
        &dir().join("race"),
        "libengine_attach.so",
        &["-shared", "-fPIC"],
    );
    for i in 0..10 {
        let mut cmd = Command::new(&prog);
        cmd.arg("race")
            .arg(&lib)
            .env("LD_PRELOAD", common::preload_with(&shim));
        let out = run(cmd);
        let text = common::text(&out);
        assert_eq!(out.status.code(), Some(0), "run {i}: {text}");
        assert_eq!(
            common::line(&text, "engine_attach:"),
            "engine_attach: main cached, constructor cached",
            "run {i}: {text}"
        );
    }
}

/// `LD_PRELOAD` naming a symbolic link to libmrcache.so finds the engine beside the file the
/// link names; a relative `LD_PRELOAD` path still finds it after the program left the
/// directory it started in.
#[test]
fn the_engine_is_found_beside_the_front_through_a_link_or_a_relative_path() {
    let (shim, prog) = program("paths");
    let links = dir().join("links");
    let _ = std::fs::remove_dir_all(&links);
    std::fs::create_dir_all(&links).unwrap();
    std::os::unix::fs::symlink(common::lib(), links.join("libmrcache.so")).unwrap();
    let mut cmd = Command::new(&prog);
    cmd.arg("pair").env(
        "LD_PRELOAD",
        format!(
            "{} {}",
            links.join("libmrcache.so").display(),
            shim.display()
        ),
    );
    let out = run(cmd);
    assert_eq!(
        common::line(&common::text(&out), "engine_attach:"),
        "engine_attach: cached",
        "through a link: {}",
        common::text(&out)
    );
    let lib = common::lib();
    let (home, name) = (lib.parent().unwrap(), lib.file_name().unwrap());
    let mut cmd = Command::new(&prog);
    cmd.args(["chdir", "/"]).current_dir(home).env(
        "LD_PRELOAD",
        format!("./{} {}", Path::new(name).display(), shim.display()),
    );
    let out = run(cmd);
    assert_eq!(
        common::line(&common::text(&out), "engine_attach:"),
        "engine_attach: cached",
        "relative, after chdir /: {}",
        common::text(&out)
    );
}

/// A front copied without its engine: one line says so, and every verbs call goes to
/// libibverbs (the shim here), uncached.
#[test]
fn a_front_without_its_engine_passes_every_call_through_and_says_so_once() {
    let (shim, prog) = program("alone");
    let alone = dir().join("alone-lib");
    let _ = std::fs::remove_dir_all(&alone);
    std::fs::create_dir_all(&alone).unwrap();
    std::fs::copy(common::lib(), alone.join("libmrcache.so")).unwrap();
    let mut cmd = Command::new(&prog);
    cmd.arg("pair").env(
        "LD_PRELOAD",
        format!(
            "{} {}",
            alone.join("libmrcache.so").display(),
            shim.display()
        ),
    );
    let out = run(cmd);
    let text = common::text(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert_eq!(
        common::line(&text, "engine_attach:"),
        "engine_attach: uncached",
        "{text}"
    );
    let said: Vec<&str> = text.lines().filter(|l| l.starts_with("mrcache:")).collect();
    assert_eq!(said.len(), 1, "{text}");
    assert!(
        said[0].contains("libmrcache_engine.so")
            && said[0].ends_with("verbs calls go to libibverbs uncached"),
        "{text}"
    );
}

/// A front loaded with `dlopen` after another object's initial-exec TLS took the static
/// TLS's spare room still loads: its per-thread words are reached through a TLS descriptor,
/// not the initial-exec model, which would need that room. Its words are then in a block
/// glibc allocates with `malloc` at a thread's first access, which a hook inside malloc
/// cannot wait for: it does not attach the engine (said in one line, calls uncached), and
/// threads whose mallocs mmap finish.
#[test]
fn the_front_loads_with_dlopen_when_the_static_tls_is_full() {
    let (_, prog) = program("tls");
    let big = common::build_host(
        "engine_attach_lib.c",
        &dir().join("tls"),
        "libbig_tls.so",
        &["-shared", "-fPIC", "-DBIG_TLS=1664"],
    );
    let mut cmd = Command::new(&prog);
    cmd.arg("tls").arg(&big).arg(common::lib());
    let out = run(cmd);
    let text = common::text(&out);
    assert_eq!(
        common::line(&text, "engine_attach:"),
        "engine_attach: loaded, not attached, threads done",
        "{text}"
    );
    assert!(
        common::line(&text, "mrcache:").contains("not in the static TLS"),
        "{text}"
    );
}
