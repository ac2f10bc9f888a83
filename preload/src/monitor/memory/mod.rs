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

use crate::monitor::forward::{self, Via};
use crate::monitor::patch::PatchTarget;
use crate::sys::symbol;
use crate::sys::{PAGE, errno, page_span, set_errno, syscall6};
use crate::trace;
use mrcache::invalidation::InvalidationQueue;
use mrcache::stats::{Tally, UnmapSource};
use mrcache::trace::{Call, Outcome};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::*};

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
    /// Hooks between their report and their end on this thread. Const-initialised, no
    /// destructor: safe in any hook, at any point of a thread's life.
    static OPEN_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

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

#[cfg_attr(not(test), unsafe(no_mangle))]
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

#[cfg_attr(not(test), unsafe(no_mangle))]
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

#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn posix_madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // POSIX_MADV_DONTNEED is a no-op in glibc; only the Linux advice values zap pages.
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
/// tell, so every range of a zapping call is reported (over-invalidating is safe).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn process_madvise(
    pidfd: c_int,
    iov: *const libc::iovec,
    vlen: usize,
    advice: c_int,
    flags: libc::c_uint,
) -> isize {
    let call = || {
        syscall6(
            libc::SYS_process_madvise,
            pidfd as usize,
            iov as usize,
            vlen,
            advice as usize,
            flags as usize,
            0,
        )
    };
    // The kernel refuses more than IOV_MAX ranges; report nothing for a call it refuses.
    if !zaps(advice) || iov.is_null() || vlen > 1024 || !REPORTING.load(Relaxed) {
        return call();
    }
    count(UnmapSource::Madvise);
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

/// `mprotect` and `pkey_mprotect`: not unmaps, but what another patcher needs before it can
/// write over one of our jumps (libc's code pages and ours are not writable). A call that
/// touches a watched page makes every hit check every site from before the system call
/// until the next `patch::try_clean` (docs/design.md, "A cheaper patch check"). Like
/// `process_madvise`, they issue the system call themselves (nothing else hooks them).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    protect(addr, len, prot)
}

/// Where libc's own `mprotect` entry jumps once patched (`patch::MPROTECT`): glibc's
/// internal `__mprotect` callers, `dlsym` on libc's handle and `RTLD_NEXT` reach it.
pub extern "C" fn mprotect_from_libc(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    protect(addr, len, prot)
}

fn protect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    let watched = crate::monitor::patch::watch_begin(addr as usize, len);
    let r = syscall6(
        libc::SYS_mprotect,
        addr as usize,
        len,
        prot as usize,
        0,
        0,
        0,
    ) as c_int;
    crate::monitor::patch::watch_end(watched);
    r
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn pkey_mprotect(addr: *mut c_void, len: usize, prot: c_int, pkey: c_int) -> c_int {
    let watched = crate::monitor::patch::watch_begin(addr as usize, len);
    // glibc's: pkey -1 is plain mprotect (kernels without pkeys refuse pkey_mprotect).
    let r = if pkey == -1 {
        syscall6(
            libc::SYS_mprotect,
            addr as usize,
            len,
            prot as usize,
            0,
            0,
            0,
        )
    } else {
        syscall6(
            libc::SYS_pkey_mprotect,
            addr as usize,
            len,
            prot as usize,
            pkey as usize,
            0,
            0,
        )
    } as c_int;
    crate::monitor::patch::watch_end(watched);
    r
}

/// `remap_file_pages` (deprecated; since Linux 4.0 the kernel emulates it as
/// `mmap(MAP_FIXED)` of the same file over `[start, start + size)`): the range is backed by
/// other pages of the file from then on, so it is reported, counted as a MAP_FIXED mmap. The
/// kernel rounds `start` down and `size` down to pages; the reported span (rounded out)
/// covers that. glibc's `remap_file_pages` is a plain system call wrapper that nothing in
/// glibc calls, so the symbol hook sees every call made through libc; like
/// `process_madvise`, it issues the system call itself (not forwarded to an interposer).
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn remap_file_pages(
    start: *mut c_void,
    size: usize,
    prot: c_int,
    pgoff: usize,
    flags: c_int,
) -> c_int {
    let call = || {
        syscall6(
            libc::SYS_remap_file_pages,
            start as usize,
            size,
            prot as usize,
            pgoff,
            flags as usize,
            0,
        ) as c_int
    };
    count(UnmapSource::MmapFixed);
    invalidating(start as usize, size, call)
}

