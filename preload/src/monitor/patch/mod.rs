//! The `patch` monitor: glibc calls its own `__munmap`, `__madvise`, `__brk`, `__sbrk` and
//! `__mmap` from `free`, `malloc_trim`, arena shrinking (with `vm.overcommit_memory=2`, by
//! `mmap(PROT_NONE, MAP_FIXED)`) and `sbrk`, past any symbol interposition. In glibc these
//! internal entry points are the same code as the exported functions, so we overwrite the
//! first instruction of each with a 5-byte jump to our hook, once, in the constructor, and
//! never undo it (libfabric's crashes came from patching and un-patching while other
//! threads ran the code). Other threads may already run them then (a library's constructor
//! started them): `cross_modify` says how the jump is written so that none of them can
//! execute a partly written instruction or return from the kernel into one.
//!
//! Our hooks make the system call themselves and never return into libc's function, so the
//! overwritten instruction needs no relocation, provided nothing branches into the bytes we
//! overwrite. We only patch a function whose first bytes are a prologue we recognise byte
//! for byte (each checked by disassembling that glibc: no branch lands inside them), after
//! an optional `endbr64` that stays at the entry for CET's indirect branch tracking.
//! Anything else is left alone; the self-test then reports that path as not covered.
//!
//! Another patcher (UCX, Open MPI, a profiler) can overwrite our jump later: `site()`
//! and the checks before each hit compare the bytes; the runtime stops caching when they changed.

use crate::monitor::cross_modify::{self, JMP_LEN};
use std::ffi::{CStr, c_void};
use std::sync::atomic::{
    AtomicU8, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};

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
const NOP10: [u8; 10] = [0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0];
const NOP6: [u8; 6] = [0x66, 0x0f, 0x1f, 0x44, 0, 0];
const NOP10_NOP2: [u8; 12] = [0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0, 0x66, 0x90];

pub struct Target {
    pub name: &'static CStr,
    pub prologues: &'static [Prologue],
    pub hook: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchError {
    NotFound = 1,
    Unexpected = 2,
    Mprotect = 3,
    Busy = 4,
    NoSync = 5,
    Far = 6,
}

impl PatchError {
    pub fn why(self) -> &'static str {
        match self {
            PatchError::NotFound => "not found in libc",
            PatchError::Unexpected => {
                "its first bytes are not a function start this version of mrcache knows"
            }
            PatchError::Mprotect => {
                "making libc's code writable was refused (MemoryDenyWriteExecute, SELinux deny_execmem, PR_SET_MDWE or a seccomp filter)"
            }
            PatchError::Busy => {
                "its first instruction is shorter than the 5-byte jump and no alignment padding this version of mrcache knows precedes it (or the jump would cross an aligned 16-byte block): a running thread could be left inside a half-replaced instruction"
            }
            PatchError::NoSync => {
                "other threads were already running, and membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE) is unavailable (Linux < 4.16 or a seccomp filter) to make them all run the new code"
            }
            PatchError::Far => "no page for a jump target could be mapped within 2 GiB of it",
        }
    }

    fn from_code(c: u8) -> Option<PatchError> {
        match c {
            1 => Some(PatchError::NotFound),
            2 => Some(PatchError::Unexpected),
            3 => Some(PatchError::Mprotect),
            4 => Some(PatchError::Busy),
            5 => Some(PatchError::NoSync),
            6 => Some(PatchError::Far),
            _ => None,
        }
    }
}

/// How many bytes of a function start are compared with a `Prologue`, and read of another
/// patcher's jump.
pub const MATCH_LEN: usize = 14;
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Our jump at `site` to `hook`: `jmp rel32` (not the `movabs r11; jmp r11` that
/// libfabric's memhooks takes for its own patch: it would then refuse to start), through a
/// trampoline when the hook is out of its reach.
fn jump_to(site: usize, hook: usize) -> Result<[u8; JMP_LEN], PatchError> {
    if let Some(j) = cross_modify::jmp_rel32(site, hook) {
        return Ok(j);
    }
    let t = cross_modify::trampoline(site, hook).ok_or(PatchError::Far)?;
    cross_modify::jmp_rel32(site, t).ok_or(PatchError::Far)
}

fn matches(p: &Prologue, code: &[u8]) -> bool {
    p.bytes
        .iter()
        .zip(code)
        .enumerate()
        .all(|(i, (want, got))| p.any & (1 << i) != 0 || want == got)
}

/// Where our jump starts in a function that begins with `code`, and the prologue there, if
/// it is one we know.
fn known_start<'p>(
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

/// The libc entry points the patch monitor overwrites, in `install`'s order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchTarget {
    Munmap,
    Madvise,
    Brk,
    Mmap,
    /// Not reached by libc's own unmaps (realloc's `__mremap` is reported by the realloc
    /// hook), but by other libraries that call libc's function directly: UCX's reloc mode
    /// resolves its "original" mremap and shmdt with `dlsym(RTLD_NEXT)`, past our symbols.
    Mremap,
    Shmdt,
    /// glibc's malloc trims its heap through `__sbrk`, which calls `__brk` (patched); but
    /// UCX's bistro replaces libc's sbrk with a hook that issues the brk system call itself.
    /// Patched, that hook is chained to like the others.
    Sbrk,
    /// Only for the same reason as mremap and shmdt (the other patchers take it too).
    Shmat,
}

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

