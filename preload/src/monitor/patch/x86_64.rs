//! The x86-64 function starts the patch monitor recognises (glibc 2.36 and 2.41), and our
//! jump over them.

use super::*;
use crate::monitor::cross_modify::{self, JMP_LEN};

/// A recognised function start: `bytes`, where positions in `any` (a bit mask) are
/// displacements that may differ between builds. `keep`: the length of the instruction(s)
/// at the start (after an endbr64) that stay as they are: our jump replaces the instruction
/// after them, `replaced` bytes long, the only one it may change (threads may stand at any
/// later boundary). A uprobe or a debugger's breakpoint puts an `int3` over the entry's
/// first byte, runs the file's first instruction elsewhere and resumes after it, on our
/// jump; removed, it writes that byte back, which we never changed (docs/design/monitor.md,
/// "Where the jump goes"). `keep` 0: the first instruction itself is replaced
/// (a start where nothing after it is known to be replaceable). `undo`: code run before the
/// hook that takes back what the kept instructions did to the stack (`pop r12` after
/// `push r12`). A replaced instruction shorter than `JMP_LEN` becomes a `jmp rel8` to a
/// `jmp rel32` in `pad`: alignment padding that ends at the function's entry in that glibc
/// (checked by disassembly: it follows a `ret`, a `jmp` or a call that does not return, and
/// nothing branches into it); empty where the replaced instruction is long enough.
/// `pad_end`: where that padding ends, in bytes from the prologue's start (after an
/// endbr64); 0: at the function's entry (padding before it). Otherwise it is the padding
/// after the function's last `ret`, up to the next function (where the padding before the
/// entry is shorter than the jump), and `pad` begins with that `ret`.
#[derive(Clone, Copy)]
pub struct Prologue {
    pub bytes: [u8; MATCH_LEN],
    pub any: u16,
    pub keep: u8,
    pub replaced: u8,
    pub pad: &'static [u8],
    pub pad_end: u8,
    pub undo: &'static [u8],
}

/// GNU as's 10-byte `nopw cs:[rax+rax*1+0]`, and the 6-byte `nopw [rax+rax*1+0]`.
pub(super) const NOP10: [u8; 10] = [0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0];
const NOP6: [u8; 6] = [0x66, 0x0f, 0x1f, 0x44, 0, 0];
const NOP10_NOP2: [u8; 12] = [0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0, 0x66, 0x90];
/// The 9-byte `nopw [rax+rax*1+0]` (disp32) and the 5-byte `nopl [rax+rax*1+0]`.
const NOP9: [u8; 9] = [0x66, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0];
const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0, 0];
/// The paddings that end at glibc 2.36's system call stubs (`objdump -d` of Debian 12's
/// libc.so.6): munmap and shmdt NOP10_NOP2 after a `ret`, madvise NOP5 after a `jmp`,
/// mprotect NOP10 and NOP5 after a `ret`, shmat NOP6 after a `ret`, brk NOP9 after a `ret`.
const STUB_PADS: [&[u8]; 5] = [&NOP10_NOP2, &NOP10, &NOP9, &NOP6, &NOP5];

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

/// Where the padding `p` needs ends in the function at `f` whose prologue starts at `skip`.
pub(super) fn pad_end(p: &Prologue, f: usize, skip: usize) -> usize {
    match p.pad_end {
        0 => f,
        end => f + skip + end as usize,
    }
}

/// The first of `prologues` that the function at `f`, starting with `code`, can be patched
/// by: its bytes match, and the padding a short replaced instruction needs is there.
pub(super) fn usable_start<'p>(
    prologues: &'p [Prologue],
    code: &[u8; ENDBR64.len() + MATCH_LEN],
    f: usize,
) -> Option<(usize, &'p Prologue)> {
    let skip = if code[..4] == ENDBR64 { 4 } else { 0 };
    prologues
        .iter()
        .find(|p| {
            matches(p, &code[skip..skip + MATCH_LEN])
                && (p.replaced as usize >= JMP_LEN || padding_ends_at(pad_end(p, f, skip), p.pad))
        })
        .map(|p| (skip, p))
}

/// How many forms `stub_past_mov` gives a stub.
pub const STUB_FORMS: usize = STUB_PADS.len() + 1;

/// The padding after glibc 2.41's madvise (its `ret`, NOP10, NOP5, up to the next function
/// at +0x30) and brk (its `ret`, NOP10, NOP2, up to +0x40), whose padding before the entry
/// (NOP3 after a call that does not return, NOP4 after a `jmp`) is shorter than the jump
/// (`objdump -d` of Debian 13's libc.so.6; nothing branches into it).
const RET_NOP10_NOP5: [u8; 16] = [
    0xc3, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0, 0x0f, 0x1f, 0x44, 0, 0,
];
const RET_NOP10_NOP2: [u8; 13] = [
    0xc3, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0, 0x66, 0x90,
];

