//! The aarch64 patch mechanism, the counterpart of the x86-64 jump in `x86_64` and
//! `cross_modify`; `sites_aarch64::patch_at` writes it with `cross_modify::replace_word`.
//! What is here is the part that can be checked anywhere: the instruction encodings, Debian 12's and 13's arm64 glibc
//! prologues (word for word, from aarch64-linux-gnu-objdump of libc6 2.36-9+deb12u14 and
//! 2.41-12+deb13u5), which of their first instructions may be replaced while other threads
//! execute them, the trampoline, and the decoding of UCX's and libfabric's aarch64 jumps;
//! plus, on aarch64 only, the cache maintenance after a code write.
//!
//! The mechanism (docs/design/monitor.md, "aarch64"): one aligned 32-bit store of a `B` to
//! a 16-byte trampoline slot (`ldr x16, #8; br x16; .quad hook`) mapped within +-128 MiB of
//! libc. The Arm ARM allows an instruction to be modified while another thread executes it
//! only when the old and the new instruction are both B, BL, BRK, HVC, ISB, NOP (which
//! Linux's `aarch64_insn_is_nop` reads as every hint but YIELD, WFE, WFI, SEV and SEVL),
//! SMC or SVC: `concurrent_safe` says so for the old one. In the system call stubs the `B`
//! replaces the `svc #0` (`Prologue::keep`): the instructions before it (`bti c`, `nop`,
//! `mov x8, #NR`, register moves no hook reads) stay, so a uprobe or a breakpoint on the
//! entry (a `BRK` over its first word, the file's word written back when it goes) never
//! touches our `B`, and a thread in the kernel returns past it. Every other 2.41 target
//! starts with a hint (`bti c` or `paciasp`), replaced by the `B`; 2.36's mmap, mremap and
//! sbrk start with an ordinary instruction, patched only while the process has one thread.
//! Nothing is relocated: our hooks make the system call themselves and never return into
//! libc's function, so the replaced instruction is never executed again by us; a thread
//! that had executed it already runs on into the unchanged next instruction.

use super::PatchTarget;

/// `B` reaches +-128 MiB (26-bit word offset).
pub const B_REACH: i64 = 1 << 27;

/// `b to` written at `site`, if `to` is a word-aligned address within reach.
pub fn b_to(site: usize, to: usize) -> Option<u32> {
    let off = (to as i64).wrapping_sub(site as i64);
    if off % 4 != 0 || site % 4 != 0 || !(-B_REACH..B_REACH).contains(&off) {
        return None;
    }
    Some(0x1400_0000 | ((off >> 2) as u32 & 0x03ff_ffff))
}

/// Where the `B` (not `BL`) `insn` at `site` leads.
pub fn b_target(site: usize, insn: u32) -> Option<usize> {
    if insn & 0xfc00_0000 != 0x1400_0000 {
        return None;
    }
    let imm = ((insn & 0x03ff_ffff) << 6) as i32 >> 6; // sign-extend 26 bits
    Some((site as i64).wrapping_add(imm as i64 * 4) as usize)
}

/// `NOP`, `BTI c`, `PACIASP` (all in the hint space).
#[cfg(test)]
pub const NOP: u32 = 0xd503_201f;
#[cfg(test)]
pub const BTI_C: u32 = 0xd503_245f;
#[cfg(test)]
pub const PACIASP: u32 = 0xd503_233f;

/// Whether `insn` may be replaced by a `B` while another thread executes it (the Arm ARM's
/// list, B2.2.5 "Concurrent modification and execution of instructions", read as the Linux
/// kernel's `aarch64_insn_hotpatch_safe` does): B, BL, SVC, HVC, SMC, BRK, and the hints
/// other than YIELD, WFE, WFI, SEV, SEVL (NOP, BTI, PACIASP... execute as NOPs or guards).
pub fn concurrent_safe(insn: u32) -> bool {
    let b_or_bl = insn & 0x7c00_0000 == 0x1400_0000;
    let svc_hvc_smc = insn & 0xffe0_001c == 0xd400_0000 && insn & 3 != 0;
    let brk = insn & 0xffe0_001f == 0xd420_0000;
    let hint = insn & 0xffff_f01f == 0xd503_201f;
    let yield_wfe_wfi_sev_sevl = hint && matches!((insn >> 5) & 0x7f, 1..=5);
    b_or_bl || svc_hvc_smc || brk || (hint && !yield_wfe_wfi_sev_sevl)
}