impl PatchTarget {
    pub const ALL: [PatchTarget; 8] = [
        PatchTarget::Munmap,
        PatchTarget::Madvise,
        PatchTarget::Brk,
        PatchTarget::Mmap,
        PatchTarget::Mremap,
        PatchTarget::Shmdt,
        PatchTarget::Sbrk,
        PatchTarget::Shmat,
    ];

    pub const fn name(self) -> &'static CStr {
        match self {
            PatchTarget::Munmap => c"munmap",
            PatchTarget::Madvise => c"madvise",
            PatchTarget::Brk => c"brk",
            PatchTarget::Mmap => c"mmap",
            PatchTarget::Mremap => c"mremap",
            PatchTarget::Shmdt => c"shmdt",
            PatchTarget::Sbrk => c"sbrk",
            PatchTarget::Shmat => c"shmat",
        }
    }

    /// The function starts we recognise.
    pub fn prologues(self) -> &'static [Prologue] {
        match self {
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

    /// Its bit in `install`'s result.
    pub const fn bit(self) -> usize {
        1 << self as usize
    }
}

/// Jumps we wrote: (address of the jump, hook, its 5 bytes), for `intact`. Written in the constructor
/// (before threads), read anywhere. Eight libc targets; the rest is room for the unit tests'
/// stubs (the constructor patches libc in the test binary too).
const SITES: usize = 16;
static SITE_AT: [AtomicUsize; SITES] = [const { AtomicUsize::new(0) }; SITES];
static SITE_HOOK: [AtomicUsize; SITES] = [const { AtomicUsize::new(0) }; SITES];
/// Our jump's bytes at the site, little-endian in the low five bytes.
static SITE_CODE: [AtomicU64; SITES] = [const { AtomicU64::new(0) }; SITES];
static SITE_NAME: [AtomicUsize; SITES] = [const { AtomicUsize::new(0) }; SITES];
/// How many bytes of endbr64 we kept before the jump (checked too: a patcher may write its
/// own short jump over them).
static SITE_ENDBR: [AtomicUsize; SITES] = [const { AtomicUsize::new(0) }; SITES];
/// The hook another patcher (UCX's bistro, libfabric's memhooks) had put at the entry we
/// took over: our hook calls it instead of issuing the system call, so both see the call.
static SITE_CHAINED: [AtomicUsize; SITES] = [const { AtomicUsize::new(0) }; SITES];