/// `stub_past_mov`'s forms, and before the last (the first instruction replaced) the stub
/// patched after its first instruction with the padding `pad` ending `end` bytes after it.
const fn stub_past_mov_or_after(
    p: Prologue,
    pad: &'static [u8],
    end: u8,
) -> [Prologue; STUB_FORMS + 1] {
    let f = stub_past_mov(p);
    let after = Prologue {
        pad_end: end,
        ..past_mov(p, pad)
    };
    [f[0], f[1], f[2], f[3], f[4], after, f[5]]
}

/// A system call stub patched after its `mov eax, NR` (kept): its `syscall` becomes a
/// `jmp rel8` to a `jmp rel32` in the padding `pad` before the function.
const fn past_mov(p: Prologue, pad: &'static [u8]) -> Prologue {
    Prologue {
        keep: 5,
        replaced: 2,
        pad,
        ..p
    }
}

/// `p` (a system call stub whose first instruction is replaced) patched after its first
/// instruction where one of the paddings of glibc 2.36's stubs precedes it, else as `p`.
pub const fn stub_past_mov(p: Prologue) -> [Prologue; STUB_FORMS] {
    [
        past_mov(p, STUB_PADS[0]),
        past_mov(p, STUB_PADS[1]),
        past_mov(p, STUB_PADS[2]),
        past_mov(p, STUB_PADS[3]),
        past_mov(p, STUB_PADS[4]),
        p,
    ]
}

/// The prologue of a glibc system call stub returning an int (`munmap`, `madvise`):
/// `mov eax, NR; syscall; cmp rax, -4095; jae` (glibc 2.36 and 2.41).
pub const fn syscall_stub(nr: u8) -> Prologue {
    Prologue {
        bytes: [
            0xb8, nr, 0, 0, 0, 0x0f, 0x05, 0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff, 0x73,
        ],
        any: 0,
        keep: 0,
        replaced: 5,
        pad: &[],
        pad_end: 0,
        undo: &[],
    }
}

/// glibc's `brk`: `mov eax, 12; syscall; mov rdx, [rip + __curbrk@GOT]` (2.36 and 2.41).
pub const BRK: Prologue = Prologue {
    bytes: [
        0xb8, 0x0c, 0, 0, 0, 0x0f, 0x05, 0x48, 0x8b, 0x15, 0, 0, 0, 0,
    ],
    any: 0b11_1100_0000_0000,
    keep: 0,
    replaced: 5,
    pad: &[],
    pad_end: 0,
    undo: &[],
};

/// glibc 2.41's `mmap` start: test r9d, 0xfff; jne +0x27; push rbp; mov ebp, ecx; push rbx;
/// mov rbx, rdi (2 of 3).
const MMAP_241: [u8; MATCH_LEN] = [
    0x41, 0xf7, 0xc1, 0xff, 0x0f, 0, 0, 0x75, 0x27, 0x55, 0x89, 0xcd, 0x53, 0x48,
];
/// The padding that ends at glibc 2.41's `mmap` (after a `ret`): NOP10, NOP5.
const NOP10_NOP5: [u8; 15] = [
    0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0, 0x0f, 0x1f, 0x44, 0, 0,
];

/// glibc's `mmap`, which checks the offset's alignment before the system call.
pub const MMAP: [Prologue; 3] = [
    // 2.36: mov r10d, ecx (kept: it only copies the fourth argument); test r9d, 0xfff
    // (replaced); jne +0x14; mov eax, 9 (first 2 bytes)
    Prologue {
        bytes: [
            0x41, 0x89, 0xca, 0x41, 0xf7, 0xc1, 0xff, 0x0f, 0, 0, 0x75, 0x14, 0xb8, 0x09,
        ],
        any: 0,
        keep: 3,
        replaced: 7,
        pad: &[],
        pad_end: 0,
        undo: &[],
    },
    // 2.41: test r9d, 0xfff (kept: it only sets the flags); jne +0x27 (replaced: a `jmp
    // rel8` to a `jmp rel32` in the padding before the function)
    Prologue {
        bytes: MMAP_241,
        any: 0,
        keep: 7,
        replaced: 2,
        pad: &NOP10_NOP5,
        pad_end: 0,
        undo: &[],
    },
    // 2.41 without that padding: the first instruction is replaced.
    Prologue {
        bytes: MMAP_241,
        any: 0,
        keep: 0,
        replaced: 7,
        pad: &[],
        pad_end: 0,
        undo: &[],
    },
];

static MUNMAP_STUB: [Prologue; STUB_FORMS] = stub_past_mov(syscall_stub(0x0b));
static MADVISE_STUB: [Prologue; STUB_FORMS + 1] =
    stub_past_mov_or_after(syscall_stub(0x1c), &RET_NOP10_NOP5, 0x30);
