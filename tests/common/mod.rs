//! What the host tests that build C programs share: where libmrcache.so is, one compiler
//! invocation with the project's C flags, and a child's output as one text.

#![allow(dead_code)] // each test file uses part of it

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn lib() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mrcache")).with_file_name("libmrcache.so")
}

/// Compiles `args` (sources, outputs, libraries) with the flags every C file here uses.
pub fn cc(args: &[&str]) {
    let st = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror"])
        .args(args)
        .status()
        .expect("cc");
    assert!(st.success(), "cc {args:?}");
}

/// Builds `tests/c/host/SRC` into `dir/out` with `flags`.
pub fn build_host(src: &str, dir: &Path, out: &str, flags: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c/host")
        .join(src);
    let out = dir.join(out);
    let mut args = vec!["-o", out.to_str().unwrap(), src.to_str().unwrap()];
    args.extend_from_slice(flags);
    cc(&args);
    out
}

/// Standard output then standard error, as text.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every logging and statistics knob on, pointing into `dir`: a process that never makes a
/// verbs call must still print nothing and write nothing there.
pub fn noisy_env(dir: &Path) -> Vec<(String, String)> {
    vec![
        ("MRCACHE_LOG".into(), "trace".into()),
        (
            "MRCACHE_LOG_FILE".into(),
            dir.join("log.%p").display().to_string(),
        ),
        ("MRCACHE_STATS".into(), "json".into()),
        (
            "MRCACHE_STATS_FILE".into(),
            dir.join("stats.%p").display().to_string(),
        ),
    ]
}

/// A fresh, empty directory under the target directory, unique to this test process.
pub fn tempdir(tag: &str) -> PathBuf {
    let d =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
