//! Where our `B` goes in Debian 12's and 13's arm64 system call stubs (checked anywhere: the
//! words are data here). The words are `aarch64::glibc`'s, which are those of
//! `aarch64-linux-gnu-objdump -d` of libc6:arm64 2.36-9+deb12u14 and 2.41-12+deb13u5.

use crate::monitor::patch::PatchTarget;
use crate::monitor::patch::aarch64::{self, SVC0, concurrent_safe, glibc::*, is_brk};

/// Each stub, and how many words stay before the `B`: every word before its `svc #0`.
const STUBS: [(&aarch64::Prologue, usize); 10] = [
    (&MUNMAP_236, 2),  // nop; mov x8, #215
    (&MADVISE_236, 2), // nop; mov x8, #233
    (&BRK_236, 2),     // mov x1, x0; mov x8, #214
    (&SHMAT_236, 3),   // sxtw x0, w0; sxtw x2, w2; mov x8, #196
    (&SHMDT_236, 1),   // mov x8, #197
    (&MUNMAP_241, 2),  // bti c; mov x8, #215
    (&MADVISE_241, 2), // bti c; mov x8, #233
    (&BRK_241, 3),     // bti c; mov x1, x0; mov x8, #214
    (&SHMAT_241, 4),   // bti c; sxtw x0, w0; sxtw x2, w2; mov x8, #196
    (&SHMDT_241, 2),   // bti c; mov x8, #197
];

/// A stub's `B` replaces its `svc #0`, a word the architecture lets us modify while other
/// threads execute it (as the `B`), and the words before it stay: a `BRK` a uprobe puts over
/// the entry's first word, and the word it writes back, never touch our `B`. The kept words
/// are no branch (nothing jumps past the `B`) and `mov x8` is the last of them.
#[test]
fn a_stubs_branch_replaces_its_svc_and_keeps_the_words_before() {
    for (i, (p, keep)) in STUBS.iter().enumerate() {
        assert_eq!(p.keep(), *keep, "stub {i}");
        assert_eq!(p.words[*keep], SVC0, "stub {i}");
        assert!(concurrent_safe(p.words[*keep]), "stub {i}");
        assert_eq!(
            p.words[keep - 1] & 0xffe0_001f,
            0xd280_0008,
            "stub {i}: mov x8, #NR"
        );
        for &w in &p.words[..*keep] {
            assert!(aarch64::b_target(0, w).is_none() && w & 0xfc00_0000 != 0x9400_0000);
        }
    }
    // The ordinary functions have no svc among the words we read: the `B` takes the first.
    for p in [
        &MMAP_236,
        &MMAP_241,
        &SBRK_236,
        &SBRK_241,
        &MREMAP_236,
        &MREMAP_241,
    ] {
        assert_eq!(p.keep(), 0);
    }
    // Every stub target's prologues are stubs.
    for t in [
        PatchTarget::Munmap,
        PatchTarget::Madvise,
        PatchTarget::Brk,
        PatchTarget::Shmat,
        PatchTarget::Shmdt,
    ] {
        for p in aarch64::prologues(t) {
            assert!(p.keep() > 0, "{:?}", t);
        }
    }
}

#[test]
fn brk_is_any_breakpoint_and_nothing_else() {
    // brk #5 (a uprobe's), brk #0 (gdb's), brk #0x3e8
    for w in [0xd42000a0, 0xd4200000, 0xd4207d00] {
        assert!(is_brk(w), "{w:#010x}");
    }
    // svc #0, hlt #0, hvc #0, bti c, udf #0
    for w in [SVC0, 0xd4400000, 0xd4000002, 0xd503245f, 0] {
        assert!(!is_brk(w), "{w:#010x}");
    }
}
