//! Memory hooks: every way a process can make a virtual range stop being backed by the
//! pages it had. Each hook reports the range to the `InvalidationQueue` *before* the
//! kernel changes the mapping, then forwards the call: one that reached our exported
//! symbol to the next interposer after us, if there is one; else to libc's entry point (or
//! the hook another patcher put there, so it sees the call too), or issues the syscall
//! itself where that entry holds our own jump or the call is the forwarded one coming back
//! (`forward.rs`). Each hook has two doors: the exported symbol (`Via::Symbol`) and the
//! function our jump at libc's entry leads to (`*_from_libc`, `Via::Libc`: libc's own
//! calls, which no interposer sees).
//!
//! Hooks run in every thread of every process the library is preloaded into, before our
//! constructor (jemalloc calls madvise during its own initialisation) and inside
//! allocators: they take no lock, allocate nothing, print nothing, and when no cache
//! exists they only bump two counters around the syscall.
//!
//! Here: what every hook shares, `munmap` and the `madvise` family; `map` (mprotect,
//! remap_file_pages, mremap, mmap) and `heap` (brk, sbrk, shmat, shmdt, realloc).

use crate::monitor::forward::{self, Via};
use crate::monitor::patch::PatchTarget;
use crate::sys::{errno, page_span, set_errno, syscall6};
use crate::trace;
use mrcache::invalidation::InvalidationQueue;
use mrcache::stats::{Tally, UnmapSource};
use mrcache::trace::{Call, Outcome};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering::*};

mod heap;
mod map;

pub use heap::*;
pub use map::*;

/// Shared by every hook and the cache.
pub static QUEUE: InvalidationQueue = InvalidationQueue::new();

/// `MRCACHE_MONITOR=none`: hooks report nothing (tests use it to prove they see stale hits).
pub static REPORTING: AtomicBool = AtomicBool::new(true);

const MAP_FIXED: c_int = 0x10;
const MAP_FIXED_NOREPLACE: c_int = 0x10_0000;
const MREMAP_FIXED: c_int = 2;
const SHM_REMAP: c_int = 0o40000;

/// Unmaps reported, by `UnmapSource` (for the statistics).
pub static REPORTED: Tally<{ UnmapSource::COUNT }> = Tally::new();

fn count(source: UnmapSource) {
    if QUEUE.is_active() {
        REPORTED.add(source as usize, 1);
    }
}

/// `count`, unless this is the call we forwarded to the next interposer coming back (the
/// outer call counted it). The thread-local is read only when there is something to count.
#[inline(always)]
fn count_once<F: Copy>(entry: &forward::Entry<F>, key: usize, source: UnmapSource) {
    if QUEUE.is_active() && !entry.returning(key) {
        REPORTED.add(source as usize, 1);
    }
}

/// Start time for a trace record, or 0 when not tracing (the common case: one load).
#[inline]
fn t0() -> u64 {
    if trace::enabled() { trace::now_ns() } else { 0 }
}

#[inline]
fn traced(call: Call, invalidated: bool, args: [u64; 5], result: i64, t0: u64) {
    if t0 != 0 {
        let outcome = if invalidated && REPORTING.load(Relaxed) {
            Outcome::Invalidate
        } else {
            Outcome::Passthrough
        };
        trace::emit(call, outcome, args, result, t0);
    }
}

/// `invalidating` when `cond` holds (the caller counted it), else just the call.
#[inline(always)]
fn invalidating_if<T>(cond: bool, addr: usize, len: usize, f: impl FnOnce() -> T) -> T {
    if cond {
        invalidating(addr, len, f)
    } else {
        f()
    }
}

/// Run `f` (the syscall) with `[addr, addr + len)` reported as going away.
#[inline(always)]
fn invalidating<T>(addr: usize, len: usize, f: impl FnOnce() -> T) -> T {
    if !REPORTING.load(Relaxed) {
        return f();
    }
    let (start, end) = page_span(addr, len);
    let watched = report_begin(start, end);
    let r = f();
    report_end(watched);
    r
}

thread_local! {
    static OPEN_HERE_STD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}
/// Hooks between their report and their end on this thread. In the front's static TLS: safe
/// in any hook (inside an allocator too), at any point of a thread's life.
static OPEN_HERE: crate::sys::front::ThreadCell<u64> =
    crate::sys::front::ThreadCell::new(crate::sys::front_abi::TLS_OPEN_HERE, &OPEN_HERE_STD);

/// A hook reports `[start, end)` as going away (before the system call). Returns whether it
/// touches the code the patch check watches (`patch::watch_begin`), for `report_end`.
pub fn report_begin(start: usize, end: usize) -> bool {
    let _ = OPEN_HERE.try_with(|n| n.set(n.get() + 1));
    let watched = crate::monitor::patch::watch_begin(start, end - start);
    QUEUE.begin(start, end);
    watched
}

