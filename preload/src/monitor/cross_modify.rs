//! Rewriting the first instruction of a function that other threads may be running
//! (cross-modifying code, Intel SDM vol. 3, 9.1.3; AMD APM vol. 2, 7.6.1).
//!
//! A thread can be anywhere in libc's `munmap` when we patch it: about to fetch its first
//! instruction, preempted between two instructions (it resumes at that boundary), or inside
//! the system call (it returns to the instruction after `syscall`). So a patch may change
//! only bytes of instructions that start where the patch starts: we replace exactly the
//! instruction at the site (the entry's first, or the one after the instructions the caller
//! keeps: `patch::Prologue::keep`; 5 bytes or longer) with a 5-byte `jmp rel32`, and leave
//! every later byte, hence every later instruction boundary
//! and the return address of a thread in the kernel, as it was. The 5 bytes are written by
//! one locked compare-and-swap of the aligned 8- or 16-byte block that holds them (unchanged
//! bytes written back with their own values), so no core ever holds part of the old and
//! part of the new instruction in its cache: a fetch reads the line before or after the
//! store. A core may still run the old instruction from its pipeline or prefetch, which is
//! whole and valid (the function as libc wrote it); `membarrier(PRIVATE_EXPEDITED_SYNC_CORE)`
//! then makes every thread of the process execute a serialising instruction before it
//! returns to user space, so once it returns no thread can run the old instruction again,
//! and the caller may rely on every later call reaching the hook.
//!
//! An instruction shorter than the jump (2 to 4 bytes: a stub's `syscall`, `push r12`) is
//! replaced by a 2-byte `jmp rel8`, the same way, to a `jmp rel32` written first into the
//! alignment padding just before the function (dead bytes the caller recognised). Where none
//! of this applies (a block the write would straddle, no SYNC_CORE membarrier with other
//! threads), nothing is written and the caller fails closed. The thread count never relaxes
//! these rules: `/proc/self/stat` does not count tasks cloned with `CLONE_VM` alone.
//!
//! The barrier and the `mprotect` that makes the page read+execute again are both tried
//! before the first write (`sync_core_ready`, `make_writable`), so a policy that refuses
//! either refuses the site untouched; one that fails after the write is an error that keeps
//! the jump (`finish`), and the runtime turns caching off. docs/design/monitor.md ("Patching
//! code other threads are running") compares this with HotSpot and Linux's
//! `text_poke_bp`, and says what remains on CPUs with cross-modifying-code errata.
//!
//! A hook more than 2 GiB from the site is reached through a trampoline (`trampoline`).

use crate::monitor::patch::PatchError;
use crate::sys::{page_down, page_size, syscall6};
use std::fmt::Write as _;
use std::sync::atomic::{
    AtomicBool, AtomicUsize,
    Ordering::{Relaxed, Release},
};
#[cfg(target_arch = "x86_64")]
use std::sync::atomic::{AtomicU64, Ordering::Acquire};

#[cfg(target_arch = "x86_64")]
/// The length of our jump: `jmp rel32`.
pub const JMP_LEN: usize = 5;

#[cfg(target_arch = "x86_64")]
/// `jmp rel32` at `site` to `to`, when `to` is within reach.
pub fn jmp_rel32(site: usize, to: usize) -> Option<[u8; JMP_LEN]> {
    let rel = (to as i64).wrapping_sub(site as i64 + JMP_LEN as i64);
    let rel = i32::try_from(rel).ok()?;
    let r = rel.to_le_bytes();
    Some([0xe9, r[0], r[1], r[2], r[3]])
}

/// Whether this process has no thread but the caller's (`/proc/self/stat`, field 20). Read
/// with raw system calls into a stack buffer: this runs in the constructor, and from `dlsym`
/// in another library's constructor. Unreadable: assume other threads.
pub fn single_threaded() -> bool {
    let mut buf = [0u8; 1024];
    let path = c"/proc/self/stat";
    let fd = syscall6(
        libc::SYS_openat,
        libc::AT_FDCWD as usize,
        path.as_ptr() as usize,
        (libc::O_RDONLY | libc::O_CLOEXEC) as usize,
        0,
        0,
        0,
    );
    if fd < 0 {
        return false;
    }
    let n = syscall6(
        libc::SYS_read,
        fd as usize,
        buf.as_mut_ptr() as usize,
        buf.len(),
        0,
        0,
        0,
    );
    syscall6(libc::SYS_close, fd as usize, 0, 0, 0, 0, 0);
    let Ok(n) = usize::try_from(n) else {
        return false;
    };
    threads_in_stat(&buf[..n]) == Some(1)
}

