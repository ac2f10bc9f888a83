//! The hooks of the heap and of System V segments: the program break (`brk`, `sbrk`),
//! `shmat`/`shmdt`, and glibc's `realloc` of an mmapped chunk (moved by its internal
//! `__mremap`, which nothing else sees).

use super::*;
use crate::monitor::forward::{self, Via};
use crate::sys::symbol;
use crate::sys::{set_errno, syscall6};
use mrcache::stats::UnmapSource;
use mrcache::trace::Call;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize};

/// What `brk(addr)` gives back when the break is at `cur`: `[addr, cur)` as (start, len), or
/// None when it grows, stays, or only asks (`addr` 0).
pub(super) fn brk_shrink(addr: usize, cur: usize) -> Option<(usize, usize)> {
    (addr != 0 && addr < cur).then(|| (addr, cur - addr))
}

/// What `sbrk(incr)` with `incr < 0` gives back when the break is at `cur`, as (start, len).
pub(super) fn sbrk_shrink(cur: usize, incr: isize) -> (usize, usize) {
    let len = incr.unsigned_abs();
    (cur.saturating_sub(len), len)
}

/// glibc's chunk behind the allocation `ptr`, from its header words `prev_size` and `size`:
/// when bit 1 of `size` (IS_MMAPPED) is set, the chunk (16 bytes before `ptr`) is its own
/// mapping, which starts `prev_size` bytes before the chunk and spans `prev_size` plus the
/// chunk size (`size` without its three flag bits). None for a heap chunk.
pub(super) fn mmapped_chunk(ptr: usize, prev_size: usize, size: usize) -> Option<(usize, usize)> {
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
/// keeps; our brk must keep it too. Null until the first call that needs it (`curbrk`).
static CURBRK: AtomicPtr<*mut c_void> = AtomicPtr::new(std::ptr::null_mut());

/// `__curbrk` as libc's own code uses it (through its GOT): the first definition in the
/// loader's list, the program's copy (a copy relocation) before libc's original. Found
/// without dlsym or allocation (a brk hook may run inside an allocator, or before any
/// constructor of ours). Null when there is none.
fn curbrk() -> *mut *mut c_void {
    let mut p = CURBRK.load(Relaxed);
    if p.is_null() {
        p = crate::sys::elf::first_definition(c"__curbrk") as *mut *mut c_void;
        CURBRK.store(p, Relaxed);
    }
    p
}

pub extern "C" fn brk(addr: *mut c_void) -> c_int {
    move_break(Via::Symbol, addr)
}

pub(super) extern "C" fn brk_from_libc(addr: *mut c_void) -> c_int {
    move_break(Via::Libc, addr)
}

/// The brk hook's body. Our own calls come here directly (as libc's: glibc's sbrk calls its
/// internal brk): a call to the exported `brk` goes through our GOT, which UCX's reloc mode
/// points at its hook (a brk system call of its own, unseen by us).
pub(super) fn move_break(via: Via, addr: *mut c_void) -> c_int {
    let t = t0();
    let curbrk = curbrk();
    let cur = if curbrk.is_null() {
        0
    } else {
        // SAFETY: a non-null CURBRK is libc's exported __curbrk variable.
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

pub extern "C" fn sbrk(incr: isize) -> *mut c_void {
    sbrk_via(Via::Symbol, incr)
}

pub(super) extern "C" fn sbrk_from_libc(incr: isize) -> *mut c_void {
    sbrk_via(Via::Libc, incr)
}

pub(super) fn sbrk_via(via: Via, incr: isize) -> *mut c_void {
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
                invalidating(start, len, || {
                    // SAFETY: the next sbrk, libc's sbrk entry, or the hook that replaced
                    // it, with the app's argument.
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
pub(super) fn current_break(
    e: &forward::Entry<forward::SbrkFn>,
    to: forward::To<forward::SbrkFn>,
) -> usize {
    let curbrk = curbrk();
    // SAFETY: curbrk is null or libc's exported __curbrk variable.
    match unsafe { curbrk.as_ref() } {
        Some(&b) if !b.is_null() => b as usize,
        // SAFETY: sbrk(0) only reads the break.
        _ => e.run(0, to, |f| unsafe { f(0) }) as usize,
    }
}

/// glibc's sbrk: move the break by `incr` through `brk` and return the old one.
pub(super) fn own_sbrk(incr: isize) -> *mut c_void {
    const FAILED: *mut c_void = usize::MAX as *mut c_void;
    let curbrk = curbrk();
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
pub(super) const SHM_SLOTS: usize = 64;
pub(super) static SHM: [(AtomicUsize, AtomicUsize); SHM_SLOTS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; SHM_SLOTS];

pub(super) fn shm_size(id: c_int) -> usize {
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

pub extern "C" fn shmat(id: c_int, addr: *const c_void, flags: c_int) -> *mut c_void {
    shmat_via(Via::Symbol, id, addr, flags)
}

pub(super) extern "C" fn shmat_from_libc(
    id: c_int,
    addr: *const c_void,
    flags: c_int,
) -> *mut c_void {
    shmat_via(Via::Libc, id, addr, flags)
}

pub(super) fn shmat_via(via: Via, id: c_int, addr: *const c_void, flags: c_int) -> *mut c_void {
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

pub extern "C" fn shmdt(addr: *const c_void) -> c_int {
    shmdt_via(Via::Symbol, addr)
}

pub(super) extern "C" fn shmdt_from_libc(addr: *const c_void) -> c_int {
    shmdt_via(Via::Libc, addr)
}

pub(super) fn shmdt_via(via: Via, addr: *const c_void) -> c_int {
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

/// Whether the realloc underneath is glibc's, whose chunk headers we may read: looked up at
/// the first call that needs it (0 not yet, 1 no, 2 yes).
static GLIBC_REALLOC: AtomicU8 = AtomicU8::new(0);

fn glibc_realloc(next: *mut c_void) -> bool {
    match GLIBC_REALLOC.load(Relaxed) {
        0 => {
            let glibc = next == crate::sys::elf::libc_symbol(c"realloc");
            GLIBC_REALLOC.store(1 + glibc as u8, Relaxed);
            glibc
        }
        known => known == 2,
    }
}

/// glibc's realloc of an mmapped chunk moves it with its internal `__mremap`, which no
/// symbol hook and no patched entry point sees: report the old chunk first.
pub extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    // The next realloc in the search order (the allocator's).
    let Some(real) = symbol::REALLOC.get() else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    if !ptr.is_null() && QUEUE.is_active() && glibc_realloc(real as *mut c_void) {
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
