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
//! Here: the targets; `error` (why one was refused); `x86_64` and `aarch64` (the prologues each
//! recognises, and another patcher's jumps decoded), `record` (our jumps as recorded),
//! `sites` (writing them, what each holds now, chaining), `own_hooks` (our exported hooks'
//! first bytes), `watch` (the one word a hit reads instead of every site) and `pages`
//! (clearing it after a look at the mappings).

#[cfg(any(target_arch = "aarch64", test))]
pub(crate) mod aarch64;
mod error;
mod own_hooks;
mod pages;
mod record;
mod sites;
#[cfg(target_arch = "aarch64")]
mod sites_aarch64;
mod watch;

/// In a fork child, at the fork: the watch's inherited /proc/self/maps descriptor closed
/// (`pages::forget_inherited_maps_fd`).
pub fn after_fork_child() {
    pages::forget_inherited_maps_fd();
}
#[cfg(target_arch = "x86_64")]
mod x86_64;

#[cfg(target_arch = "aarch64")]
pub use aarch64::Prologue;
pub use error::PatchError;
pub use own_hooks::*;
pub use pages::*;
use record::*;
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

#[cfg(test)]
mod tests;