/// mremap is variadic in C; on x86-64 a five-argument definition receives the optional
/// new address in the right register.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    mremap_via(Via::Symbol, old, old_len, new_len, flags, new_addr)
}

extern "C" fn mremap_from_libc(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    mremap_via(Via::Libc, old, old_len, new_len, flags, new_addr)
}

#[inline(always)]
fn mremap_via(
    via: Via,
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let t = t0();
    let e = &forward::MREMAP;
    count_once(e, old as usize, UnmapSource::Mremap);
    let call = || match e.target(old as usize, via) {
        // SAFETY: the next mremap, or libc's mremap entry (variadic; on x86-64 the fifth
        // argument travels in its register either way), or the hook another patcher put
        // there.
        Some(to) => e.run(old as usize, to, |f| unsafe {
            f(old, old_len, new_len, flags, new_addr)
        }),
        None => syscall6(
            libc::SYS_mremap,
            old as usize,
            old_len,
            new_len,
            flags as usize,
            new_addr as usize,
            0,
        ) as *mut c_void,
    };
    let r = if flags & MREMAP_FIXED != 0 {
        invalidating(new_addr as usize, new_len, || {
            invalidating(old as usize, old_len, call)
        })
    } else {
        invalidating(old as usize, old_len, call)
    };
    traced(
        Call::Mremap,
        true,
        [old as u64, old_len as u64, new_len as u64, flags as u64, 0],
        r as i64,
        t,
    );
    r
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    mmap_via(&forward::MMAP, Via::Symbol, addr, len, prot, flags, fd, off)
}

extern "C" fn mmap_from_libc(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    mmap_via(&forward::MMAP, Via::Libc, addr, len, prot, flags, fd, off)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn mmap_via(
    e: &forward::Entry<forward::MmapFn>,
    via: Via,
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    if off & (PAGE as i64 - 1) != 0 {
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    }
    let t = t0();
    let call = || match e.target(addr as usize, via) {
        // SAFETY: the next mmap (or mmap64), libc's mmap entry, or the hook another patcher
        // put there.
        Some(to) => e.run(addr as usize, to, |f| unsafe {
            f(addr, len, prot, flags, fd, off)
        }),
        None => syscall6(
            libc::SYS_mmap,
            addr as usize,
            len,
            prot as usize,
            flags as usize,
            fd as usize,
            off as usize,
        ) as *mut c_void,
    };
    let fixed = flags & MAP_FIXED != 0 && flags & MAP_FIXED_NOREPLACE == 0;
    // The kernel rounds a hugetlb mapping up to whole huge pages: report what it replaces.
    let len = if flags & libc::MAP_HUGETLB != 0 {
        huge_round(len, flags)
    } else {
        len
    };
    if fixed {
        count_once(e, addr as usize, UnmapSource::MmapFixed);
    }
    let r = invalidating_if(fixed, addr as usize, len, call);
    traced(
        Call::Mmap,
        fixed,
        [addr as u64, len as u64, flags as u64, 0, 0],
        r as i64,
        t,
    );
    r
}

/// `len` rounded up to the huge page size a MAP_HUGETLB mapping uses: the size encoded in
/// flags bits 26..31 (MAP_HUGE_2MB, MAP_HUGE_1GB), else the largest x86-64 one (1 GiB), since
/// the system default is not known here (over-invalidating is safe).
fn huge_round(len: usize, flags: c_int) -> usize {
    let shift = (flags as u32 >> 26) & 0x3f;
    let page = if (12..=30).contains(&shift) {
        1usize << shift
    } else {
        1 << 30
    };
    len.saturating_add(page - 1) & !(page - 1)
}

/// What `brk(addr)` gives back when the break is at `cur`: `[addr, cur)` as (start, len), or
/// None when it grows, stays, or only asks (`addr` 0).
fn brk_shrink(addr: usize, cur: usize) -> Option<(usize, usize)> {
    (addr != 0 && addr < cur).then(|| (addr, cur - addr))
}

/// What `sbrk(incr)` with `incr < 0` gives back when the break is at `cur`, as (start, len).
fn sbrk_shrink(cur: usize, incr: isize) -> (usize, usize) {
    let len = incr.unsigned_abs();
    (cur.saturating_sub(len), len)
}

/// glibc's chunk behind the allocation `ptr`, from its header words `prev_size` and `size`:
/// when bit 1 of `size` (IS_MMAPPED) is set, the chunk (16 bytes before `ptr`) is its own
/// mapping, which starts `prev_size` bytes before the chunk and spans `prev_size` plus the
/// chunk size (`size` without its three flag bits). None for a heap chunk.
fn mmapped_chunk(ptr: usize, prev_size: usize, size: usize) -> Option<(usize, usize)> {
    if size & 2 == 0 {
        return None;
    }
    let chunk = ptr.wrapping_sub(16);
    Some((
        chunk.wrapping_sub(prev_size),
        prev_size.wrapping_add(size & !7),
    ))
}

/// libc's `__curbrk` (the program's copy if it has one: libc keeps that), which its brk
/// keeps; our brk must keep it too.
pub static CURBRK: AtomicPtr<*mut c_void> = AtomicPtr::new(std::ptr::null_mut());

#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn brk(addr: *mut c_void) -> c_int {
    move_break(Via::Symbol, addr)
}