/// The thread count in a `/proc/PID/stat` line: field 20, the 18th after the command name
/// (which is in parentheses and may itself hold spaces and parentheses).
pub fn threads_in_stat(stat: &[u8]) -> Option<u64> {
    let after = stat.iter().rposition(|&b| b == b')')? + 1;
    let field = stat[after..]
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty())
        .nth(17)?;
    std::str::from_utf8(field).ok()?.trim().parse().ok()
}

const MEMBARRIER_CMD_QUERY: usize = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: usize = 1 << 5;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: usize = 1 << 6;

fn membarrier(cmd: usize) -> isize {
    syscall6(libc::SYS_membarrier, cmd, 0, 0, 0, 0, 0)
}

/// Registered for SYNC_CORE membarriers (Linux 4.16+), once per process, and one such
/// barrier issued: a seccomp filter can refuse that command alone while QUERY and REGISTER
/// succeed, and a barrier that fails after the write is one we cannot do without.
fn sync_core_ready() -> bool {
    static READY: AtomicBool = AtomicBool::new(false);
    if READY.load(Relaxed) {
        return true;
    }
    let q = membarrier(MEMBARRIER_CMD_QUERY);
    let ok = q >= 0
        && q as usize & MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE != 0
        && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE) == 0
        && sync_core();
    READY.store(ok, Relaxed);
    ok
}

/// Every thread of the process serialises before it next runs user code.
fn sync_core() -> bool {
    #[cfg(test)]
    if test_refuse::SYNC_CORE.get() {
        return false;
    }
    membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE) == 0
}

fn mprotect(start: usize, len: usize, prot: libc::c_int) -> bool {
    syscall6(libc::SYS_mprotect, start, len, prot as usize, 0, 0, 0) == 0
}

const RWX: libc::c_int = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
const RX: libc::c_int = libc::PROT_READ | libc::PROT_EXEC;

/// Make the code pages `[start, start + len)` writable (and still executable: other threads
/// may be running them). The call that will make them read+execute again is issued first,
/// on the pages as they are (for the kernel nothing changes): a policy that refuses it (a
/// seccomp filter on `PROT_READ|PROT_EXEC`) is found before a byte is writable, and nothing
/// is patched.
pub fn make_writable(start: usize, len: usize) -> Result<(), PatchError> {
    if !mprotect(start, len, RX) || !mprotect(start, len, RWX) {
        return Err(PatchError::Mprotect);
    }
    Ok(())
}

/// The first code page left writable and executable (0: none), for the runtime's line.
static LEFT_WRITABLE: AtomicUsize = AtomicUsize::new(0);

/// Make `[start, start + len)` read+execute again after a patch. Refused although the same
/// call passed in `make_writable` (the policy changed in between, or the kernel ran out of
/// memory for the mapping): no protection is left that keeps the code running for the
/// threads in it and takes the write bit away (read-only or none would kill them; execute-
/// only is the same call's sibling, and with protection keys makes the code unreadable to
/// our own checks), so the pages stay writable and executable, and this says so at once in
/// one line on stderr (the process may never call verbs) and `left_writable` turns caching
/// off at the first verbs call.
pub fn restore_executable(start: usize, len: usize) -> Result<(), PatchError> {
    let refused = {
        #[cfg(test)]
        let refused = test_refuse::RESTORE.get();
        #[cfg(not(test))]
        let refused = false;
        refused
    };
    if !refused && (mprotect(start, len, RX) || mprotect(start, len, RX)) {
        return Ok(());
    }
    let errno = if refused {
        libc::EPERM
    } else {
        crate::sys::errno()
    };
    let _ = LEFT_WRITABLE.compare_exchange(0, start, Relaxed, Relaxed);
    let mut line = StackLine::default();
    let _ = writeln!(
        line,
        "mrcache[{}]: code at {start:#x}-{:#x} stays writable and executable: mprotect(PROT_READ|PROT_EXEC) after patching it was refused (errno {errno}); caching is off",
        syscall6(libc::SYS_getpid, 0, 0, 0, 0, 0, 0),
        start + len,
    );
    line.write_to(2);
    Err(PatchError::Writable)
}

/// Where a patch left code writable and executable, if it did.
pub fn left_writable() -> Option<usize> {
    Some(LEFT_WRITABLE.load(Relaxed)).filter(|&p| p != 0)
}

