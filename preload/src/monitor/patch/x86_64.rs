//! The x86-64 function starts the patch monitor recognises (glibc 2.36 and 2.41), and our
//! jump over them.

use super::*;
use crate::monitor::cross_modify::{self, JMP_LEN};

/// A recognised function start: `bytes`, where positions in `any` (a bit mask) are
/// displacements that may differ between builds. `first`: the length of its first
/// instruction, the only one our jump may replace (threads may stand at any later
/// boundary). One shorter than `JMP_LEN` is replaced by a `jmp rel8` to a `jmp rel32` in
/// `pad`: the alignment padding that ends at the function's entry in that glibc (checked by
/// disassembly: it follows a `ret` or a call that does not return, and nothing branches into
/// it); empty where the first instruction is long enough.
pub struct Prologue {
    pub bytes: [u8; MATCH_LEN],
    pub any: u16,
    pub first: u8,
    pub pad: &'static [u8],
}

/// GNU as's 10-byte `nopw cs:[rax+rax*1+0]`, and the 6-byte `nopw [rax+rax*1+0]`.
pub(super) const NOP10: [u8; 10] = [0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0];
const NOP6: [u8; 6] = [0x66, 0x0f, 0x1f, 0x44, 0, 0];
const NOP10_NOP2: [u8; 12] = [0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0, 0x66, 0x90];

/// How many bytes of a function start are compared with a `Prologue`, and read of another
/// patcher's jump.
pub const MATCH_LEN: usize = 14;
pub(super) const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Our jump at `site` to `hook`: `jmp rel32` (not the `movabs r11; jmp r11` that
/// libfabric's memhooks takes for its own patch: it would then refuse to start), through a
/// trampoline when the hook is out of its reach.
pub(super) fn jump_to(site: usize, hook: usize) -> Result<[u8; JMP_LEN], PatchError> {
    if let Some(j) = cross_modify::jmp_rel32(site, hook) {
        return Ok(j);
    }
    let t = crate::monitor::trampoline::trampoline(site, hook).ok_or(PatchError::Far)?;
    cross_modify::jmp_rel32(site, t).ok_or(PatchError::Far)
}

pub(super) fn matches(p: &Prologue, code: &[u8]) -> bool {
    p.bytes
        .iter()
        .zip(code)
        .enumerate()
        .all(|(i, (want, got))| p.any & (1 << i) != 0 || want == got)
}

/// Where our jump starts in a function that begins with `code`, and the prologue there, if
/// it is one we know.
pub(super) fn known_start<'p>(
    prologues: &'p [Prologue],
    code: &[u8; ENDBR64.len() + MATCH_LEN],
) -> Option<(usize, &'p Prologue)> {
    let skip = if code[..4] == ENDBR64 { 4 } else { 0 };
    prologues
        .iter()
        .find(|p| matches(p, &code[skip..skip + MATCH_LEN]))
        .map(|p| (skip, p))
}

/// Where our jump starts in a function that begins with `code`, if it is one we know.
pub fn site_offset(
    prologues: &[Prologue],
    code: &[u8; ENDBR64.len() + MATCH_LEN],
) -> Option<usize> {
    known_start(prologues, code).map(|(skip, _)| skip)
}

/// The prologue of a glibc system call stub returning an int (`munmap`, `madvise`):
/// `mov eax, NR; syscall; cmp rax, -4095; jae` (glibc 2.36 and 2.41).
pub const fn syscall_stub(nr: u8) -> Prologue {
    Prologue {
        bytes: [
            0xb8, nr, 0, 0, 0, 0x0f, 0x05, 0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff, 0x73,
        ],
        any: 0,
        first: 5,
        pad: &[],
    }
}

/// glibc's `brk`: `mov eax, 12; syscall; mov rdx, [rip + __curbrk@GOT]` (2.36 and 2.41).
pub const BRK: Prologue = Prologue {
    bytes: [
        0xb8, 0x0c, 0, 0, 0, 0x0f, 0x05, 0x48, 0x8b, 0x15, 0, 0, 0, 0,
    ],
    any: 0b11_1100_0000_0000,
    first: 5,
    pad: &[],
};

