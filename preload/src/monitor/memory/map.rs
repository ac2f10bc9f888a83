//! The hooks that change a mapping in place: `mprotect`/`pkey_mprotect` (for the patch
//! check's watch), `remap_file_pages`, `mremap` and `mmap` (a `MAP_FIXED` one replaces what
//! was there).

use super::*;
use crate::monitor::forward::{self, Via};
use crate::sys::{page_size, set_errno, syscall6};
use mrcache::stats::UnmapSource;
use mrcache::trace::Call;
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering::Relaxed;

/// `mprotect` and `pkey_mprotect`. A change that takes access away invalidates the range
/// as an unmap does: the kernel refuses to pin for writing a page the process cannot write
/// (and a page it cannot read at all), so a registration made after it must fail as
/// without the cache instead of hitting an entry pinned before (docs/design/monitor.md, "Protection
/// changes"). They are also what another patcher needs before it can write over one of our
/// jumps (libc's code pages and ours are not writable): a call that touches a watched page
/// makes every hit check every site from before the system call until the next
/// `patch::try_clean` (docs/design/monitor.md, "The patch check"). A call through our symbol
/// goes on to the next interposer, if there is one; otherwise they issue the system call
/// themselves (`forward::Entry::unpatched`).
pub extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    protect(Via::Symbol, addr, len, prot)
}

/// Where libc's own `mprotect` entry jumps once patched (`patch::MPROTECT`): glibc's
/// internal `__mprotect` callers, `dlsym` on libc's handle and `RTLD_NEXT` reach it.
pub extern "C" fn mprotect_from_libc(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    protect(Via::Libc, addr, len, prot)
}

fn protect(via: Via, addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    let e = &forward::MPROTECT;
    protecting(e, addr as usize, len, prot, || {
        match e.target(addr as usize, via) {
            // SAFETY: the next interposer's mprotect (glibc's prototype).
            Some(to) => e.run(addr as usize, to, |f| unsafe { f(addr, len, prot) }),
            None => syscall6(
                libc::SYS_mprotect,
                addr as usize,
                len,
                prot as usize,
                0,
                0,
                0,
            ) as c_int,
        }
    })
}

pub extern "C" fn pkey_mprotect(addr: *mut c_void, len: usize, prot: c_int, pkey: c_int) -> c_int {
    let e = &forward::PKEY_MPROTECT;
    protecting(e, addr as usize, len, prot, || {
        if let Some(to) = e.target(addr as usize, Via::Symbol) {
            // SAFETY: the next interposer's pkey_mprotect (glibc's prototype).
            return e.run(addr as usize, to, |f| unsafe { f(addr, len, prot, pkey) });
        }
        // glibc's: pkey -1 is plain mprotect (kernels without pkeys refuse pkey_mprotect).
        (if pkey == -1 {
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
        }) as c_int
    })
}

/// Whether pages protected `prot` may lack an access a registration was pinned with: they
/// are not writable (a registration for local or remote write or atomics) or not readable
/// (any). A change that only adds rights leaves every pin the kernel would make again.
pub(super) fn drops_access(prot: c_int) -> bool {
    prot & libc::PROT_WRITE == 0 || prot & libc::PROT_READ == 0
}

/// Run `call` (a protection change of `[addr, addr + len)` to `prot`), reported as an
/// invalidation when it takes access away, else under the patch check's watch only.
#[inline(always)]
fn protecting<F: Copy>(
    e: &forward::Entry<F>,
    addr: usize,
    len: usize,
    prot: c_int,
    call: impl FnOnce() -> c_int,
) -> c_int {
    if drops_access(prot) && REPORTING.load(Relaxed) {
        count_once(e, addr, UnmapSource::Mprotect);
        // report_begin starts the watch over the same range.
        return invalidating(addr, len, call);
    }
    let watched = crate::monitor::patch::watch_begin(addr, len);
    let r = call();
    crate::monitor::patch::watch_end(watched);
    r
}

/// `remap_file_pages` (deprecated; since Linux 4.0 the kernel emulates it as
/// `mmap(MAP_FIXED)` of the same file over `[start, start + size)`): the range is backed by
/// other pages of the file from then on, so it is reported, counted as a MAP_FIXED mmap. The
/// kernel rounds `start` down and `size` down to pages; the reported span (rounded out)
/// covers that. glibc's `remap_file_pages` is a plain system call wrapper that nothing in
/// glibc calls, so the symbol hook sees every call made through libc; it goes on to the next
/// interposer, if there is one, else issues the system call itself.
pub extern "C" fn remap_file_pages(
    start: *mut c_void,
    size: usize,
    prot: c_int,
    pgoff: usize,
    flags: c_int,
) -> c_int {
    let e = &forward::REMAP_FILE_PAGES;
    let call = || match e.target(start as usize, Via::Symbol) {
        // SAFETY: the next interposer's remap_file_pages (glibc's prototype).
        Some(to) => e.run(start as usize, to, |f| unsafe {
            f(start, size, prot, pgoff, flags)
        }),
        None => syscall6(
            libc::SYS_remap_file_pages,
            start as usize,
            size,
            prot as usize,
            pgoff,
            flags as usize,
            0,
        ) as c_int,
    };
    count_once(e, start as usize, UnmapSource::MmapFixed);
    invalidating(start as usize, size, call)
}

/// mremap is variadic in C; on x86-64 a five-argument definition receives the optional
/// new address in the right register.
pub extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    mremap_via(Via::Symbol, old, old_len, new_len, flags, new_addr)
}

pub(super) extern "C" fn mremap_from_libc(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    mremap_via(Via::Libc, old, old_len, new_len, flags, new_addr)
}

#[inline(always)]
pub(super) fn mremap_via(
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

pub(super) extern "C" fn mmap_from_libc(
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
pub(super) fn mmap_via(
    e: &forward::Entry<forward::MmapFn>,
    via: Via,
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    if off & (page_size() as i64 - 1) != 0 {
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
pub(super) fn huge_round(len: usize, flags: c_int) -> usize {
    let shift = (flags as u32 >> 26) & 0x3f;
    let page = if (12..=30).contains(&shift) {
        1usize << shift
    } else {
        1 << 30
    };
    len.saturating_add(page - 1) & !(page - 1)
}