/// Where the jump another patcher wrote at `at` leads: `jmp rel32` (UCX 1.13's bistro),
/// `movabs r11, imm64; jmp r11` (libfabric's memhooks), `jmp [rip+0]; abs64`.
fn foreign_target(at: usize, code: &[u8]) -> Option<usize> {
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
fn foreign_first_len(code: &[u8]) -> Option<usize> {
    match code {
        [0xe9, ..] => Some(5),
        [0x49, 0xbb, ..] => Some(10),
        [0xff, 0x25, ..] => Some(6),
        _ => None,
    }
}

/// What libc's entry of `name` holds, for a memory hook deciding where to forward.
pub enum Site {
    /// Our jump, which replaced the other patcher's hook at this address: call that hook.
    Chained(usize),
    /// Our own jump: calling the entry would come back to us.
    Ours,
    /// Never patched by us, or overwritten since: the entry is libc's (or another's).
    Other,
}

/// Each target's site (its index + 1; 0: not patched), set by `install`: a memory hook
/// finds its site with one load, not a search by name (this runs on every unmap).
static TARGET_SITE: [AtomicUsize; PatchTarget::ALL.len()] =
    [const { AtomicUsize::new(0) }; PatchTarget::ALL.len()];

/// The site `install` patched for `target`, with its address.
fn site_of(target: PatchTarget) -> Option<(usize, usize)> {
    let i = TARGET_SITE[target as usize].load(Relaxed).checked_sub(1)?;
    Some((i, SITE_AT[i].load(Relaxed)))
}

/// What libc's entry of `target` holds now.
pub fn site(target: PatchTarget) -> Site {
    let Some((i, at)) = site_of(target) else {
        return Site::Other;
    };
    let chained = SITE_CHAINED[i].load(Acquire);
    if chained != 0 {
        Site::Chained(chained)
    } else if site_intact(i, at) {
        Site::Ours
    } else {
        Site::Other
    }
}

/// Another patcher wrote its jump over one of ours (it installed after our constructor):
/// put ours back and chain to its hook, so both see every call from here on. Only safe
/// before anything is cached (what went through its hook alone in between is not known):
/// the runtime calls it once, before the self-test and the cache. Threads may be running
/// through the other patcher's jump meanwhile: ours replaces its first instruction only
/// (`cross_modify`). Returns false when an overwrite is not a jump we know, or could not be
/// replaced safely: the site then stays "overwritten", and `overwritten()` fails closed.
pub fn adopt_overwritten() -> bool {
    let mut all = true;
    for i in 0..SITES {
        let at = SITE_AT[i].load(Relaxed);
        if at == 0 {
            break;
        }
        let ours = SITE_CODE[i].load(Relaxed).to_le_bytes();
        let ours: [u8; JMP_LEN] = std::array::from_fn(|k| ours[k]);
        let mut have = [0u8; MATCH_LEN];
        for (k, b) in have.iter_mut().enumerate() {
            // SAFETY: patched libc code, never unmapped; volatile: another thread writes.
            *b = unsafe { std::ptr::read_volatile((at as *const u8).add(k)) };
        }
        if have[..JMP_LEN] == ours {
            continue;
        }
        // Our jump's first bytes only: a patcher that overwrote kept endbr64 is not handled.
        let hook = SITE_HOOK[i].load(Relaxed);
        match (foreign_target(at, &have), foreign_first_len(&have)) {
            (Some(t), Some(len))
                if SITE_ENDBR[i].load(Relaxed) == 0
                    && t != hook
                    && cross_modify::trampoline_hook(t) != Some(hook) =>
            {
                crate::monitor::dl::pin_object_of(t);
                SITE_CHAINED[i].store(t, Release);
                let old = std::array::from_fn(|k| have[k]);
                // SAFETY: our own patch site in libc's code; the other patcher's first
                // instruction is replaced by our jump, whose hook now calls its target.
                let began = watch_begin(at, JMP_LEN);
                all &= unsafe { cross_modify::replace_entry(at as *mut u8, old, ours, len, None) }
                    .is_ok();
                watch_end(began);
            }
            _ => all = false,
        }
    }
    all
}
/// Our own exported memory hooks: (entry, first 16 bytes as two words, name). A patcher
/// that overwrites every loaded definition of munmap (not only libc's) takes ours too.
const HOOKS: usize = 16;
static HOOK_AT: [AtomicUsize; HOOKS] = [const { AtomicUsize::new(0) }; HOOKS];
static HOOK_BYTES: [[AtomicUsize; 2]; HOOKS] =
    [const { [const { AtomicUsize::new(0) }; 2] }; HOOKS];
static HOOK_NAME: [AtomicUsize; HOOKS] = [const { AtomicUsize::new(0) }; HOOKS];

fn read16(at: usize) -> [usize; 2] {
    // SAFETY: code of our own library, never unloaded while hooks exist.
    unsafe {
        [
            std::ptr::read_volatile(at as *const usize),
            std::ptr::read_volatile((at + 8) as *const usize),
        ]
    }
}

/// Remember the first bytes of one of our exported hooks (constructor).
pub fn watch_hook(name: &'static CStr, at: usize) {
    for i in 0..HOOKS {
        if HOOK_AT[i].compare_exchange(0, at, Relaxed, Relaxed).is_ok() {
            let b = read16(at);
            HOOK_BYTES[i][0].store(b[0], Relaxed);
            HOOK_BYTES[i][1].store(b[1], Relaxed);
            HOOK_NAME[i].store(name.as_ptr() as usize, Relaxed);
            widen(HOOK_SPAN, at, at + 16);
            return;
        }
    }
}
/// One of our exported hooks that held another patcher's jump already when the constructor
/// looked: it patched the first definition it found, ours (UCX's bistro takes
/// `dlsym(RTLD_DEFAULT)` when `dlsym(RTLD_NEXT)` from libucm finds nothing, libucm being
/// last in the search order, or when libucm is preloaded before us).
pub fn hook_taken_before_start() -> Option<&'static CStr> {
    for i in 0..HOOKS {
        if HOOK_AT[i].load(Relaxed) == 0 {
            break;
        }
        let mut code = [0u8; 16];
        code[..8].copy_from_slice(&HOOK_BYTES[i][0].load(Relaxed).to_le_bytes());
        code[8..].copy_from_slice(&HOOK_BYTES[i][1].load(Relaxed).to_le_bytes());
        if foreign_target(HOOK_AT[i].load(Relaxed), &code).is_some() {
            // SAFETY: a &'static CStr stored with it.
            return Some(unsafe { CStr::from_ptr(HOOK_NAME[i].load(Relaxed) as *const _) });
        }
    }
    None
}

/// For `dlsym`: libc's entry of `name` in place of `found` when `found` is our own exported
/// hook of that name and libc's entry still leads to it (our jump, or our jump chained to
/// another patcher's hook). Calling either reaches our hook; but a patcher that writes its
/// jump over the function `dlsym` gave it (UCX's bistro) then writes over libc's entry,
/// which we take back and chain to, and not over our hook, where nothing of ours would run.
pub fn libc_entry_instead(target: PatchTarget, found: usize) -> Option<usize> {
    let named = |slot: &AtomicUsize| {
        // SAFETY: the name slots hold pointers of `&'static CStr`s stored with them.
        (unsafe { CStr::from_ptr(slot.load(Relaxed) as *const _) }) == target.name()
    };
    (0..HOOKS)
        .take_while(|&i| HOOK_AT[i].load(Relaxed) != 0)
        .find(|&i| HOOK_AT[i].load(Relaxed) == found && named(&HOOK_NAME[i]))?;
    let (i, at) = site_of(target)?;
    (SITE_CHAINED[i].load(Acquire) != 0 || site_intact(i, at))
        .then(|| at - SITE_ENDBR[i].load(Relaxed))
}

/// Why each target of `install` was not patched (a `PatchError` code, 0 = patched).
static REFUSED: [AtomicU8; SITES] = [const { AtomicU8::new(0) }; SITES];