/// A recognised function start: `words`, where words whose bit is set in `any` are
/// PC-relative (adrp, ldr offsets into the GOT) and may differ between builds of the same
/// source: only their opcode and register bits are compared.
pub struct Prologue {
    pub words: &'static [u32],
    pub any: u8,
}

/// `svc #0`.
pub const SVC0: u32 = 0xd400_0001;

impl Prologue {
    /// How many words stay before our `B`: in a system call stub, every word before its
    /// `svc #0` (which the `B` replaces: the architecture lets both be modified under
    /// execution, and a thread in the kernel returns to the word after it); elsewhere none.
    pub fn keep(&self) -> usize {
        self.words.iter().position(|&w| w == SVC0).unwrap_or(0)
    }
}

/// Whether `insn` is a `BRK` (a uprobe's, `BRK #5`, or a debugger's breakpoint).
pub fn is_brk(insn: u32) -> bool {
    insn & 0xffe0_001f == 0xd420_0000
}

/// The opcode bits of an `adrp` (its immediate and nothing else may differ).
const ADRP_OPCODE: u32 = 0x9f00_0000;
/// The opcode, size and register bits of `ldr xt, [xn, #imm]` (the immediate may differ).
const LDR_OPCODE: u32 = 0xffc0_03ff;

fn same(want: u32, got: u32, any: bool) -> bool {
    if !any {
        return want == got;
    }
    let mask = if want & ADRP_OPCODE == 0x9000_0000 {
        ADRP_OPCODE | 0x1f
    } else if want & 0xffc0_0000 == 0xf940_0000 || want & 0xffc0_0000 == 0x3940_0000 {
        LDR_OPCODE // ldr x, ldrb w
    } else {
        0xffff_ffff
    };
    want & mask == got & mask
}

/// Whether `code` (the function's first words) starts with `p`.
pub fn matches(p: &Prologue, code: &[u32]) -> bool {
    code.len() >= p.words.len()
        && p.words
            .iter()
            .zip(code)
            .enumerate()
            .all(|(i, (&w, &g))| same(w, g, p.any & (1 << i) != 0))
}

