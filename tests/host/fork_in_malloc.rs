//! fork() in a signal handler of a program without threads, while it is in its own malloc
//! (tests/c/host/fork_in_malloc.c behind libmrcache.so and verbs_shim.c): glibc's fork()
//! takes no allocator lock there, and neither may our prepare handler.

use crate::common;

use std::path::PathBuf;

/// 5 s of forks from SIGALRM (every 2 ms) over the program's malloc/free, with
/// invalidations pending at most forks, under `MRCACHE_FORK` `auto` (here: flush, the fake
/// provider says nothing of the kernel) and `keep`; bounded by `timeout -s KILL 60`.
#[test]
fn fork_in_a_signal_handler_over_malloc_keeps_the_heap() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fork_in_malloc");
    let (shim, prog) = common::shim_and_program(
        "host",
        "verbs_shim",
        "fork_in_malloc",
        &dir,
        "storm",
        &["-libverbs"],
    );
    for mode in ["auto", "keep"] {
        let out = std::process::Command::new("timeout")
            .args(["-s", "KILL", "60"])
            .arg(&prog)
            .env("LD_PRELOAD", common::preload_with(&shim))
            .env("MRCACHE_MONITOR", "patch")
            .env("MRCACHE_FORK", mode)
            .output()
            .unwrap();
        let t = common::text(&out);
        println!("MRCACHE_FORK={mode}: {t} ({:?})", out.status);
        assert_eq!(
            out.status.code(),
            Some(0),
            "MRCACHE_FORK={mode}: {t} ({:?})",
            out.status
        );
        assert!(
            common::line(&t, "storm:").ends_with(", 0 children died"),
            "MRCACHE_FORK={mode}: {t}"
        );
    }
}