/// Overwrite libc's `target.name` with a jump to `target.hook`.
pub fn patch(libc_handle: *mut c_void, target: &Target) -> Result<(), PatchError> {
    let f = crate::sys::symbol::address(libc_handle, target.name) as *mut u8;
    if f.is_null() {
        return Err(PatchError::NotFound);
    }
    // SAFETY: f is the start of a libc function; every function we look for is longer
    // than the bytes read (a stub plus its error path), and code pages are readable.
    unsafe { patch_at(f, target) }
}

/// Overwrite the function at `f` (named `target.name`) with a jump to `target.hook`, if it
/// starts with one of `target.prologues`.
///
/// # Safety
/// `f` points at the entry of a function at least 18 bytes long that is never executed past
/// its first instruction afterwards (the hook replaces it). Other threads may run it.
#[cfg(target_arch = "x86_64")]
pub unsafe fn patch_at(f: *mut u8, target: &Target) -> Result<(), PatchError> {
    let mut head = [0u8; ENDBR64.len() + MATCH_LEN];
    // SAFETY: the caller guarantees f has at least that many readable bytes.
    unsafe { std::ptr::copy_nonoverlapping(f, head.as_mut_ptr(), head.len()) };
    // An entry another patcher already took (its constructor ran first): take it over
    // and chain to its hook.
    let foreign = match site_offset(target.prologues, &head) {
        Some(_) => None,
        None => match foreign_target(f as usize, &head) {
            Some(t)
                if t != target.hook && cross_modify::trampoline_hook(t) != Some(target.hook) =>
            {
                Some(t)
            }
            _ => return Err(PatchError::Unexpected),
        },
    };
    if let Some(t) = foreign {
        crate::monitor::dl::pin_object_of(t);
    }
    let (skip, first, pad) = match known_start(target.prologues, &head) {
        Some((skip, p)) => (skip, p.first as usize, p.pad),
        None => (
            0,
            foreign_first_len(&head).ok_or(PatchError::Unexpected)?,
            &[][..],
        ),
    };
    // SAFETY: inside the function (checked above).
    let site = unsafe { f.add(skip) };
    let old: [u8; JMP_LEN] = std::array::from_fn(|k| head[skip + k]);
    let (code, pad_jump) = if first >= JMP_LEN {
        (jump_to(site as usize, target.hook)?, None)
    } else {
        // A `jmp rel8` over the short first instruction, to a `jmp rel32` in the padding.
        let at = (f as usize).wrapping_sub(JMP_LEN);
        if pad.len() < JMP_LEN || !padding_ends_at(f as usize, pad) {
            return Err(PatchError::Busy);
        }
        let short = cross_modify::jmp_rel8(site as usize, at).ok_or(PatchError::Busy)?;
        let mut code = old;
        code[..2].copy_from_slice(&short);
        (code, Some((at, jump_to(at, target.hook)?)))
    };
    // Watched from before the write (a `try_clean` racing it must fail).
    let lo = (f as usize).saturating_sub(JMP_LEN);
    widen(LIBC_SPAN, lo, site as usize + JMP_LEN);
    let began = watch_begin(lo, site as usize + JMP_LEN - lo);
    // SAFETY: the entry of a function whose first instruction is `first` bytes long (only
    // its bytes change); the jump leads to its hook, which replaces it; the padding before
    // the function is dead code.
    let written = unsafe { cross_modify::replace_entry(site, old, code, first, pad_jump) };
    watch_end(began);
    written?;
    let mut word = [0u8; 8];
    word[..JMP_LEN].copy_from_slice(&code);
    for i in 0..SITES {
        if SITE_AT[i]
            .compare_exchange(0, site as usize, Relaxed, Relaxed)
            .is_ok()
        {
            SITE_HOOK[i].store(target.hook, Relaxed);
            SITE_CODE[i].store(u64::from_le_bytes(word), Relaxed);
            SITE_NAME[i].store(target.name.as_ptr() as usize, Relaxed);
            SITE_ENDBR[i].store(skip, Relaxed);
            SITE_CHAINED[i].store(foreign.unwrap_or(0), Release);
            break;
        }
    }
    Ok(())
}

/// Whether the bytes just before `f` are `pad`.
fn padding_ends_at(f: usize, pad: &[u8]) -> bool {
    pad.iter().enumerate().all(|(k, &b)| {
        // SAFETY: the bytes before a libc function (inside libc's text, or our test pages).
        unsafe { std::ptr::read_volatile((f - pad.len() + k) as *const u8) == b }
    })
}

#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn patch_at(_f: *mut u8, _target: &Target) -> Result<(), PatchError> {
    Err(PatchError::Unexpected)
}

/// Patch each of `targets` (`PatchTarget::ALL`'s, in its order); returns the bitmask of
/// those patched. Constructor.
pub fn install(libc_handle: *mut c_void, targets: &[Target]) -> usize {
    let mut done = 0;
    for (i, t) in targets.iter().enumerate().take(TARGET_SITE.len()) {
        match patch(libc_handle, t) {
            Ok(()) => {
                done |= 1 << i;
                // The site patch_at just filled is the last one in use.
                let used = (0..SITES)
                    .take_while(|&s| SITE_AT[s].load(Relaxed) != 0)
                    .count();
                TARGET_SITE[i].store(used, Relaxed);
            }
            Err(e) => REFUSED[i].store(e as u8, Relaxed),
        }
    }
    done
}

/// Why target `i` of `install` was not patched (None: patched, or never tried).
pub fn refused(i: usize) -> Option<PatchError> {
    PatchError::from_code(REFUSED.get(i)?.load(Relaxed))
}