/// Debian 12 (glibc 2.36) and 13 (2.41) arm64 prologues: up to the end of the error test
/// after the system call, or six instructions of an ordinary function.
pub mod glibc {
    use super::Prologue;
    /// 2.36 munmap: nop; mov x8, #215; svc #0; cmn x0, #0xfff; b.cs +8; ret
    pub const MUNMAP_236: Prologue = Prologue {
        words: &[
            0xd503201f, 0xd2801ae8, 0xd4000001, 0xb13ffc1f, 0x54000042, 0xd65f03c0,
        ],
        any: 0,
    };
    /// 2.36 madvise: nop; mov x8, #233; svc #0; cmn x0, #0xfff; b.cs +8; ret
    pub const MADVISE_236: Prologue = Prologue {
        words: &[
            0xd503201f, 0xd2801d28, 0xd4000001, 0xb13ffc1f, 0x54000042, 0xd65f03c0,
        ],
        any: 0,
    };
    /// 2.36 brk: mov x1, x0; mov x8, #214; svc #0; adrp x2, GOT; ldr x2, [x2, #off]; str x0, [x2]
    pub const BRK_236: Prologue = Prologue {
        words: &[
            0xaa0003e1, 0xd2801ac8, 0xd4000001, 0x900005e2, 0xf9470c42, 0xf9000040,
        ],
        any: 0b01_1000,
    };
    /// 2.36 sbrk: stp x29, x30, [sp, #-48]!; adrp x1, ..; mov x29, sp; ldrb w1, [x1, #..];
    /// str x21, [sp, #32]; adrp x21, GOT
    pub const SBRK_236: Prologue = Prologue {
        words: &[
            0xa9bd7bfd, 0xf0000641, 0x910003fd, 0x39417821, 0xf90013f5, 0x900005f5,
        ],
        any: 0b10_1010,
    };
    /// 2.36 mmap: tst x5, #0xfff; b.ne +0x24; sxtw x2, w2; sxtw x3, w3; sxtw x4, w4; mov x8, #222
    pub const MMAP_236: Prologue = Prologue {
        words: &[
            0xf2402cbf, 0x54000121, 0x93407c42, 0x93407c63, 0x93407c84, 0xd2801bc8,
        ],
        any: 0,
    };
    /// 2.36 mremap: sub sp, sp, #0x50; adrp x5, GOT; ldr x5, [x5, #..]; stp x29, x30, [sp, #48];
    /// add x29, sp, #0x30; str x4, [sp, #72]
    pub const MREMAP_236: Prologue = Prologue {
        words: &[
            0xd10143ff, 0xf0000585, 0xf94734a5, 0xa9037bfd, 0x9100c3fd, 0xf90027e4,
        ],
        any: 0b00_0110,
    };
    /// 2.36 shmdt: mov x8, #197; svc #0; cmn x0, #1, lsl #12; b.hi +8; ret
    pub const SHMDT_236: Prologue = Prologue {
        words: &[0xd28018a8, 0xd4000001, 0xb140041f, 0x54000048, 0xd65f03c0],
        any: 0,
    };
    /// 2.36 shmat: sxtw x0, w0; sxtw x2, w2; mov x8, #196; svc #0; cmn x0, #1, lsl #12; b.hi +8
    pub const SHMAT_236: Prologue = Prologue {
        words: &[
            0x93407c00, 0x93407c42, 0xd2801888, 0xd4000001, 0xb140041f, 0x54000048,
        ],
        any: 0,
    };
    /// 2.41 munmap: bti c; mov x8, #215; svc #0; cmn x0, #0xfff; b.cs +8; ret
    pub const MUNMAP_241: Prologue = Prologue {
        words: &[
            0xd503245f, 0xd2801ae8, 0xd4000001, 0xb13ffc1f, 0x54000042, 0xd65f03c0,
        ],
        any: 0,
    };
    /// 2.41 madvise: bti c; mov x8, #233; svc #0; cmn x0, #0xfff; b.cs +8; ret
    pub const MADVISE_241: Prologue = Prologue {
        words: &[
            0xd503245f, 0xd2801d28, 0xd4000001, 0xb13ffc1f, 0x54000042, 0xd65f03c0,
        ],
        any: 0,
    };
    /// 2.41 brk: bti c; mov x1, x0; mov x8, #214; svc #0; adrp x2, GOT; ldr x2, [x2, #..]
    pub const BRK_241: Prologue = Prologue {
        words: &[
            0xd503245f, 0xaa0003e1, 0xd2801ac8, 0xd4000001, 0xd0000642, 0xf9470c42,
        ],
        any: 0b11_0000,
    };
    /// 2.41 sbrk: bti c; adrp x1, ..; paciasp; stp x29, x30, [sp, #-48]!; mov x29, sp;
    /// ldrb w1, [x1, #..]
    pub const SBRK_241: Prologue = Prologue {
        words: &[
            0xd503245f, 0xf0000681, 0xd503233f, 0xa9bd7bfd, 0x910003fd, 0x39402421,
        ],
        any: 0b10_0010,
    };
    /// 2.41 mmap: bti c; tst x5, #0xfff; b.ne +0x24; sxtw x2, w2; sxtw x3, w3; sxtw x4, w4
    pub const MMAP_241: Prologue = Prologue {
        words: &[
            0xd503245f, 0xf2402cbf, 0x54000121, 0x93407c42, 0x93407c63, 0x93407c84,
        ],
        any: 0,
    };
    /// 2.41 mremap: paciasp; sub sp, sp, #0x50; adrp x5, GOT; ldr x5, [x5, #..];
    /// stp x29, x30, [sp, #48]; add x29, sp, #0x30
    pub const MREMAP_241: Prologue = Prologue {
        words: &[
            0xd503233f, 0xd10143ff, 0xb0000605, 0xf9473ca5, 0xa9037bfd, 0x9100c3fd,
        ],
        any: 0b00_1100,
    };
    /// 2.41 shmdt: bti c; mov x8, #197; svc #0; cmn x0, #1, lsl #12; b.hi +8; ret
    pub const SHMDT_241: Prologue = Prologue {
        words: &[
            0xd503245f, 0xd28018a8, 0xd4000001, 0xb140041f, 0x54000048, 0xd65f03c0,
        ],
        any: 0,
    };
    /// 2.41 shmat: bti c; sxtw x0, w0; sxtw x2, w2; mov x8, #196; svc #0; cmn x0, #1, lsl #12
    pub const SHMAT_241: Prologue = Prologue {
        words: &[
            0xd503245f, 0x93407c00, 0x93407c42, 0xd2801888, 0xd4000001, 0xb140041f,
        ],
        any: 0,
    };
}