/// The hook's system call is done.
pub fn report_end(watched: bool) {
    QUEUE.end();
    crate::monitor::patch::watch_end(watched);
    let _ = OPEN_HERE.try_with(|n| n.set(n.get().saturating_sub(1)));
}

/// Reports this thread has open: nonzero in a fork child only when fork was called from a
/// signal handler that interrupted one of our hooks.
pub fn open_here() -> u64 {
    OPEN_HERE.try_with(|n| n.get()).unwrap_or(0)
}

pub extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    munmap_via(Via::Symbol, addr, len)
}

extern "C" fn munmap_from_libc(addr: *mut c_void, len: usize) -> c_int {
    munmap_via(Via::Libc, addr, len)
}

#[inline(always)]
fn munmap_via(via: Via, addr: *mut c_void, len: usize) -> c_int {
    let t = t0();
    let e = &forward::MUNMAP;
    count_once(e, addr as usize, UnmapSource::Munmap);
    let r = invalidating(addr as usize, len, || match e.target(addr as usize, via) {
        // SAFETY: the next munmap, libc's munmap entry, or the hook another patcher put
        // there.
        Some(to) => e.run(addr as usize, to, |f| unsafe { f(addr, len) }),
        None => syscall6(libc::SYS_munmap, addr as usize, len, 0, 0, 0, 0) as c_int,
    });
    traced(
        Call::Munmap,
        true,
        [addr as u64, len as u64, 0, 0, 0],
        r as i64,
        t,
    );
    r
}

/// The advice values that drop pages: the range is backed by new pages at the next touch.
fn zaps(advice: c_int) -> bool {
    matches!(
        advice,
        libc::MADV_DONTNEED
            | libc::MADV_FREE
            | libc::MADV_REMOVE
            | 24 /* MADV_DONTNEED_LOCKED */
            | 102 /* MADV_GUARD_INSTALL (Linux 6.13): zaps, and GUARD_REMOVE brings new pages */
    )
}

pub extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    madvise_via(Via::Symbol, addr, len, advice)
}

extern "C" fn madvise_from_libc(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    madvise_via(Via::Libc, addr, len, advice)
}

#[inline(always)]
fn madvise_via(via: Via, addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    let t = t0();
    let e = &forward::MADVISE;
    let call = || match e.target(addr as usize, via) {
        // SAFETY: the next madvise, libc's madvise entry, or the hook another patcher put
        // there.
        Some(to) => e.run(addr as usize, to, |f| unsafe { f(addr, len, advice) }),
        None => syscall6(
            libc::SYS_madvise,
            addr as usize,
            len,
            advice as usize,
            0,
            0,
            0,
        ) as c_int,
    };
    let zap = zaps(advice);
    if zap {
        count_once(e, addr as usize, UnmapSource::Madvise);
    }
    let r = invalidating_if(zap, addr as usize, len, call);
    traced(
        Call::Madvise,
        zap,
        [addr as u64, len as u64, advice as u64, 0, 0],
        r as i64,
        t,
    );
    r
}

pub extern "C" fn posix_madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // POSIX_MADV_DONTNEED is a no-op in glibc; only the Linux advice values zap pages.
    let zap = advice != libc::POSIX_MADV_DONTNEED && zaps(advice);
    let e = &forward::POSIX_MADVISE;
    if let Some(to) = e.target(addr as usize, Via::Symbol) {
        // The next interposer's, which returns the error number itself, as glibc's does.
        if zap {
            count_once(e, addr as usize, UnmapSource::Madvise);
        }
        return invalidating_if(zap, addr as usize, len, || {
            // SAFETY: the next interposer's posix_madvise (glibc's prototype).
            e.run(addr as usize, to, |f| unsafe { f(addr, len, advice) })
        });
    }
    // Returns the error number and leaves errno as it was, as glibc's does. glibc's calls
    // the system call itself, never an interposer's madvise: so does ours (libc's door).
    if advice == libc::POSIX_MADV_DONTNEED {
        return 0;
    }
    let saved = errno();
    if madvise_via(Via::Libc, addr, len, advice) == 0 {
        return 0;
    }
    let e = errno();
    set_errno(saved);
    e
}