/// Eight bytes of code at `at` (any alignment), read as another thread may be writing
/// them: one plain load the compiler can neither merge nor drop (this runs on every
/// registration, hits included; byte-wise volatile reads cost ten times as much).
#[cfg(target_arch = "x86_64")]
fn load8(at: usize) -> u64 {
    let word: u64;
    // SAFETY: `at..at + 8` is code we patched in libc (or the endbr64 kept before it and
    // our jump after it), which a patcher may change but never unmaps; a load, nothing else.
    unsafe {
        std::arch::asm!(
            "mov {word}, qword ptr [{at}]",
            word = out(reg) word,
            at = in(reg) at,
            options(nostack, preserves_flags, readonly),
        )
    };
    word
}

#[cfg(not(target_arch = "x86_64"))]
fn load8(at: usize) -> u64 {
    // Nothing is patched here (`patch_at` refuses); read byte by byte all the same.
    let mut b = [0u8; 8];
    for (k, x) in b.iter_mut().enumerate() {
        // SAFETY: as above.
        *x = unsafe { std::ptr::read_volatile((at as *const u8).add(k)) };
    }
    u64::from_le_bytes(b)
}

/// Whether site `i` (patched at `at`) still holds our jump, and the endbr64 kept before
/// it. Two loads: the jump (with the three bytes after it, masked off) and the endbr64.
fn site_intact(i: usize, at: usize) -> bool {
    const MASK: u64 = (1 << (8 * JMP_LEN)) - 1;
    let endbr_kept = SITE_ENDBR[i].load(Relaxed) == ENDBR64.len();
    load8(at) & MASK == SITE_CODE[i].load(Relaxed)
        && (!endbr_kept || load8(at - 4) as u32 == u32::from_le_bytes(ENDBR64))
}

/// The first of our jumps that is no longer in place (another patcher wrote over it), by
/// function name. A few byte compares per patched function: cheap enough for every
/// registration. No allocation, no lock.
pub fn overwritten() -> Option<&'static CStr> {
    for i in 0..SITES {
        let at = SITE_AT[i].load(Relaxed);
        if at == 0 {
            break;
        }
        if !site_intact(i, at) {
            // SAFETY: SITE_NAME holds the pointer of a `&'static CStr` stored with it.
            return Some(unsafe { CStr::from_ptr(SITE_NAME[i].load(Relaxed) as *const _) });
        }
    }
    for i in 0..HOOKS {
        let at = HOOK_AT[i].load(Relaxed);
        if at == 0 {
            break;
        }
        if read16(at)
            != [
                HOOK_BYTES[i][0].load(Relaxed),
                HOOK_BYTES[i][1].load(Relaxed),
            ]
        {
            // SAFETY: a &'static CStr stored with it.
            return Some(unsafe { CStr::from_ptr(HOOK_NAME[i].load(Relaxed) as *const _) });
        }
    }
    None
}

/// The watch on the code we patched (see docs/design.md, "A cheaper patch check"): instead
/// of reading every site on every hit, a hit reads this one word. Bit 0 (`SUSPECT`): some
/// watched page may be writable or replaced, or was since the last full check: check every
/// site (`overwritten`). The next bits count the calls in flight that change a watched page
/// (between their hook's start and end), the rest counts such calls. Set by the hooks of
/// everything that makes a page writable or replaces it (`watch_begin`/`watch_end`:
/// mprotect, pkey_mprotect, and each unmap hook's range), cleared only by `try_clean` when
/// nothing is in flight, every site is intact and every watched page is mapped, not
/// writable and still the page we patched (`pages_ok`): whatever writes one of our jumps
/// afterwards needs a call those hooks see first, or one the drain's re-check of the pages
/// (`drain_tick`) sees within a cycle.
static WATCH: AtomicU64 = AtomicU64::new(SUSPECT);
const SUSPECT: u64 = 1;
const IN_FLIGHT: u64 = 2;
const IN_FLIGHT_MASK: u64 = ((1 << 20) - 1) << 1;
const EVENT: u64 = 1 << 21;

/// The pages the watch covers: libc's patched entries (and the endbr64 and padding around
/// them) and mrcache's watched hooks, as two spans of whole pages `[lo, hi)` (over-watching
/// only costs a full check until the next `try_clean`). Set in the constructor.
static SPAN: [[AtomicUsize; 2]; 2] = [
    [AtomicUsize::new(usize::MAX), AtomicUsize::new(0)],
    [AtomicUsize::new(usize::MAX), AtomicUsize::new(0)],
];
const LIBC_SPAN: usize = 0;
const HOOK_SPAN: usize = 1;

fn widen(span: usize, lo: usize, hi: usize) {
    SPAN[span][0].fetch_min(lo & !4095, Relaxed);
    SPAN[span][1].fetch_max(hi.saturating_add(4095) & !4095, Relaxed);
}

/// Whether `[start, start + len)` touches a watched page.
#[inline]
pub fn watched(start: usize, len: usize) -> bool {
    let end = start.saturating_add(len.max(1));
    SPAN.iter()
        .any(|s| start < s[1].load(Relaxed) && s[0].load(Relaxed) < end)
}