/// Each target's prologues, Debian 12's then 13's.
pub fn prologues(t: PatchTarget) -> &'static [Prologue] {
    use glibc::*;
    static MUNMAP: [Prologue; 2] = [MUNMAP_236, MUNMAP_241];
    static MADVISE: [Prologue; 2] = [MADVISE_236, MADVISE_241];
    static BRK: [Prologue; 2] = [BRK_236, BRK_241];
    static MMAP: [Prologue; 2] = [MMAP_236, MMAP_241];
    static MREMAP: [Prologue; 2] = [MREMAP_236, MREMAP_241];
    static SHMDT: [Prologue; 2] = [SHMDT_236, SHMDT_241];
    static SBRK: [Prologue; 2] = [SBRK_236, SBRK_241];
    static SHMAT: [Prologue; 2] = [SHMAT_236, SHMAT_241];
    match t {
        PatchTarget::Munmap => &MUNMAP,
        PatchTarget::Madvise => &MADVISE,
        PatchTarget::Brk => &BRK,
        PatchTarget::Mmap => &MMAP,
        PatchTarget::Mremap => &MREMAP,
        PatchTarget::Shmdt => &SHMDT,
        PatchTarget::Sbrk => &SBRK,
        PatchTarget::Shmat => &SHMAT,
    }
}

/// A trampoline slot's four words for `hook`: `ldr x16, #8; br x16; .quad hook`. x16 (IP0)
/// is the register the procedure call standard lets veneers clobber between a call and the
/// callee, as the linker's own long-branch veneers do.
pub fn trampoline(hook: usize) -> [u32; 4] {
    [
        0x5800_0050,
        0xd61f_0200,
        hook as u32,
        (hook as u64 >> 32) as u32,
    ]
}

/// Where another patcher's aarch64 jump at the start of `code` leads: `movz x15, #a, lsl
/// #48; movk x15, #b, lsl #32; movk x15, #c, lsl #16; movk x15, #d; br x15` (UCX's bistro,
/// libfabric's and Open MPI's memhooks; any order of the shifts, any register they branch
/// through), `ldr xN, #8; br xN; .quad` (UCX's newer bistro), or our own `B` (returned too:
/// the caller compares it with its slot).
pub fn foreign_target(site: usize, code: &[u32]) -> Option<usize> {
    let first = *code.first()?;
    if let Some(t) = b_target(site, first) {
        return Some(t);
    }
    let br = |insn: u32, rd: u32| insn == 0xd61f_0000 | (rd << 5);
    // ldr xN, #8 (literal, imm19 = 2)
    if first & 0xffff_ffe0 == 0x5800_0040 {
        let rd = first & 0x1f;
        if code.len() >= 4 && br(code[1], rd) {
            return Some((code[2] as u64 | (code[3] as u64) << 32) as usize);
        }
        return None;
    }
    // movz xN, #imm, lsl #hw*16 then movk of the same register, then br xN
    if first & 0xff80_0000 != 0xd280_0000 {
        return None;
    }
    let rd = first & 0x1f;
    let mut value = 0u64;
    for (i, &insn) in code.iter().enumerate() {
        let hw = (insn >> 21) & 3;
        let imm = ((insn >> 5) & 0xffff) as u64;
        let movz = insn & 0xff80_0000 == 0xd280_0000;
        let movk = insn & 0xff80_0000 == 0xf280_0000;
        if insn & 0x1f == rd && ((i == 0 && movz) || (i > 0 && movk)) {
            value = (value & !(0xffff << (hw * 16))) | imm << (hw * 16);
        } else if i > 0 && br(insn, rd) {
            return Some(value as usize);
        } else {
            return None;
        }
    }
    None
}

