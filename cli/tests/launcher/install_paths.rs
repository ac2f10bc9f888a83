//! Where the launcher looks for libmrcache.so when installed: next to itself, PREFIX/lib
//! (`make install`), PREFIX/lib/mrcache, and the multiarch directory a Debian package uses
//! (/usr/lib/x86_64-linux-gnu, ci/package).

use std::path::Path;
use std::process::Command;

/// Run a program just copied: another test's child, forked while the copy was open for
/// writing, holds it open until its exec, and an exec meanwhile fails with ETXTBSY.
fn run_copied(cmd: &mut Command) -> std::process::Output {
    for _ in 0..100 {
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            r => return r.unwrap(),
        }
    }
    cmd.output().unwrap()
}

fn layout(root: &Path, libdir: &str) -> String {
    let _ = std::fs::remove_dir_all(root);
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join(libdir)).unwrap();
    let exe = root.join("bin/mrcache");
    std::fs::copy(env!("CARGO_BIN_EXE_mrcache"), &exe).unwrap();
    // The real library: the launcher checks it is an ELF shared object exporting
    // `mrcache_version`.
    let lib = Path::new(env!("CARGO_BIN_EXE_mrcache")).with_file_name("libmrcache.so");
    std::fs::copy(&lib, root.join(libdir).join("libmrcache.so"))
        .unwrap_or_else(|e| panic!("{}: {e} (cargo build --release --workspace)", lib.display()));
    let out = run_copied(Command::new(&exe).arg("lib").env_remove("MRCACHE_LIB"));
    assert!(out.status.success(), "{libdir}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn the_launcher_finds_the_library_where_it_is_installed() {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join("install-paths");
    let multiarch = format!("lib/{}-linux-gnu", std::env::consts::ARCH);
    for libdir in ["lib", "lib/mrcache", multiarch.as_str()] {
        let root = tmp.join(libdir.replace('/', "_"));
        let found = layout(&root, libdir);
        let want = std::fs::canonicalize(root.join(libdir).join("libmrcache.so")).unwrap();
        assert_eq!(Path::new(&found), want, "installed in PREFIX/{libdir}");
    }
}

/// `make install` refuses, in one line naming PREFIX, a PREFIX the Makefile's unquoted
/// recipes, the module file's Tcl string and the sed filling it in cannot carry (a space
/// split it into stray directories, `[pwd]` ran in Tcl, `&` was sed's match), before building
/// or writing anything. `CARGO=false` makes a build fail, so a PREFIX that gets past the check
/// fails with make's build error instead of the refusal.
#[test]
fn make_install_refuses_a_prefix_it_cannot_quote() {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join("install-prefix");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let make = |prefix: &str| {
        Command::new("make")
            .args([
                "-s",
                "-C",
                concat!(env!("CARGO_MANIFEST_DIR"), "/.."),
                "install",
                "CARGO=false",
            ])
            .arg(format!("PREFIX={prefix}"))
            .output()
            .unwrap()
    };
    for bad in [
        "a b", "rv[pwd]x", "a&b", "a'b", "a\"b", "a\\b", "a;b", "a{b}",
    ] {
        let prefix = format!("{}/{bad}", tmp.display());
        let out = make(&prefix);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{prefix:?}: {out:?}");
        assert!(
            err.contains("make install: PREFIX") && err.contains("refused"),
            "{prefix:?}: no refusal naming PREFIX: {err}"
        );
        let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
        assert!(left.is_empty(), "{prefix:?} wrote {left:?}");
    }
    let out = make(&format!("{}/ok-prefix_1.0+x", tmp.display()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("refused"),
        "a plain PREFIX was refused: {err}"
    );
}

/// A file that is not the library (a 4-byte `PREFIX/lib/libmrcache.so`) does not shadow the
/// real one further down the search: it is skipped with one line saying why.
#[test]
fn a_bad_candidate_is_skipped_with_the_reason() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("install-shadow");
    let multiarch = format!("lib/{}-linux-gnu", std::env::consts::ARCH);
    let _ = layout(&root, &multiarch);
    std::fs::write(root.join("lib/libmrcache.so"), b"\x7fELF").unwrap();
    let out = Command::new(root.join("bin/mrcache"))
        .arg("lib")
        .env_remove("MRCACHE_LIB")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    let want = std::fs::canonicalize(root.join(&multiarch).join("libmrcache.so")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        want.to_str().unwrap(),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("lib/libmrcache.so") && err.contains("skipped") && err.contains("not an ELF"),
        "{err}"
    );
}

/// `mrcache info` names the engine beside the library, or says it is missing (the front then
/// sends verbs calls to libibverbs uncached): a copy of libmrcache.so alone is a broken
/// install.
#[test]
fn info_names_the_engine_or_says_it_is_missing() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("install-engine");
    layout(&root, "lib");
    let info = || {
        let out = Command::new(root.join("bin/mrcache"))
            .arg("info")
            .env_remove("MRCACHE_LIB")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.starts_with("engine:"))
            .unwrap_or_else(|| panic!("no engine line: {out:?}"))
            .to_string()
    };
    assert!(
        info().starts_with("engine: not found ("),
        "the library alone: {}",
        info()
    );
    let engine = Path::new(env!("CARGO_BIN_EXE_mrcache")).with_file_name("libmrcache_engine.so");
    std::fs::copy(&engine, root.join("lib/libmrcache_engine.so")).unwrap();
    let want = std::fs::canonicalize(root.join("lib/libmrcache_engine.so")).unwrap();
    assert_eq!(info(), format!("engine: {}", want.display()));
}