/// A hook is about to change the protection of `[start, start + len)`: if that touches a
/// watched page, every hit from now on checks every site, and no `try_clean` can succeed
/// until `watch_end`. Returns whether it did (for `watch_end`). Lock-free,
/// allocation-free: any hook may call it.
#[inline]
pub fn watch_begin(start: usize, len: usize) -> bool {
    if !watched(start, len) {
        return false;
    }
    let _ = WATCH.fetch_update(SeqCst, SeqCst, |w| {
        Some((w | SUSPECT).wrapping_add(IN_FLIGHT + EVENT))
    });
    true
}

/// The call `watch_begin` announced is done (its system call returned): still suspect.
#[inline]
pub fn watch_end(began: bool) {
    if began {
        let _ = WATCH.fetch_update(SeqCst, SeqCst, |w| {
            Some((w | SUSPECT).wrapping_sub(IN_FLIGHT).wrapping_add(EVENT))
        });
    }
}

/// Whether a hit may skip the site check: no watched page changed protection or mapping
/// since the last `try_clean`, which found every site intact and every page read-only.
#[inline]
pub fn watch_clean() -> bool {
    WATCH.load(SeqCst) & SUSPECT == 0
}

/// `MRCACHE_PATCH_CHECK=every-hit`: never clear (every hit reads every site).
pub static EVERY_HIT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether libc's own `mprotect` entry was patched (`MPROTECT`): without it a call through
/// libc's entry (glibc's internal `__mprotect`, `dlsym` on libc's handle) would make a
/// watched page writable unseen, so the word is never cleared.
pub static MPROTECT_PATCHED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// glibc's mprotect (2.36 and 2.41): `mov eax, 10; syscall; cmp rax, -4095; jae`.
pub static MPROTECT: [Prologue; 1] = [syscall_stub(0x0a)];

/// Clear `SUSPECT` when it is safe: nothing in flight, libc's mprotect entry patched, every
/// site intact, every watched page mapped, not writable, not shared and still backed by
/// the mapping it had at the first clean, and each page holding a site still the private
/// copy our write made (`pages_ok`), and no watched call began or ended since the word was
/// read (the compare-and-swap fails otherwise). Reads `/proc/self/maps` (or queries it):
/// the runtime's set-up and the background drain thread only, never a hook or the hit.
/// errno is the caller's afterwards: the set-up runs inside the app's first verbs call, and
/// a kernel without PROCMAP_QUERY answers the probe with ENOTTY.
pub fn try_clean() -> bool {
    let errno = crate::sys::errno();
    let clean = try_clean_now();
    crate::sys::set_errno(errno);
    clean
}

fn try_clean_now() -> bool {
    let w = WATCH.load(SeqCst);
    if w & SUSPECT == 0 {
        return true;
    }
    if w & IN_FLIGHT_MASK != 0
        || EVERY_HIT.load(Relaxed)
        || !MPROTECT_PATCHED.load(Relaxed)
        || SITE_AT[0].load(Relaxed) == 0
    {
        return false;
    }
    if !pages_ok(true) || overwritten().is_some() {
        return false;
    }
    WATCH
        .compare_exchange(w, (w & !SUSPECT).wrapping_add(EVENT), SeqCst, SeqCst)
        .is_ok()
}

/// The drain thread's part, once a cycle (20 ms), after its check of every site: while the
/// word is clean, check the watched pages again (protection and identity, `pages_ok`), so a
/// page made writable or replaced past every hook (a raw `syscall`) makes hits check every
/// site from the next cycle on: one PROCMAP_QUERY ioctl per mapping of the watched spans
/// every cycle, or, on kernels without it, a read of `/proc/self/maps` every
/// `MAPS_RECHECK` cycles. While suspect, `try_clean`, backing off (1, 2, 4 ... up to
/// `MAPS_RECHECK` cycles) while it keeps failing on the pages with no watched call since.
pub fn drain_tick() {
    static TICK: AtomicU64 = AtomicU64::new(0);
    static NEXT_TRY: AtomicU64 = AtomicU64::new(0);
    static BACKOFF: AtomicU64 = AtomicU64::new(1);
    static LAST_EVENTS: AtomicU64 = AtomicU64::new(u64::MAX);
    let tick = TICK.fetch_add(1, Relaxed) + 1;
    let w = WATCH.load(SeqCst);
    if w & SUSPECT == 0 {
        let query = matches!(query_fd(), Some(fd) if fd >= 0);
        if (query || tick % MAPS_RECHECK == 0) && !pages_ok(false) {
            let _ = WATCH.fetch_update(SeqCst, SeqCst, |w| Some((w | SUSPECT).wrapping_add(EVENT)));
        }
        return;
    }
    let events = w >> 21;
    if events != LAST_EVENTS.swap(events, Relaxed) {
        // A watched call since the last try: try now.
        BACKOFF.store(1, Relaxed);
        NEXT_TRY.store(0, Relaxed);
    }
    if tick < NEXT_TRY.load(Relaxed) {
        return;
    }
    if !try_clean() {
        let b = BACKOFF.load(Relaxed);
        NEXT_TRY.store(tick + b, Relaxed);
        BACKOFF.store((b * 2).min(MAPS_RECHECK), Relaxed);
    }
}

/// Drain cycles between two reads of `/proc/self/maps` while clean, and the longest
/// back-off while suspect (50 cycles of 20 ms: one second).
const MAPS_RECHECK: u64 = 50;

