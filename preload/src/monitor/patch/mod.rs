//! The `patch` monitor: glibc calls its own `__munmap`, `__madvise`, `__brk`, `__sbrk` and
//! `__mmap` from `free`, `malloc_trim`, arena shrinking (with `vm.overcommit_memory=2`, by
//! `mmap(PROT_NONE, MAP_FIXED)`) and `sbrk`, past any symbol interposition. In glibc these
//! internal entry points are the same code as the exported functions, so we overwrite the
//! instruction after the first of each (the first, where nothing else is known) with a jump
//! to our hook, once, in the constructor, and
//! never undo it (libfabric's crashes came from patching and un-patching while other
//! threads ran the code). Other threads may already run them then (a library's constructor
//! started them): `cross_modify` says how the jump is written so that none of them can
//! execute a partly written instruction or return from the kernel into one.
//!
//! Our hooks make the system call themselves and never return into libc's function, so the
//! overwritten instruction needs no relocation, provided nothing branches into the bytes we
//! overwrite. The first instruction stays where we can: a uprobe or a breakpoint there runs
//! it elsewhere and resumes on our jump, and writes back only its own first byte
//! (docs/design/monitor.md, "Where the jump goes"). We only patch a function whose first bytes are a prologue we recognise byte
//! for byte (each checked by disassembling that glibc: no branch lands inside them), after
//! an optional `endbr64` that stays at the entry for CET's indirect branch tracking.
//! Anything else is left alone; the self-test then reports that path as not covered.
//!
//! Another patcher (UCX, Open MPI, a profiler) can overwrite our jump later: `site()`
//! and the checks before each hit compare the bytes; the runtime stops caching when they changed.

//!
//! On aarch64 the jump is one `B` word to a trampoline (`aarch64`, docs/design/monitor.md,
//! "aarch64"); every other architecture fails closed (nothing is patched).
//!
//! Here: the targets and why one was refused; `x86_64` and `aarch64` (the prologues each
//! recognises), `sites` (our jumps: writing them, what each holds now, chaining),
//! `own_hooks` (our exported hooks' first bytes), `watch` (the one word a hit reads instead
//! of every site).

#[cfg(any(target_arch = "aarch64", test))]
pub(crate) mod aarch64;
mod own_hooks;
mod sites;
#[cfg(target_arch = "aarch64")]
mod sites_aarch64;
mod watch;

/// In a fork child, at the fork: the watch's inherited /proc/self/maps descriptor closed
/// (`watch::forget_inherited_maps_fd`).
pub fn after_fork_child() {
    watch::forget_inherited_maps_fd();
}
#[cfg(target_arch = "x86_64")]
mod x86_64;

#[cfg(target_arch = "aarch64")]
pub use aarch64::Prologue;
pub use own_hooks::*;
pub use sites::*;
#[cfg(target_arch = "aarch64")]
pub use sites_aarch64::{adopt_overwritten, patch_at};
pub use watch::*;
#[cfg(target_arch = "x86_64")]
pub use x86_64::*;

use std::ffi::CStr;

/// The function starts of every other architecture: none (nothing is patched there).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub struct Prologue;

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
    Alone = 7,
    /// Written, but the SYNC_CORE barrier after it failed.
    Unsynced = 8,
    /// Written, but the page could not be made read+execute again.
    Writable = 9,
}

#[cfg(not(target_arch = "aarch64"))]
const FAR_WHY: &str = "no page for a jump target could be mapped within 2 GiB of it";
#[cfg(target_arch = "aarch64")]
const FAR_WHY: &str = "no page for a trampoline could be mapped within 128 MiB of it (a B's reach)";

impl PatchError {
    pub fn why(self) -> &'static str {
        match self {
            PatchError::NotFound => "not found in libc",
            PatchError::Unexpected => {
                "its first bytes are not a function start this version of mrcache knows"
            }
            PatchError::Mprotect => {
                "mprotect of libc's code to writable, or back to read+execute (asked first, so that nothing is left writable), was refused (MemoryDenyWriteExecute, SELinux deny_execmem, PR_SET_MDWE or a seccomp filter)"
            }
            PatchError::Busy => {
                "its first instruction is shorter than the 5-byte jump and no alignment padding this version of mrcache knows precedes it (or the jump would cross an aligned 16-byte block): a running thread could be left inside a half-replaced instruction"
            }
            PatchError::NoSync => {
                "other threads were already running, and membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE) is unavailable (Linux < 4.16 or a seccomp filter) to make them all run the new code"
            }
            PatchError::Far => FAR_WHY,
            PatchError::Unsynced => {
                "membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE) failed after the jump was written (a seccomp filter?): other threads may still run libc's first instruction, past the hook"
            }
            PatchError::Writable => {
                "mprotect(PROT_READ|PROT_EXEC) after the write was refused: libc's code page stays writable and executable"
            }
            PatchError::Alone => {
                "its first instruction is not one the architecture lets us replace while other threads may execute it (Debian 12's arm64 glibc), and other threads were already running"
            }
        }
    }

    /// The jump is in place although the patch failed: the site is recorded all the same
    /// (a hook must know that calling the entry comes back to it), and caching is off.
    pub fn written(self) -> bool {
        matches!(self, PatchError::Unsynced | PatchError::Writable)
    }

    fn from_code(c: u8) -> Option<PatchError> {
        match c {
            1 => Some(PatchError::NotFound),
            2 => Some(PatchError::Unexpected),
            3 => Some(PatchError::Mprotect),
            4 => Some(PatchError::Busy),
            5 => Some(PatchError::NoSync),
            6 => Some(PatchError::Far),
            7 => Some(PatchError::Alone),
            8 => Some(PatchError::Unsynced),
            9 => Some(PatchError::Writable),
            _ => None,
        }
    }
}

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
    #[cfg(target_arch = "x86_64")]
    pub fn prologues(self) -> &'static [Prologue] {
        x86_64::prologues(self)
    }

    /// The function starts we recognise: Debian 12's and 13's arm64 glibc.
    #[cfg(target_arch = "aarch64")]
    pub fn prologues(self) -> &'static [Prologue] {
        aarch64::prologues(self)
    }

    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub fn prologues(self) -> &'static [Prologue] {
        &[]
    }

    /// Its bit in `install`'s result.
    pub const fn bit(self) -> usize {
        1 << self as usize
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
#[cfg(all(test, target_arch = "aarch64"))]
mod tests_aarch64;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests_kept;