/// glibc's `mmap`, which checks the offset's alignment before the system call.
pub const MMAP: [Prologue; 2] = [
    // 2.36: mov r10d, ecx; test r9d, 0xfff; jne +0x14; mov eax, 9 (first 2 bytes)
    Prologue {
        bytes: [
            0x41, 0x89, 0xca, 0x41, 0xf7, 0xc1, 0xff, 0x0f, 0, 0, 0x75, 0x14, 0xb8, 0x09,
        ],
        any: 0,
        first: 3,
        pad: &NOP10,
    },
    // 2.41: test r9d, 0xfff; jne +0x27; push rbp; mov ebp, ecx; push rbx; mov rbx, rdi (2 of 3)
    Prologue {
        bytes: [
            0x41, 0xf7, 0xc1, 0xff, 0x0f, 0, 0, 0x75, 0x27, 0x55, 0x89, 0xcd, 0x53, 0x48,
        ],
        any: 0,
        first: 7,
        pad: &[],
    },
];

static MUNMAP_STUB: [Prologue; 1] = [syscall_stub(0x0b)];
static MADVISE_STUB: [Prologue; 1] = [syscall_stub(0x1c)];
static BRK_STUB: [Prologue; 1] = [BRK];
/// glibc 2.36's mremap: `sub rsp, 0x58; mov [rsp+0x40], r8; mov rax, fs:[0x28]` (the stack
/// protector; the jump ends inside that load, which nothing branches into).
static MREMAP_START: [Prologue; 1] = [Prologue {
    bytes: [
        0x48, 0x83, 0xec, 0x58, 0x4c, 0x89, 0x44, 0x24, 0x40, 0x64, 0x48, 0x8b, 0x04, 0x25,
    ],
    any: 0,
    first: 4,
    pad: &NOP6,
}];
/// glibc's shmdt: `mov eax, 67; syscall; cmp rax, -4096; ja` (a pointer-returning stub).
static SHMDT_STUB: [Prologue; 1] = [pointer_stub(0x43)];
static SHMAT_STUB: [Prologue; 1] = [pointer_stub(0x1e)];

/// A system call stub returning a pointer (`shmat`, `shmdt`): `mov eax, NR; syscall;
/// cmp rax, -4096; ja` (glibc 2.36 and 2.41).
const fn pointer_stub(nr: u8) -> Prologue {
    Prologue {
        bytes: [
            0xb8, nr, 0, 0, 0, 0x0f, 0x05, 0x48, 0x3d, 0x00, 0xf0, 0xff, 0xff, 0x77,
        ],
        any: 0,
        first: 5,
        pad: &[],
    }
}

/// glibc's sbrk, an ordinary function (checked: no branch in it lands inside these bytes).
static SBRK_START: [Prologue; 2] = [
    // 2.36: push r12; mov r12, [rip + __curbrk@GOT]; cmp byte [rip + __libc_initial], 0
    // (the jump ends inside that compare)
    Prologue {
        bytes: [
            0x41, 0x54, 0x4c, 0x8b, 0x25, 0, 0, 0, 0, 0x80, 0x3d, 0, 0, 0,
        ],
        any: 0b11_1001_1110_0000,
        first: 2,
        pad: &NOP10_NOP2,
    },
    // 2.41: cmp byte [rip + __libc_initial], 0; push r12; push rbp; push rbx; mov rbx, rdi
    Prologue {
        bytes: [
            0x80, 0x3d, 0, 0, 0, 0, 0x00, 0x41, 0x54, 0x55, 0x53, 0x48, 0x89, 0xfb,
        ],
        any: 0b00_0000_0011_1100,
        first: 7,
        pad: &[],
    },
];

pub(super) fn prologues(t: PatchTarget) -> &'static [Prologue] {
    match t {
        PatchTarget::Munmap => &MUNMAP_STUB,
        PatchTarget::Madvise => &MADVISE_STUB,
        PatchTarget::Brk => &BRK_STUB,
        PatchTarget::Mmap => &MMAP,
        PatchTarget::Mremap => &MREMAP_START,
        PatchTarget::Shmdt => &SHMDT_STUB,
        PatchTarget::Sbrk => &SBRK_START,
        PatchTarget::Shmat => &SHMAT_STUB,
    }
}
