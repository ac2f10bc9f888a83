//! Why a libc entry point was not patched, or was patched with a fault (the jump written,
//! but not everything after it went through): the reasons `mrcache info` and the line that
//! turns caching off give, and the codes `install` records them as. Also the error of the
//! code writes themselves (`cross_modify`).

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
                "its first instruction is shorter than the 5-byte jump and no alignment padding this version of mrcache knows precedes or follows it (or the jump would cross an aligned 16-byte block): a running thread could be left inside a half-replaced instruction"
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
                "its first instruction (Debian 12's arm64 mmap, mremap and sbrk) is not one the architecture lets us replace while other threads may execute it, and other threads were already running"
            }
        }
    }

    /// The jump is in place although the patch failed: the site is recorded all the same
    /// (a hook must know that calling the entry comes back to it), and caching is off.
    pub fn written(self) -> bool {
        matches!(self, PatchError::Unsynced | PatchError::Writable)
    }

    pub(super) fn from_code(c: u8) -> Option<PatchError> {
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