/// One line formatted on the stack (this runs in the constructor, where nothing may
/// allocate), cut at its capacity.
struct StackLine {
    buf: [u8; 320],
    len: usize,
}

impl Default for StackLine {
    fn default() -> Self {
        StackLine {
            buf: [0; 320],
            len: 0,
        }
    }
}

impl std::fmt::Write for StackLine {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

impl StackLine {
    /// One `write(2)` to `fd`, by raw system call.
    fn write_to(&self, fd: usize) {
        syscall6(
            libc::SYS_write,
            fd,
            self.buf.as_ptr() as usize,
            self.len,
            0,
            0,
            0,
        );
    }
}

/// The failures the unit tests switch on, for the calling thread only: a policy that
/// refuses the SYNC_CORE barrier or the restoring `mprotect` only after the checks before
/// the write passed.
#[cfg(test)]
pub mod test_refuse {
    use std::cell::Cell;
    thread_local! {
        pub static SYNC_CORE: Cell<bool> = const { Cell::new(false) };
        pub static RESTORE: Cell<bool> = const { Cell::new(false) };
    }
}

#[cfg(target_arch = "x86_64")]
/// Replace the `JMP_LEN` bytes at `site`, which must still read `old`, with `new`.
/// `first_len` is the length of the instruction starting at `site`: the only instruction
/// boundary a thread may be at among the bytes that change, so every byte from `first_len`
/// on must stay as it is. `pad`: 5 bytes of alignment padding before the function, which no
/// thread executes, written first (where a short first instruction becomes a 2-byte
/// `jmp rel8` to a `jmp rel32` there).
///
/// # Safety
/// `site` is in a mapped code page (libc's, or one of ours), `new` is code that any thread
/// may run from `site` on in place of the instruction there, and `pad` (if any) is dead
/// code in a mapped page.
pub unsafe fn replace_entry(
    site: *mut u8,
    old: [u8; JMP_LEN],
    new: [u8; JMP_LEN],
    first_len: usize,
    pad: Option<(usize, [u8; JMP_LEN])>,
) -> Result<(), PatchError> {
    let at = site as usize;
    if (first_len..JMP_LEN).any(|k| old[k] != new[k]) {
        return Err(PatchError::Busy);
    }
    let block = if at % 8 <= 8 - JMP_LEN {
        Block::Eight(at & !7)
    } else if at % 16 <= 16 - JMP_LEN {
        Block::Sixteen(at & !15)
    } else {
        return Err(PatchError::Busy);
    };
    // The thread count does not see tasks cloned with CLONE_VM but not CLONE_THREAD, so it
    // never relaxes the rules above; it only excuses a kernel without SYNC_CORE membarrier.
    let sync = sync_core_ready();
    if !sync && !single_threaded() {
        return Err(PatchError::NoSync);
    }
    let low = pad.map_or(at, |(p, _)| p.min(at));
    let (start, end) = (page_down(low), page_down(at + 15) + page_size());
    make_writable(start, end - start)?;
    if let Some((p, code)) = pad {
        // SAFETY: alignment padding between two functions, never executed, writable now; the
        // jump that will lead here is written after it (the CAS below orders the stores).
        unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), p as *mut u8, JMP_LEN) };
    }
    // SAFETY: the pages are writable now; the caller's contract for what is written.
    let r = unsafe {
        match block {
            Block::Eight(b) => swap8(b, at - b, old, new),
            Block::Sixteen(b) => swap16(b, at - b, old, new),
        }
    };
    finish(r, start, end - start, sync)
}