/// Make the `len` bytes of code just written at `at` visible to instruction fetch on every
/// core (what GCC's `__builtin___clear_cache` does): clean each data cache line to the point
/// of unification, wait, invalidate each instruction cache line, wait, and resynchronise
/// this thread's fetch. Line sizes from CTR_EL0 (readable at EL0 on Linux). Other threads
/// still need a context synchronisation of their own (an exception return, or
/// membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE)) before they are sure to fetch the
/// new word rather than a stale copy in their pipeline.
#[cfg(target_arch = "aarch64")]
pub fn sync_icache(at: usize, len: usize) {
    #[cfg(test)]
    LAST_SYNC.store(at, std::sync::atomic::Ordering::Relaxed);
    let ctr: u64;
    // SAFETY: reading CTR_EL0, which Linux lets EL0 read (or emulates).
    unsafe { std::arch::asm!("mrs {0}, ctr_el0", out(reg) ctr, options(nomem, nostack)) };
    let dline = 4usize << ((ctr >> 16) & 0xf);
    let iline = 4usize << (ctr & 0xf);
    let end = at + len;
    let mut p = at & !(dline - 1);
    while p < end {
        // SAFETY: cache maintenance by address on our own mapped code; no memory is changed.
        unsafe { std::arch::asm!("dc cvau, {0}", in(reg) p, options(nostack)) };
        p += dline;
    }
    // SAFETY: barriers only.
    unsafe { std::arch::asm!("dsb ish", options(nostack)) };
    let mut p = at & !(iline - 1);
    while p < end {
        // SAFETY: as above.
        unsafe { std::arch::asm!("ic ivau, {0}", in(reg) p, options(nostack)) };
        p += iline;
    }
    // SAFETY: barriers only.
    unsafe { std::arch::asm!("dsb ish", "isb", options(nostack)) };
}

/// The last address `sync_icache` was given: the unit tests see that a patch flushed its
/// word (qemu-user keeps the instruction cache coherent itself, so no behaviour shows it).
#[cfg(all(test, target_arch = "aarch64"))]
pub static LAST_SYNC: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[cfg(test)]
mod tests {
    use super::glibc::*;
    use super::*;

    const ALL: [&Prologue; 16] = [
        &MUNMAP_236,
        &MADVISE_236,
        &BRK_236,
        &SBRK_236,
        &MMAP_236,
        &MREMAP_236,
        &SHMDT_236,
        &SHMAT_236,
        &MUNMAP_241,
        &MADVISE_241,
        &BRK_241,
        &SBRK_241,
        &MMAP_241,
        &MREMAP_241,
        &SHMDT_241,
        &SHMAT_241,
    ];

