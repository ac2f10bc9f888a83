//! mrcache and UCX's memory hooks in one process, on the host (no RDMA; a fake provider):
//! with UCX's hooks installed in bistro mode (jumps over libc's entry points) and in reloc
//! mode (GOT entries, "original" functions found with `dlsym(RTLD_NEXT)`), each way memory
//! goes away (a program's munmap, madvise, mremap, shmdt, and glibc's own munmap inside
//! free()) must reach both mrcache's cache and UCX's event handler, with caching on.

mod common;

use common::{cc, lib, text};
use std::path::{Path, PathBuf};
use std::process::Command;

fn build(dir: &Path) -> Option<PathBuf> {
    if !Path::new("/usr/include/ucm/api/ucm.h").exists() {
        println!("skipped: libucx-dev is not installed (ci/install-deps.sh installs it)");
        return None;
    }
    std::fs::create_dir_all(dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/host");
    let watch = dir.join("libucm_watch.so");
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        watch.to_str().unwrap(),
        src.join("ucx/ucm_watch.c").to_str().unwrap(),
        "-lucm",
        "-lucs",
    ]);
    let prog = dir.join("ucx_coexist");
    cc(&[
        "-o",
        prog.to_str().unwrap(),
        src.join("ucx_coexist.c").to_str().unwrap(),
        &format!("-L{}", dir.display()),
        "-Wl,--no-as-needed",
        "-lucm_watch",
        "-lucm",
        "-lucs",
        "-libverbs",
        "-Wl,-rpath,$ORIGIN",
    ]);
    Some(prog)
}

#[test]
fn both_see_every_unmap_under_ucx_hooks() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("coexist_host");
    let Some(prog) = build(&dir) else { return };
    let mut failures = Vec::new();
    for mode in ["bistro", "reloc"] {
        for scenario in ["munmap", "madvise", "mremap", "shmdt", "free"] {
            let out = Command::new(&prog)
                .arg(scenario)
                .env("LD_PRELOAD", lib())
                .env("UCX_MEM_MMAP_HOOK_MODE", mode)
                .output()
                .unwrap();
            let text = text(&out);
            println!("{mode} {scenario}: {} {}", out.status, text.trim());
            if !out.status.success() || text.contains("caching is OFF") {
                failures.push(format!("{mode} {scenario}: {} {}", out.status, text.trim()));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