/// `process_madvise` on the process's own pidfd takes any advice on recent kernels, and a
/// zapping one drops the pages like madvise. Which process a pidfd names is not cheap to
/// tell, so every range of a zapping call is reported (over-invalidating is safe). Goes on to
/// the next interposer, if there is one, else issues the system call itself.
pub extern "C" fn process_madvise(
    pidfd: c_int,
    iov: *const libc::iovec,
    vlen: usize,
    advice: c_int,
    flags: libc::c_uint,
) -> isize {
    let e = &forward::PROCESS_MADVISE;
    let call = || match e.target(iov as usize, Via::Symbol) {
        // SAFETY: the next interposer's process_madvise (glibc's prototype).
        Some(to) => e.run(iov as usize, to, |f| unsafe {
            f(pidfd, iov, vlen, advice, flags)
        }),
        None => syscall6(
            libc::SYS_process_madvise,
            pidfd as usize,
            iov as usize,
            vlen,
            advice as usize,
            flags as usize,
            0,
        ),
    };
    // The kernel refuses more than IOV_MAX ranges; report nothing for a call it refuses.
    if !zaps(advice) || iov.is_null() || vlen > 1024 || !REPORTING.load(Relaxed) {
        return call();
    }
    count_once(e, iov as usize, UnmapSource::Madvise);
    // SAFETY: the caller passes vlen iovecs at iov (the kernel reads the same array).
    let ranges = unsafe { std::slice::from_raw_parts(iov, vlen) };
    let mut watched = 0;
    for r in ranges {
        let (start, end) = page_span(r.iov_base as usize, r.iov_len);
        watched += report_begin(start, end) as usize;
    }
    let rc = call();
    for k in 0..ranges.len() {
        report_end(k < watched);
    }
    rc
}

/// `mmap64` is the same function as `mmap` on 64-bit.
pub extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    mmap_via(
        &forward::MMAP64,
        Via::Symbol,
        addr,
        len,
        prot,
        flags,
        fd,
        off,
    )
}

/// Where our jump at libc's entry of `target` leads: the hook's door for libc's own calls,
/// which are never sent to an interposer (they never reached one without us).
pub fn from_libc(target: PatchTarget) -> usize {
    match target {
        PatchTarget::Munmap => munmap_from_libc as *const () as usize,
        PatchTarget::Madvise => madvise_from_libc as *const () as usize,
        PatchTarget::Brk => brk_from_libc as *const () as usize,
        PatchTarget::Mmap => mmap_from_libc as *const () as usize,
        PatchTarget::Mremap => mremap_from_libc as *const () as usize,
        PatchTarget::Shmdt => shmdt_from_libc as *const () as usize,
        PatchTarget::Sbrk => sbrk_from_libc as *const () as usize,
        PatchTarget::Shmat => shmat_from_libc as *const () as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brk_gives_back_the_range_above_the_new_break() {
        assert_eq!(brk_shrink(0x5000, 0x9000), Some((0x5000, 0x4000)));
        assert_eq!(brk_shrink(0x9000, 0x9000), None);
        assert_eq!(brk_shrink(0xa000, 0x9000), None);
        assert_eq!(brk_shrink(0, 0x9000), None);
        assert_eq!(sbrk_shrink(0x9000, -0x1000), (0x8000, 0x1000));
        assert_eq!(sbrk_shrink(0x800, -0x1000), (0, 0x1000));
        assert_eq!(
            sbrk_shrink(0x9000, isize::MIN),
            (0, isize::MIN.unsigned_abs())
        );
    }

    #[test]
    fn mmapped_realloc_chunk_covers_its_mapping() {
        // glibc: a 200000-byte malloc is mmapped: the mapping is page aligned, the chunk
        // starts prev_size (alignment padding, here 0) into it, size = mapping | IS_MMAPPED.
        let map = 0x7f00_0000_0000usize;
        let ptr = map + 16;
        let size = 0x31000 | 2;
        assert_eq!(mmapped_chunk(ptr, 0, size), Some((map, 0x31000)));
        // With 32 bytes of padding before the chunk (memalign): the mapping starts there.
        assert_eq!(
            mmapped_chunk(map + 32 + 16, 32, (0x31000 - 32) | 2),
            Some((map, 0x31000))
        );
        // PREV_INUSE (1) and NON_MAIN_ARENA (4) are flags, not size; a heap chunk: None.
        assert_eq!(mmapped_chunk(ptr, 0, 0x31000 | 7), Some((map, 0x31000)));
        assert_eq!(mmapped_chunk(ptr, 0, 0x31000 | 1), None);
    }

    #[test]
    fn protection_changes_that_take_access_away_are_invalidations() {
        use libc::{PROT_EXEC, PROT_NONE, PROT_READ, PROT_WRITE};
        for prot in [
            PROT_NONE,
            PROT_READ,
            PROT_READ | PROT_EXEC,
            PROT_EXEC,
            PROT_WRITE,
        ] {
            assert!(drops_access(prot), "{prot:#x}");
        }
        for prot in [PROT_READ | PROT_WRITE, PROT_READ | PROT_WRITE | PROT_EXEC] {
            assert!(!drops_access(prot), "{prot:#x}");
        }
    }

    #[test]
    fn hugetlb_lengths_round_up_to_the_huge_page() {
        let mb2 = 21 << 26; // MAP_HUGE_2MB
        assert_eq!(huge_round(1, mb2 as c_int), 2 << 20);
        assert_eq!(huge_round((2 << 20) + 1, mb2 as c_int), 4 << 20);
        assert_eq!(huge_round(1, 0), 1 << 30);
        assert_eq!(huge_round(usize::MAX, 0), usize::MAX & !((1 << 30) - 1));
    }
}