    #[test]
    fn b_encodes_and_decodes_within_reach_only() {
        let site = 0x40_0000_1000usize;
        // objdump: `17fcfeb2 b 278e0` at e7e18 (2.36 munmap's error branch)
        assert_eq!(b_to(0xe7e18, 0x278e0), Some(0x17fcfeb2));
        assert_eq!(b_target(0xe7e18, 0x17fcfeb2), Some(0x278e0));
        for off in [4i64, -4, B_REACH - 4, -B_REACH, 0x123454] {
            let to = (site as i64 + off) as usize;
            let b = b_to(site, to).unwrap();
            assert_eq!(b_target(site, b), Some(to), "offset {off:#x}");
        }
        assert_eq!(b_to(site, site + B_REACH as usize), None);
        assert_eq!(b_to(site, site - B_REACH as usize - 4), None);
        assert_eq!(b_to(site, site + 2), None);
        assert_eq!(b_target(site, 0x94000001), None, "bl is not b");
    }

    #[test]
    fn concurrent_safe_is_the_architecture_list() {
        for ok in [
            NOP, BTI_C, PACIASP, 0xd503249f, /* bti j */
            0x14000000, 0x97ffffff, 0xd4000001, /* svc #0 */
            0xd4200000, /* brk #0 */
        ] {
            assert!(concurrent_safe(ok), "{ok:#010x}");
        }
        for no in [
            0xd503203f, /* yield */
            0xd503205f, /* wfe */
            0xd503207f, /* wfi */
            0xd503209f, /* sev */
            0xd50320bf, /* sevl */
            0xd2801ae8, /* mov x8 */
            0xaa0003e1, 0xa9bd7bfd, /* stp */
            0xf2402cbf, /* tst */
            0x900005e2, /* adrp */
            0x54000042, /* b.cs */
            0xb4000040, /* cbz */
            0xd61f0200, /* br */
        ] {
            assert!(!concurrent_safe(no), "{no:#010x}");
        }
    }

    #[test]
    fn every_241_entry_may_be_patched_under_execution() {
        for p in [
            &MUNMAP_241,
            &MADVISE_241,
            &BRK_241,
            &SBRK_241,
            &MMAP_241,
            &MREMAP_241,
            &SHMDT_241,
            &SHMAT_241,
            &MUNMAP_236,
            &MADVISE_236,
        ] {
            assert!(concurrent_safe(p.words[0]), "{:#010x}", p.words[0]);
        }
        for p in [
            &BRK_236,
            &SBRK_236,
            &MMAP_236,
            &MREMAP_236,
            &SHMDT_236,
            &SHMAT_236,
        ] {
            assert!(!concurrent_safe(p.words[0]), "{:#010x}", p.words[0]);
        }
    }

    #[test]
    fn prologues_match_themselves_and_no_other() {
        for (i, p) in ALL.iter().enumerate() {
            assert!(matches(p, p.words));
            for (j, q) in ALL.iter().enumerate() {
                if i != j {
                    assert!(!matches(p, q.words), "prologue {i} matches {j}");
                }
            }
            // one changed opcode bit in any word fails the match
            for k in 0..p.words.len() {
                let mut w = p.words.to_vec();
                w[k] ^= 1 << 31;
                assert!(!matches(p, &w), "prologue {i} word {k}");
            }
            assert!(!matches(p, &p.words[..p.words.len() - 1]), "short code");
        }
    }

    #[test]
    fn pc_relative_words_may_differ_in_their_immediate_only() {
        // 2.41's brk with another GOT page and offset still matches; another register does not
        let mut w = BRK_241.words.to_vec();
        w[4] = 0xf0000642; // adrp x2, other page
        w[5] = 0xf9471042; // ldr x2, [x2, #other]
        assert!(matches(&BRK_241, &w));
        w[5] = 0xf9471043; // ldr x3, [x2, ...]
        assert!(!matches(&BRK_241, &w));
    }

    #[test]
    fn trampoline_words_are_ldr_br_and_the_address() {
        let t = trampoline(0x0000_ffff_8123_4568);
        assert_eq!(t[0], 0x58000050, "ldr x16, #8");
        assert_eq!(t[1], 0xd61f0200, "br x16");
        assert_eq!(foreign_target(0, &t), Some(0x0000_ffff_8123_4568));
    }

