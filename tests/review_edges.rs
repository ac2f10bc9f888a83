//! Defects the second review of issue 20 proved, each rerun with its own scenario of
//! `tests/c/host/review_edges.c` (a fake provider behind libmrcache.so and `w345_shim.c`):
//! a fork child's rereg of the parent's MR moved it (rc 0, one provider rereg); a `_Fork`
//! child's dereg of a parent's shadow reached the provider when a parent thread held the
//! cache lock at the fork (26-57 of 300); refused rereg calls left errno 0; ON_DEMAND
//! registrations were counted as device memory.

mod common;

use common::{lib, text};
use std::path::{Path, PathBuf};
use std::process::Command;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("review_edges")
}

fn src(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c/host")
        .join(name)
        .display()
        .to_string()
}

/// The program and the shim, one build per test (tests run in parallel).
fn build(tag: &str) -> (PathBuf, PathBuf) {
    let d = dir().join(tag);
    std::fs::create_dir_all(&d).unwrap();
    let exe = d.join("review_edges");
    let shim = d.join("libw345_shim.so");
    let map = format!("-Wl,--version-script={}", src("w345_shim.map"));
    let st = Command::new("cc")
        .args([
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wno-cast-function-type",
        ])
        .args(["-Wno-unused-parameter", "-Wno-unused-variable"])
        .args(["-o", exe.to_str().unwrap(), &src("review_edges.c")])
        .args(["-libverbs", "-lpthread"])
        .status()
        .unwrap();
    assert!(st.success());
    let st = Command::new("cc")
        .args(["-O1", "-shared", "-fPIC", "-o", shim.to_str().unwrap()])
        .args([&src("w345_shim.c"), &map])
        .status()
        .unwrap();
    assert!(st.success());
    (exe, shim)
}

fn run(tag: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let (exe, shim) = build(tag);
    let preload = format!("{} {}", lib().display(), shim.display());
    let out = Command::new("timeout")
        .args(["-s", "KILL", "120"])
        .arg(&exe)
        .args(args)
        .env("LD_PRELOAD", preload)
        .env("MRCACHE_MONITOR", "patch")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {t}");
    t
}

#[test]
fn a_fork_child_cannot_rereg_the_parents_cached_mr() {
    for scenario in ["forkrereg", "forkrereg_plain"] {
        let t = run(scenario, &[scenario], &[]);
        assert!(
            t.contains("child: rereg of the parent's cached MR (shared with a shadow): rc -1 errno 22, provider rereg calls 0"),
            "{scenario}: {t}"
        );
        assert!(
            t.contains("child: dereg of the parent's shadow: rc 0 provider deregs 0"),
            "{t}"
        );
    }
}

#[test]
fn a_fork_child_never_sends_a_parents_shadow_to_the_provider() {
    let t = run("forklock", &["forklock", "300"], &[]);
    assert!(
        t.contains("300 _Fork children; child dereg of the parent's shadow failed in 0, reached the provider in 0"),
        "{t}"
    );
}

#[test]
fn refused_rereg_calls_set_errno() {
    let t = run("rereg_bad", &["rereg_bad"], &[]);
    assert!(
        t.contains("rereg of primary while shadow held: rc -1 errno 22"),
        "{t}"
    );
    assert!(
        t.contains("rereg(flags 0) of sole handle: rc -1 errno 22"),
        "{t}"
    );
}

#[test]
fn on_demand_registrations_are_not_called_device_memory() {
    let stats = dir().join("odp.json");
    let _ = std::fs::remove_file(&stats);
    run(
        "odp",
        &["odp"],
        &[
            ("MRCACHE_STATS", "json"),
            ("MRCACHE_STATS_FILE", stats.to_str().unwrap()),
        ],
    );
    let json = std::fs::read_to_string(&stats).unwrap();
    assert!(json.contains(r#""bypassed":{"on-demand":2}"#), "{json}");
}
