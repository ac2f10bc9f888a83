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