static BRK_STUB: [Prologue; STUB_FORMS + 1] = stub_past_mov_or_after(BRK, &RET_NOP10_NOP2, 0x40);
/// glibc 2.36's mremap: `sub rsp, 0x58` (kept, taken back by `add rsp, 0x58` before the
/// hook); `mov [rsp+0x40], r8` (replaced: exactly the jump's length); `mov rax, fs:[0x28]`.
static MREMAP_START: [Prologue; 1] = [Prologue {
    bytes: [
        0x48, 0x83, 0xec, 0x58, 0x4c, 0x89, 0x44, 0x24, 0x40, 0x64, 0x48, 0x8b, 0x04, 0x25,
    ],
    any: 0,
    keep: 4,
    replaced: 5,
    pad: &[],
    pad_end: 0,
    undo: &[0x48, 0x83, 0xc4, 0x58],
}];
/// glibc's shmdt: `mov eax, 67; syscall; cmp rax, -4096; ja` (a pointer-returning stub).
static SHMDT_STUB: [Prologue; STUB_FORMS] = stub_past_mov(pointer_stub(0x43));
static SHMAT_STUB: [Prologue; STUB_FORMS] = stub_past_mov(pointer_stub(0x1e));

/// A system call stub returning a pointer (`shmat`, `shmdt`): `mov eax, NR; syscall;
/// cmp rax, -4096; ja` (glibc 2.36 and 2.41).
const fn pointer_stub(nr: u8) -> Prologue {
    Prologue {
        bytes: [
            0xb8, nr, 0, 0, 0, 0x0f, 0x05, 0x48, 0x3d, 0x00, 0xf0, 0xff, 0xff, 0x77,
        ],
        any: 0,
        keep: 0,
        replaced: 5,
        pad: &[],
        pad_end: 0,
        undo: &[],
    }
}

/// glibc 2.41's `sbrk` start: cmp byte [rip + __libc_initial], 0; push r12; push rbp;
/// push rbx; mov rbx, rdi.
const SBRK_241: [u8; MATCH_LEN] = [
    0x80, 0x3d, 0, 0, 0, 0, 0x00, 0x41, 0x54, 0x55, 0x53, 0x48, 0x89, 0xfb,
];
const SBRK_241_ANY: u16 = 0b00_0000_0011_1100;

/// glibc's sbrk, an ordinary function (checked: no branch in it lands inside these bytes).
static SBRK_START: [Prologue; 3] = [
    // 2.36: push r12 (kept, taken back by `pop r12` before the hook); mov r12,
    // [rip + __curbrk@GOT] (replaced); cmp byte [rip + __libc_initial], 0
    Prologue {
        bytes: [
            0x41, 0x54, 0x4c, 0x8b, 0x25, 0, 0, 0, 0, 0x80, 0x3d, 0, 0, 0,
        ],
        any: 0b11_1001_1110_0000,
        keep: 2,
        replaced: 7,
        pad: &[],
        pad_end: 0,
        undo: &[0x41, 0x5c],
    },
    // 2.41: the cmp (kept: it only reads memory and sets the flags); push r12 (replaced:
    // a `jmp rel8` to a `jmp rel32` in the padding, NOP10 and NOP2 after a `ret`).
    Prologue {
        bytes: SBRK_241,
        any: SBRK_241_ANY,
        keep: 7,
        replaced: 2,
        pad: &NOP10_NOP2,
        pad_end: 0,
        undo: &[],
    },
    // 2.41 without that padding: the first instruction is replaced.
    Prologue {
        bytes: SBRK_241,
        any: SBRK_241_ANY,
        keep: 0,
        replaced: 7,
        pad: &[],
        pad_end: 0,
        undo: &[],
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

/// Where the jump another patcher wrote at `at` leads: `jmp rel32` (UCX 1.13's bistro),
/// `movabs r11, imm64; jmp r11` (libfabric's memhooks), `jmp [rip+0]; abs64`.
pub(super) fn foreign_target(at: usize, code: &[u8]) -> Option<usize> {
    match code {
        [0xe9, r @ ..] if r.len() >= 4 => {
            let rel = i32::from_le_bytes([r[0], r[1], r[2], r[3]]) as isize;
            Some((at as isize).wrapping_add(5).wrapping_add(rel) as usize)
        }
        [0x49, 0xbb, r @ ..] if r.len() >= 11 && r[8..11] == [0x41, 0xff, 0xe3] => {
            Some(u64::from_le_bytes(r[..8].try_into().ok()?) as usize)
        }
        [0xff, 0x25, 0, 0, 0, 0, r @ ..] if r.len() >= 8 => {
            Some(u64::from_le_bytes(r[..8].try_into().ok()?) as usize)
        }
        _ => None,
    }
}

/// The length of the first instruction of a jump `foreign_target` decodes: the only
/// instruction boundary in the bytes our jump replaces.
pub(super) fn foreign_first_len(code: &[u8]) -> Option<usize> {
    match code {
        [0xe9, ..] => Some(5),
        [0x49, 0xbb, ..] => Some(10),
        [0xff, 0x25, ..] => Some(6),
        _ => None,
    }
}

/// Whether the bytes just before `f` are `pad`.
pub(super) fn padding_ends_at(f: usize, pad: &[u8]) -> bool {
    pad.iter().enumerate().all(|(k, &b)| {
        // SAFETY: the bytes before a libc function (inside libc's text, or our test pages).
        unsafe { std::ptr::read_volatile((f - pad.len() + k) as *const u8) == b }
    })
}
