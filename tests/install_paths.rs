//! Where the launcher looks for libmrcache.so when installed: next to itself, PREFIX/lib
//! (`make install`), PREFIX/lib/mrcache, and the multiarch directory a Debian package uses
//! (/usr/lib/x86_64-linux-gnu, ci/package).

use std::path::Path;
use std::process::Command;

fn layout(root: &Path, libdir: &str) -> String {
    let _ = std::fs::remove_dir_all(root);
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join(libdir)).unwrap();
    let exe = root.join("bin/mrcache");
    std::fs::copy(env!("CARGO_BIN_EXE_mrcache"), &exe).unwrap();
    // Any file does for `mrcache lib`: it only locates the library.
    std::fs::write(root.join(libdir).join("libmrcache.so"), b"").unwrap();
    let out = Command::new(&exe)
        .arg("lib")
        .env_remove("MRCACHE_LIB")
        .output()
        .unwrap();
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
            .args(["-s", "-C", env!("CARGO_MANIFEST_DIR"), "install", "CARGO=false"])
            .arg(format!("PREFIX={prefix}"))
            .output()
            .unwrap()
    };
    for bad in ["a b", "rv[pwd]x", "a&b", "a'b", "a\"b", "a\\b", "a;b", "a{b}"] {
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
    assert!(!err.contains("refused"), "a plain PREFIX was refused: {err}");
}