/// One mapping over a watched span, as `/proc/self/maps` or PROCMAP_QUERY give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Vma {
    pub start: usize,
    pub end: usize,
    pub writable: bool,
    pub shared: bool,
    /// `major << 32 | minor`.
    pub dev: u64,
    pub inode: u64,
    pub offset: u64,
}

impl Vma {
    /// What a page keeps across splits and merges of its mapping: the file, and the file
    /// offset of address 0 (so two mappings of one file at the same place give the same).
    fn identity(&self) -> [u64; 3] {
        [
            self.dev,
            self.inode,
            self.offset.wrapping_sub(self.start as u64),
        ]
    }
}

/// The identity of each span's mapping at the first clean (`Vma::identity`, all zero: not
/// recorded yet).
static IDENTITY: [[AtomicU64; 3]; 2] = [
    [const { AtomicU64::new(0) }; 3],
    [const { AtomicU64::new(0) }; 3],
];

/// Whether every page of the watched spans is mapped, not writable, private, backed by a
/// file (libc's and libmrcache.so's code), and by the same file at the same place as at
/// the first clean (`record`: record it if not yet). A page replaced by a read-only view of
/// a memfd or of another file, or by an anonymous copy, fails: its identity differs.
fn pages_ok(record: bool) -> bool {
    let mut ok = true;
    for (i, s) in SPAN.iter().enumerate() {
        let (lo, hi) = (s[0].load(Relaxed), s[1].load(Relaxed));
        if lo >= hi {
            continue;
        }
        let want: [u64; 3] = std::array::from_fn(|k| IDENTITY[i][k].load(Relaxed));
        let mut first: Option<[u64; 3]> = None;
        let covered = each_vma(lo, hi, |v| {
            let id = v.identity();
            let same = match first {
                None => {
                    first = Some(id);
                    true
                }
                Some(f) => f == id,
            };
            same && !v.writable && !v.shared && v.inode != 0 && (want == [0; 3] || want == id)
        });
        ok &= covered;
        if covered
            && record
            && want == [0; 3]
            && let Some(id) = first
        {
            for (k, x) in id.iter().enumerate() {
                IDENTITY[i][k].store(*x, Relaxed);
            }
        }
    }
    ok && sites_private_copies()
}

/// Whether each page holding a site is still the private, anonymous copy of libc's page
/// our write made (`/proc/self/pagemap`: present or swapped, bit 61 "file page or shared
/// anonymous" clear): a page of the same file mapped again over it, not yet written, is a
/// file page that follows its file.
fn sites_private_copies() -> bool {
    // SAFETY: a constant NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/pagemap".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return false;
    }
    let mut ok = true;
    for site in &SITE_AT {
        let at = site.load(Relaxed);
        if at == 0 {
            break;
        }
        for page in [at / 4096, (at + 7) / 4096] {
            let mut entry = 0u64;
            // SAFETY: reads 8 bytes into `entry` from our own descriptor.
            let n = unsafe {
                libc::pread(
                    fd,
                    &mut entry as *mut u64 as *mut c_void,
                    8,
                    (page * 8) as libc::off_t,
                )
            };
            let mapped = entry & (1 << 63 | 1 << 62) != 0;
            ok &= n == 8 && mapped && entry & (1 << 61) == 0;
        }
    }
    // SAFETY: the descriptor just opened.
    unsafe { libc::close(fd) };
    ok
}

/// Calls `f` on each mapping over `[lo, hi)` in address order; true when they cover it
/// without a hole and `f` accepted every one. PROCMAP_QUERY where the kernel has it (6.11),
/// else a read of `/proc/self/maps`.
fn each_vma(lo: usize, hi: usize, mut f: impl FnMut(&Vma) -> bool) -> bool {
    if let Some(fd) = query_fd()
        && fd >= 0
    {
        let mut at = lo;
        while at < hi {
            let Some(v) = query(fd, at) else {
                return false;
            };
            if v.start > at || v.end <= at || !f(&v) {
                return false;
            }
            at = v.end;
        }
        return true;
    }
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    maps_cover(&maps, lo, hi, f)
}

/// Whether the mappings over `[lo, hi)` in `maps` (`/proc/self/maps`) cover it without a
/// hole and `f` accepts each.
pub(crate) fn maps_cover(
    maps: &str,
    lo: usize,
    hi: usize,
    mut f: impl FnMut(&Vma) -> bool,
) -> bool {
    let mut covered = lo;
    for line in maps.lines() {
        let Some(v) = parse_maps_line(line) else {
            return false;
        };
        if v.end <= lo || v.start >= hi {
            continue;
        }
        if v.start > covered || !f(&v) {
            return false;
        }
        covered = covered.max(v.end);
    }
    covered >= hi
}