extern "C" fn brk_from_libc(addr: *mut c_void) -> c_int {
    move_break(Via::Libc, addr)
}

/// The brk hook's body. Our own calls come here directly (as libc's: glibc's sbrk calls its
/// internal brk): a call to the exported `brk` goes through our GOT, which UCX's reloc mode
/// points at its hook (a brk system call of its own, unseen by us).
fn move_break(via: Via, addr: *mut c_void) -> c_int {
    let t = t0();
    let mut curbrk = CURBRK.load(Relaxed);
    if curbrk.is_null() {
        // Called before our constructor (another library's initialisation): find libc's
        // __curbrk now, or libc's sbrk and malloc would go on from a stale break.
        curbrk = symbol::address(libc::RTLD_DEFAULT, c"__curbrk") as *mut *mut c_void;
        CURBRK.store(curbrk, Relaxed);
    }
    // SAFETY: CURBRK is null or libc's exported __curbrk variable.
    let cur = if curbrk.is_null() {
        0
    } else {
        unsafe { *curbrk as usize }
    };
    let given_back = brk_shrink(addr as usize, cur);
    let shrink = given_back.is_some();
    let (start, len) = given_back.unwrap_or((0, 0));
    let e = &forward::BRK;
    if shrink {
        count_once(e, addr as usize, UnmapSource::Brk);
    }
    if let Some(to) = e.target(addr as usize, via) {
        // The next brk, or libc's (or another patcher's hook there), keeps __curbrk itself.
        // SAFETY: the next brk, libc's brk entry, or the hook another patcher put there.
        let call = || e.run(addr as usize, to, |f| unsafe { f(addr) });
        let r = invalidating_if(shrink, start, len, call);
        traced(Call::Brk, shrink, [addr as u64, 0, 0, 0, 0], r as i64, t);
        return r;
    }
    let call = || syscall6(libc::SYS_brk, addr as usize, 0, 0, 0, 0, 0) as usize;
    let got = invalidating_if(shrink, start, len, call);
    if !curbrk.is_null() {
        // SAFETY: as above; libc's own brk stores the kernel's answer the same way.
        unsafe { *curbrk = got as *mut c_void };
    }
    let r = if got < addr as usize {
        set_errno(libc::ENOMEM);
        -1
    } else {
        0
    };
    traced(Call::Brk, shrink, [addr as u64, 0, 0, 0, 0], r as i64, t);
    r
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn sbrk(incr: isize) -> *mut c_void {
    sbrk_via(Via::Symbol, incr)
}

extern "C" fn sbrk_from_libc(incr: isize) -> *mut c_void {
    sbrk_via(Via::Libc, incr)
}

fn sbrk_via(via: Via, incr: isize) -> *mut c_void {
    let t = t0();
    let e = &forward::SBRK;
    let r = match e.target(incr as usize, via) {
        Some(to) => {
            // The next sbrk, or libc's (whose __brk we patched), or the hook another patcher
            // put at its entry, which may issue the brk system call itself (UCX's bistro):
            // report the shrink here.
            if incr < 0 {
                count_once(e, incr as usize, UnmapSource::Sbrk);
                let (start, len) = sbrk_shrink(current_break(e, to), incr);
                // SAFETY: the next sbrk, libc's sbrk entry, or the hook that replaced it,
                // with the app's argument.
                invalidating(start, len, || {
                    e.run(incr as usize, to, |f| unsafe { f(incr) })
                })
            } else {
                // SAFETY: as above.
                e.run(incr as usize, to, |f| unsafe { f(incr) })
            }
        }
        // libc's sbrk holds our jump: glibc's sbrk over our brk, which reports a shrink.
        None => own_sbrk(incr),
    };
    traced(Call::Sbrk, incr < 0, [incr as u64, 0, 0, 0, 0], r as i64, t);
    r
}

/// The program break: libc's `__curbrk`, else what `sbrk(0)` through `to` says.
fn current_break(e: &forward::Entry<forward::SbrkFn>, to: forward::To<forward::SbrkFn>) -> usize {
    let curbrk = CURBRK.load(Relaxed);
    // SAFETY: CURBRK is null or libc's exported __curbrk variable.
    match unsafe { curbrk.as_ref() } {
        Some(&b) if !b.is_null() => b as usize,
        // SAFETY: sbrk(0) only reads the break.
        _ => e.run(0, to, |f| unsafe { f(0) }) as usize,
    }
}

/// glibc's sbrk: move the break by `incr` through `brk` and return the old one.
fn own_sbrk(incr: isize) -> *mut c_void {
    const FAILED: *mut c_void = usize::MAX as *mut c_void;
    let curbrk = CURBRK.load(Relaxed);
    if curbrk.is_null() {
        set_errno(libc::ENOMEM);
        return FAILED;
    }
    // SAFETY: libc's exported __curbrk variable (read and written as glibc's sbrk does).
    let read = || unsafe { *curbrk as usize };
    if read() == 0 && move_break(Via::Libc, std::ptr::null_mut()) < 0 {
        return FAILED;
    }
    let old = read();
    if incr == 0 {
        return old as *mut c_void;
    }
    let Some(new) = old.checked_add_signed(incr) else {
        set_errno(libc::ENOMEM);
        return FAILED;
    };
    if move_break(Via::Libc, new as *mut c_void) < 0 {
        return FAILED;
    }
    old as *mut c_void
}

/// Attached System V segments (address, size), so that shmdt knows how much goes away.
const SHM_SLOTS: usize = 64;
static SHM: [(AtomicUsize, AtomicUsize); SHM_SLOTS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; SHM_SLOTS];

fn shm_size(id: c_int) -> usize {
    // SAFETY: shmid_ds is plain data; IPC_STAT fills it.
    unsafe {
        let mut ds: libc::shmid_ds = std::mem::zeroed();
        if libc::shmctl(id, libc::IPC_STAT, &mut ds) == 0 {
            ds.shm_segsz
        } else {
            0
        }
    }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn shmat(id: c_int, addr: *const c_void, flags: c_int) -> *mut c_void {
    shmat_via(Via::Symbol, id, addr, flags)
}

extern "C" fn shmat_from_libc(id: c_int, addr: *const c_void, flags: c_int) -> *mut c_void {
    shmat_via(Via::Libc, id, addr, flags)
}

fn shmat_via(via: Via, id: c_int, addr: *const c_void, flags: c_int) -> *mut c_void {
    let t = t0();
    let size = shm_size(id);
    let e = &forward::SHMAT;
    let call = || match e.target(id as usize, via) {
        // SAFETY: the next shmat, libc's shmat entry, or the hook another patcher put there.
        Some(to) => e.run(id as usize, to, |f| unsafe { f(id, addr, flags) }),
        None => syscall6(
            libc::SYS_shmat,
            id as usize,
            addr as usize,
            flags as usize,
            0,
            0,
            0,
        ) as *mut c_void,
    };
    let remap = flags & SHM_REMAP != 0 && !addr.is_null();
    if remap {
        count_once(e, id as usize, UnmapSource::ShmatRemap);
    }
    let p = invalidating_if(remap, addr as usize, size, call);
    // The call coming back from the next interposer: the outer call records the segment.
    if p as isize != -1 && size > 0 && !e.returning(id as usize) {
        for (a, s) in &SHM {
            if a.compare_exchange(0, p as usize, AcqRel, Relaxed).is_ok() {
                s.store(size, Release);
                break;
            }
        }
    }
    traced(
        Call::Shmat,
        remap,
        [id as u64, addr as u64, flags as u64, 0, 0],
        p as i64,
        t,
    );
    p
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn shmdt(addr: *const c_void) -> c_int {
    shmdt_via(Via::Symbol, addr)
}

extern "C" fn shmdt_from_libc(addr: *const c_void) -> c_int {
    shmdt_via(Via::Libc, addr)
}

fn shmdt_via(via: Via, addr: *const c_void) -> c_int {
    let t = t0();
    let e = &forward::SHMDT;
    if e.returning(addr as usize) {
        // The call coming back from the next interposer: the outer call took the segment's
        // size from the table and reports its range around this call.
        return match e.target(addr as usize, via) {
            // SAFETY: libc's shmdt entry, or the hook another patcher put there.
            Some(to) => e.run(addr as usize, to, |f| unsafe { f(addr) }),
            None => syscall6(libc::SYS_shmdt, addr as usize, 0, 0, 0, 0, 0) as c_int,
        };
    }
    let mut size = 0;
    for (a, s) in &SHM {
        if a.load(Acquire) == addr as usize {
            size = s.load(Acquire);
            a.store(0, Release);
            break;
        }
    }
    count(UnmapSource::Shmdt);
    // A segment attached before we were loaded (or beyond the table): assume everything
    // above it goes, as libfabric does.
    // A SHM_HUGETLB segment is mapped in whole huge pages, and whether this one is cannot be
    // told from its size: round up as for the largest huge page (shmdt is rare).
    let len = if size > 0 {
        huge_round(size, 0)
    } else {
        usize::MAX - addr as usize
    };
    let r = invalidating(addr as usize, len, || match e.target(addr as usize, via) {
        // SAFETY: the next shmdt, libc's shmdt entry, or the hook another patcher put there.
        Some(to) => e.run(addr as usize, to, |f| unsafe { f(addr) }),
        None => syscall6(libc::SYS_shmdt, addr as usize, 0, 0, 0, 0, 0) as c_int,
    });
    traced(Call::Shmdt, true, [addr as u64, 0, 0, 0, 0], r as i64, t);
    r
}

/// The realloc underneath is glibc's, whose chunk headers we may read.
pub static GLIBC_REALLOC: AtomicBool = AtomicBool::new(false);

/// glibc's realloc of an mmapped chunk moves it with its internal `__mremap`, which no
/// symbol hook and no patched entry point sees: report the old chunk first.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    // The next realloc in the search order (the allocator's).
    let Some(real) = symbol::REALLOC.get() else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    if !ptr.is_null() && GLIBC_REALLOC.load(Relaxed) && QUEUE.is_active() {
        // SAFETY: ptr is a live glibc allocation (the caller passes it to realloc): its
        // chunk header is the two words before it.
        let (prev, size_field) =
            unsafe { (*(ptr as *const usize).sub(2), *(ptr as *const usize).sub(1)) };
        if let Some((start, len)) = mmapped_chunk(ptr as usize, prev, size_field) {
            let t = t0();
            count(UnmapSource::Realloc);
            // SAFETY: as above.
            let r = invalidating(start, len, || unsafe { real(ptr, size) });
            traced(
                Call::Realloc,
                true,
                [ptr as u64, size as u64, 0, 0, 0],
                r as i64,
                t,
            );
            return r;
        }
    }
    // SAFETY: as above.
    unsafe { real(ptr, size) }
}

/// `mmap64` is the same function as `mmap` on 64-bit.
#[cfg_attr(not(test), unsafe(no_mangle))]
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
    fn hugetlb_lengths_round_up_to_the_huge_page() {
        let mb2 = 21 << 26; // MAP_HUGE_2MB
        assert_eq!(huge_round(1, mb2 as c_int), 2 << 20);
        assert_eq!(huge_round((2 << 20) + 1, mb2 as c_int), 4 << 20);
        assert_eq!(huge_round(1, 0), 1 << 30);
        assert_eq!(huge_round(usize::MAX, 0), usize::MAX & !((1 << 30) - 1));
    }
}