/// After the write (`written`: its result): the pages read+execute again, then the barrier.
/// A failure of either, once the bytes are written, is an error the caller still records
/// the site for (`PatchError::written`): the jump stays (taking it back would be a second
/// write with the same hazard), and the runtime turns caching off.
fn finish(
    written: Result<(), PatchError>,
    start: usize,
    len: usize,
    sync: bool,
) -> Result<(), PatchError> {
    let restored = restore_executable(start, len);
    // The barrier whatever happened: threads that fetched the new bytes serialise.
    let synced = !sync || sync_core();
    written?;
    restored?;
    if !synced {
        return Err(PatchError::Unsynced);
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
#[derive(PartialEq, Eq, Clone, Copy)]
enum Block {
    Eight(usize),
    Sixteen(usize),
}

#[cfg(target_arch = "x86_64")]
fn splice(word: &mut [u8], off: usize, old: [u8; JMP_LEN], new: [u8; JMP_LEN]) -> bool {
    if word[off..off + JMP_LEN] != old {
        return false;
    }
    word[off..off + JMP_LEN].copy_from_slice(&new);
    true
}

#[cfg(target_arch = "x86_64")]
/// One locked compare-and-swap of the aligned 8 bytes at `block`.
///
/// # Safety
/// `block` is 8-aligned, mapped and writable.
unsafe fn swap8(
    block: usize,
    off: usize,
    old: [u8; JMP_LEN],
    new: [u8; JMP_LEN],
) -> Result<(), PatchError> {
    // SAFETY: aligned, mapped, writable (the caller); other cores may only read it as code,
    // or write it with their own atomic (another patcher): a CAS either way.
    let word = unsafe { &*(block as *const AtomicU64) };
    let now = word.load(Acquire);
    let mut bytes = now.to_le_bytes();
    if !splice(&mut bytes, off, old, new) {
        return Err(PatchError::Unexpected);
    }
    word.compare_exchange(now, u64::from_le_bytes(bytes), Release, Relaxed)
        .map(drop)
        .map_err(|_| PatchError::Unexpected)
}

/// One `lock cmpxchg16b` of the aligned 16 bytes at `block`.
///
/// # Safety
/// `block` is 16-aligned, mapped and writable.
#[cfg(target_arch = "x86_64")]
unsafe fn swap16(
    block: usize,
    off: usize,
    old: [u8; JMP_LEN],
    new: [u8; JMP_LEN],
) -> Result<(), PatchError> {
    if !std::arch::is_x86_feature_detected!("cmpxchg16b") {
        return Err(PatchError::Busy);
    }
    // SAFETY: mapped and readable (the caller); a torn read only fails the CAS below.
    let (lo, hi) = unsafe {
        (
            std::ptr::read_volatile(block as *const u64),
            std::ptr::read_volatile((block + 8) as *const u64),
        )
    };
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&lo.to_le_bytes());
    bytes[8..].copy_from_slice(&hi.to_le_bytes());
    if !splice(&mut bytes, off, old, new) {
        return Err(PatchError::Unexpected);
    }
    let new_lo = u64::from_le_bytes(bytes[..8].try_into().unwrap_or_default());
    let new_hi = u64::from_le_bytes(bytes[8..].try_into().unwrap_or_default());
    let (seen_lo, seen_hi): (u64, u64);
    // SAFETY: `block` is 16-aligned, mapped and writable; rbx (reserved by the compiler)
    // is swapped in and out around the instruction.
    unsafe {
        std::arch::asm!(
            "xchg {lo}, rbx",
            "lock cmpxchg16b xmmword ptr [{p}]",
            "mov rbx, {lo}",
            p = in(reg) block,
            lo = inout(reg) new_lo => _,
            in("rcx") new_hi,
            inout("rax") lo => seen_lo,
            inout("rdx") hi => seen_hi,
            options(nostack),
        )
    };
    if (seen_lo, seen_hi) == (lo, hi) {
        Ok(())
    } else {
        Err(PatchError::Unexpected)
    }
}

/// aarch64: replace the instruction word at `site`, which must still read `old`, with `new`
/// (our `B`): one single-copy-atomic 32-bit compare-and-swap, then the cache maintenance
/// that makes it visible to instruction fetch (`sync_icache`), then a SYNC_CORE membarrier
/// so that every other thread resynchronises its fetch before we go on. Another thread may
/// execute the word meanwhile only if the architecture allows both `old` and `new` to be
/// modified under execution (`concurrent_safe`); otherwise only a process with no other
/// thread is patched (`PatchError::Alone`). The page loses BTI guarding (its mprotect has no
/// PROT_BTI): an indirect call to the entry then lands on our `B` instead of `bti c`.
///
/// # Safety
/// `site` is a 4-aligned instruction in a mapped code page (libc's, or one of ours), and
/// `new` is code that any thread may run from `site` on in place of `old`.
#[cfg(target_arch = "aarch64")]
pub unsafe fn replace_word(site: *mut u32, old: u32, new: u32) -> Result<(), PatchError> {
    use crate::monitor::patch::aarch64::{concurrent_safe, sync_icache};
    let at = site as usize;
    if at % 4 != 0 {
        return Err(PatchError::Unexpected);
    }
    let sync = sync_core_ready();
    let unsafe_under_execution = !(concurrent_safe(old) && concurrent_safe(new));
    if unsafe_under_execution || !sync {
        // Asked only when needed: the thread count never relaxes the architecture's rule
        // for another thread that is counted, and a CLONE_VM task it misses is the one
        // residual hazard of patching an ordinary first instruction
        // (docs/design/monitor.md, "aarch64").
        if !single_threaded() {
            return Err(if unsafe_under_execution {
                PatchError::Alone
            } else {
                PatchError::NoSync
            });
        }
    }
    let start = page_down(at);
    make_writable(start, page_size())?;
    // SAFETY: 4-aligned, mapped, writable now; other cores only fetch it as code (or
    // another patcher writes it with its own atomic store): a CAS either way.
    let word = unsafe { &*(site as *const std::sync::atomic::AtomicU32) };
    let r = match test_break::mode() {
        test_break::TEAR => test_break::torn_store(site, new),
        _ => word.compare_exchange(old, new, Release, Relaxed).map(drop),
    }
    .map_err(|_| PatchError::Unexpected);
    if test_break::mode() != test_break::NO_FLUSH {
        sync_icache(at, 4);
    }
    finish(r, start, page_size(), sync)
}

/// The deliberately broken variants of `replace_word` and `patch_at` that the aarch64 unit
/// tests switch on to see each hazard's test fail (`MRCACHE_TEST_A64_BREAK`, read by the
/// tests only). Always off outside the unit tests.
#[cfg(target_arch = "aarch64")]
pub mod test_break {
    pub const OFF: u8 = 0;
    /// The `B` written as two 16-bit halves.
    pub const TEAR: u8 = 1;
    /// No cache maintenance after the store.
    pub const NO_FLUSH: u8 = 2;
    /// Any first word taken for a known prologue.
    pub const ANY_PROLOGUE: u8 = 3;

    #[cfg(test)]
    pub static MODE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(OFF);

    #[inline]
    pub fn mode() -> u8 {
        #[cfg(test)]
        return MODE.load(std::sync::atomic::Ordering::Relaxed);
        #[cfg(not(test))]
        OFF
    }

    /// The torn store: two halves, a yield between them.
    pub fn torn_store(site: *mut u32, new: u32) -> Result<(), u32> {
        let h = site as *mut u16;
        // SAFETY: the broken variant (tests only): the two halves of the word `replace_word`
        // checked is 4-aligned, mapped and writable.
        unsafe {
            h.write_volatile(new as u16);
            std::thread::yield_now();
            h.add(1).write_volatile((new >> 16) as u16);
        }
        Ok(())
    }
}

#[cfg(target_arch = "x86_64")]
/// `jmp rel8` at `site` to `to`, when within reach.
pub fn jmp_rel8(site: usize, to: usize) -> Option<[u8; 2]> {
    let rel = (to as i64).wrapping_sub(site as i64 + 2);
    Some([0xeb, i8::try_from(rel).ok()? as u8])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_count_is_read_past_the_command_name() {
        let line = b"1234 (a) b (c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 7 0 1\n";
        // state is the first field after ')'; num_threads the 18th.
        assert_eq!(threads_in_stat(line), Some(7));
        assert_eq!(threads_in_stat(b"1 (x) S"), None);
        assert!(!single_threaded(), "the test harness runs threads");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_write_past_the_first_instruction_is_refused() {
        let old = [0x41, 0x54, 0x4c, 0x8b, 0x25];
        let new = [0xe9, 0, 0, 0, 0];
        // SAFETY: refused before anything is touched (the address is never written).
        let r = unsafe { replace_entry(0x1000 as *mut u8, old, new, 2, None) };
        assert_eq!(r, Err(PatchError::Busy));
        assert_eq!(jmp_rel8(0x1000, 0x1000 - 5), Some([0xeb, 0xf9]));
        assert_eq!(jmp_rel8(0x1000, 0x2000), None);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn rel32_reach() {
        assert_eq!(jmp_rel32(0x1000, 0x1005), Some([0xe9, 0, 0, 0, 0]));
        assert_eq!(
            jmp_rel32(0x1005, 0x1000),
            Some([0xe9, 0xf6, 0xff, 0xff, 0xff])
        );
        assert_eq!(jmp_rel32(0, 0x1_0000_0000), None);
        assert!(jmp_rel32(0x1_0000_0000, 0x1_0000_0000 + 0x7fff_0000).is_some());
    }
}
