//! Memory hooks that run before libmrcache.so's constructor (an allocator or another
//! preloaded library initialising first) behave exactly like libc's.

use std::path::{Path, PathBuf};
use std::process::Command;

fn lib() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_mrcache"));
    exe.with_file_name("libmrcache.so")
}

/// Builds `tests/c/host/NAME.c` into a shared library under the target directory.
fn shared_object(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/host/{name}.c"));
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("lib{name}.so"));
    let st = Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success(), "building {}", src.display());
    out
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