fn parse_maps_line(line: &str) -> Option<Vma> {
    let mut fields = line.split_ascii_whitespace();
    let (range, perms, offset, dev, inode) = (
        fields.next()?,
        fields.next()?.as_bytes(),
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let (a, b) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    Some(Vma {
        start: usize::from_str_radix(a, 16).ok()?,
        end: usize::from_str_radix(b, 16).ok()?,
        writable: perms.get(1) != Some(&b'-'),
        shared: perms.get(3) != Some(&b'p'),
        dev: u64::from_str_radix(major, 16).ok()? << 32 | u64::from_str_radix(minor, 16).ok()?,
        inode: inode.parse().ok()?,
        offset: u64::from_str_radix(offset, 16).ok()?,
    })
}

/// `struct procmap_query` (linux/fs.h, Linux 6.11).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: u64 =
    3 << 30 | (size_of::<ProcmapQuery>() as u64) << 16 | (b'f' as u64) << 8 | 17;
const PROCMAP_QUERY_VMA_WRITABLE: u64 = 0x02;
const PROCMAP_QUERY_VMA_SHARED: u64 = 0x08;
const PROCMAP_QUERY_COVERING_OR_NEXT_VMA: u64 = 0x10;

/// This process's `/proc/self/maps`, opened once for PROCMAP_QUERY (again in a fork child:
/// the file stands for the process that opened it). Some(-1): the kernel has no
/// PROCMAP_QUERY (read the file instead); None: it could not be opened.
fn query_fd() -> Option<i32> {
    static FD: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(-2);
    static PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let fd = FD.load(Relaxed);
    if fd != -2 && PID.load(Relaxed) == pid {
        return Some(fd as i32);
    }
    if fd >= 0 {
        // The parent's, inherited: close our copy.
        // SAFETY: our own descriptor, used by the drain thread only.
        unsafe { libc::close(fd as i32) };
    }
    // SAFETY: a constant NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let probe = query(fd, 0);
    let e = crate::sys::errno();
    let fd = if probe.is_none() && (e == libc::ENOTTY || e == libc::EINVAL) {
        // SAFETY: the descriptor just opened.
        unsafe { libc::close(fd) };
        -1
    } else {
        fd
    };
    PID.store(pid, Relaxed);
    FD.store(fd as i64, Relaxed);
    Some(fd)
}

/// The mapping covering `at`, or the next one after it (PROCMAP_QUERY on `fd`).
fn query(fd: i32, at: usize) -> Option<Vma> {
    let mut q = ProcmapQuery {
        size: size_of::<ProcmapQuery>() as u64,
        query_flags: PROCMAP_QUERY_COVERING_OR_NEXT_VMA,
        query_addr: at as u64,
        ..Default::default()
    };
    crate::sys::set_errno(0);
    // SAFETY: PROCMAP_QUERY reads and writes one `struct procmap_query` of the size given,
    // with no name or build-id buffer (both sizes 0).
    if unsafe { libc::ioctl(fd, PROCMAP_QUERY as _, &mut q as *mut ProcmapQuery) } != 0 {
        return None;
    }
    Some(Vma {
        start: q.vma_start as usize,
        end: q.vma_end as usize,
        writable: q.vma_flags & PROCMAP_QUERY_VMA_WRITABLE != 0,
        shared: q.vma_flags & PROCMAP_QUERY_VMA_SHARED != 0,
        dev: (q.dev_major as u64) << 32 | q.dev_minor as u64,
        inode: q.inode,
        offset: q.vma_offset,
    })
}

/// Whether `[lo, hi)` is covered, in `maps`, by mappings none of which is writable.
#[cfg(test)]
fn range_read_only(maps: &str, lo: usize, hi: usize) -> bool {
    maps_cover(maps, lo, hi, |v| !v.writable)
}

#[cfg(test)]
#[test]
fn read_only_needs_every_page_mapped_and_none_writable() {
    let maps = "1000-3000 r-xp 00000000 08:01 1 /lib/libc.so.6\n\
                3000-4000 r--p 00000000 08:01 1 /lib/libc.so.6\n\
                5000-6000 rwxp 00000000 00:00 0\n";
    assert!(range_read_only(maps, 0x1000, 0x4000));
    assert!(range_read_only(maps, 0x2000, 0x3000));
    // A hole (4000-5000 unmapped) or a writable page is not read-only.
    assert!(!range_read_only(maps, 0x3000, 0x5000));
    assert!(!range_read_only(maps, 0x5000, 0x6000));
    assert!(!range_read_only(maps, 0x1000, 0x6000));
    assert!(!range_read_only("", 0x1000, 0x2000));
}

#[cfg(test)]
#[test]
fn maps_lines_give_the_mapping_identity() {
    let maps = "1000-3000 r-xp 00001000 08:01 77 /lib/libc.so.6\n\
                3000-4000 r-xp 00003000 08:01 77 /lib/libc.so.6\n\
                4000-5000 r-xs 00000000 00:01 9 /memfd:libc-page (deleted)\n\
                5000-6000 r-xp 00000000 00:00 0\n";
    let mut seen = Vec::new();
    assert!(maps_cover(maps, 0x1000, 0x6000, |v| {
        seen.push(*v);
        true
    }));
    // Split mappings of one file at the same place have one identity; a memfd view or an
    // anonymous copy at the same address has another, and a shared one says so.
    assert_eq!(seen[0].identity(), seen[1].identity());
    assert_eq!(seen[0].identity(), [8 << 32 | 1, 77, 0]);
    assert!(seen[2].shared && !seen[0].shared && !seen[2].writable);
    assert_ne!(seen[2].identity(), seen[0].identity());
    assert_eq!(seen[3].inode, 0);
    assert!(!maps_cover("zz-1 r-xp", 0x1000, 0x2000, |_| true));
}

/// For tests and diagnostics: whether hits skip the site check now.
#[unsafe(no_mangle)]
pub extern "C" fn mrcache_patch_watch_clean() -> std::ffi::c_int {
    watch_clean() as std::ffi::c_int
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