    #[test]
    fn foreign_jumps_decode() {
        let hook = 0x0000_fffe_1234_5678u64;
        let part = |hw: u64| ((hook >> (hw * 16)) & 0xffff) as u32;
        // movz x15, #a, lsl #48; movk lsl 32; movk lsl 16; movk; br x15
        let ucx = [
            0xd2e0000f | part(3) << 5,
            0xf2c0000f | part(2) << 5,
            0xf2a0000f | part(1) << 5,
            0xf280000f | part(0) << 5,
            0xd61f01e0,
        ];
        assert_eq!(foreign_target(0x1000, &ucx), Some(hook as usize));
        let mut wrong_reg = ucx;
        wrong_reg[4] = 0xd61f0200; // br x16
        assert_eq!(foreign_target(0x1000, &wrong_reg), None);
        let ldr = [0x5800004f, 0xd61f01e0, hook as u32, (hook >> 32) as u32];
        assert_eq!(foreign_target(0x1000, &ldr), Some(hook as usize));
        assert_eq!(foreign_target(0x1000, &BTI_C_ONLY), None);
        assert_eq!(foreign_target(0x1000, &[0x14000010]), Some(0x1040));
    }
    const BTI_C_ONLY: [u32; 2] = [BTI_C, NOP];

    /// On aarch64: two functions in an anonymous code page, `f` returning 1 and `g`
    /// returning 2; 4 threads call `f` in a loop while the main thread stores `b g` over
    /// `f`'s first instruction (one aligned 32-bit store, `sync_icache`), puts the `mov` back,
    /// and again, 2000 times. Every call must return 1 or 2 (a torn or unflushed word would be
    /// a crash, SIGILL, or another value), and after the last store of `b g` the main thread
    /// must see 2. `MRCACHE_TEST_A64_TEAR=1` writes the word as two 16-bit halves instead, the
    /// deliberately broken variant.
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn a_branch_stored_over_a_running_function_is_never_torn() {
        use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};
        let tear = std::env::var_os("MRCACHE_TEST_A64_TEAR").is_some();
        // SAFETY: a private anonymous page, ours alone; code written before it is made
        // executable, then only whole words (or halves, in the broken variant) over f.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                crate::sys::page_size(),
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(page, libc::MAP_FAILED);
        let code = page as *mut u32;
        let mov1 = 0x5280_0020u32; // mov w0, #1
        let mov2 = 0x5280_0040u32; // mov w0, #2
        let ret = 0xd65f_03c0u32;
        // SAFETY: within the page.
        unsafe {
            code.write_volatile(mov1);
            code.add(1).write_volatile(ret);
            code.add(4).write_volatile(mov2);
            code.add(5).write_volatile(ret);
        }
        sync_icache(page as usize, 32);
        // SAFETY: the page holds `mov w0, #1; ret` (then a branch to `mov w0, #2; ret`).
        let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(page) };
        let b = b_to(page as usize, page as usize + 16).unwrap();
        let stop = AtomicBool::new(false);
        let bad = AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    while !stop.load(Relaxed) {
                        let v = f();
                        if v != 1 && v != 2 {
                            bad.store(v | 0x100, Relaxed);
                        }
                    }
                });
            }
            let store = |w: u32| {
                if tear {
                    let h = code as *mut u16;
                    // SAFETY: the broken variant: the two halves of the same word.
                    unsafe {
                        h.write_volatile(w as u16);
                        std::thread::yield_now();
                        h.add(1).write_volatile((w >> 16) as u16);
                    }
                } else {
                    // SAFETY: f's first word, 4-aligned: one single-copy-atomic store.
                    unsafe { (*(code as *const AtomicU32)).store(w, Release) };
                }
                sync_icache(code as usize, 4);
            };
            for _ in 0..2000 {
                store(b);
                assert_eq!(f(), 2, "after the store of `b g` and sync_icache");
                store(mov1);
            }
            stop.store(true, Relaxed);
        });
        assert_eq!(bad.load(Relaxed), 0, "a caller saw neither 1 nor 2");
        // SAFETY: the page mapped above.
        unsafe { libc::munmap(page, crate::sys::page_size()) };
    }
}
