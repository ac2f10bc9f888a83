//! The bottom layer: raw system calls, errno and the page size (this file; hooks issue
//! their system calls here, never through a libc wrapper that could be patched or hooked
//! again), the loader's tables (`elf`), a sanitizer's runtime in the process (`sanitizer`),
//! looking a symbol up (`symbol`), the front that attached the engine (`front`, `front_abi`) and the
//! loader's list read without a call (`link_map`, shared with the front), our own threads (`thread`) and whether pins are charged
//! against `RLIMIT_MEMLOCK` (`memlock`).
//!
//! Layer: the bottom (with `ffi`); uses nothing else of the crate (docs/design/overview.md,
//! "The layers of libmrcache.so").

pub mod elf;
pub mod front;
// Shared with the front (`preload/front`), which uses what the engine does not.
#[allow(dead_code)]
pub mod front_abi;
#[allow(dead_code)]
pub mod link_map;
pub mod memlock;
pub mod sanitizer;
pub mod symbol;
pub mod thread;

use std::ffi::{c_int, c_long};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The kernel's base page size, from the auxiliary vector (`AT_PAGESZ`): 4 KiB on x86-64;
/// 4, 16 or 64 KiB on aarch64, chosen when the kernel was built (huge pages are handled
/// where they matter). Read once and kept: `getauxval` only walks the vector the kernel
/// gave the process (no lock, no allocation, async-signal-safe), so any hook may be the
/// first to ask.
#[inline]
pub fn page_size() -> usize {
    match PAGE_SIZE.load(Relaxed) {
        0 => page_size_from_auxv(),
        p => p,
    }
}

static PAGE_SIZE: AtomicUsize = AtomicUsize::new(0);

#[cold]
fn page_size_from_auxv() -> usize {
    // The deliberately broken variant (unit tests only): the old constant.
    #[cfg(test)]
    if std::env::var_os("MRCACHE_TEST_A64_BREAK").is_some_and(|v| v == "page-4096") {
        PAGE_SIZE.store(4096, Relaxed);
        return 4096;
    }
    // SAFETY: getauxval reads the process's auxiliary vector; no preconditions.
    let auxv = unsafe { libc::getauxval(libc::AT_PAGESZ) } as usize;
    // SAFETY: sysconf has no preconditions (glibc: GLRO(dl_pagesize), no lock).
    let p = choose_page_size(auxv, || unsafe { libc::sysconf(libc::_SC_PAGESIZE) });
    PAGE_SIZE.store(p, Relaxed);
    p
}

/// The kernel's page (AT_PAGESZ). A vector without it (never seen on Linux: only an exec
/// emulator building its own) leaves glibc's own figure, the one malloc and the program
/// use; no constant would do, as a smaller page than the kernel's makes an unmap look
/// smaller than it is (a stale registration) and a larger one makes a patch mprotect reach
/// neighbouring pages. 4096 only if glibc has none either.
fn choose_page_size(auxv: usize, sysconf: impl FnOnce() -> libc::c_long) -> usize {
    let plausible = |p: usize| p.is_power_of_two() && p >= 4096;
    if plausible(auxv) {
        return auxv;
    }
    let p = sysconf().max(0) as usize;
    if plausible(p) { p } else { 4096 }
}

/// `addr` rounded down to a multiple of `page` (a power of two).
#[inline]
pub const fn round_down(addr: usize, page: usize) -> usize {
    addr & !(page - 1)
}

/// `addr` rounded up to a multiple of `page` (saturating at the top of the address space).
#[inline]
pub const fn round_up(addr: usize, page: usize) -> usize {
    addr.saturating_add(page - 1) & !(page - 1)
}

/// `addr` rounded down to its page.
#[inline]
pub fn page_down(addr: usize) -> usize {
    round_down(addr, page_size())
}

/// `addr` rounded up to a page boundary (saturating at the top of the address space).
#[inline]
pub fn page_up(addr: usize) -> usize {
    round_up(addr, page_size())
}

/// The whole pages of size `page` that `[addr, addr + len)` touches: what the kernel
/// unmaps, advises or protects for such a call.
#[inline]
pub const fn span_in(addr: usize, len: usize, page: usize) -> (usize, usize) {
    (
        round_down(addr, page),
        round_up(addr.saturating_add(len), page),
    )
}

/// The whole pages `[start, end)` that `[addr, addr + len)` touches.
#[inline]
pub fn page_span(addr: usize, len: usize) -> (usize, usize) {
    span_in(addr, len, page_size())
}

/// This thread's errno.
pub fn errno() -> c_int {
    // SAFETY: __errno_location always returns this thread's errno.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location always returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// Raw system call with libc's error convention (-1 and errno).
#[inline]
pub fn syscall6(n: c_long, a: usize, b: usize, c: usize, d: usize, e: usize, f: usize) -> isize {
    // SAFETY: syscall(2) with integer arguments; each caller passes the kernel ABI's.
    unsafe { libc::syscall(n, a, b, c, d, e, f) as isize }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_rounding() {
        let page = page_size();
        assert_eq!(page_span(page, 1), (page, 2 * page));
        assert_eq!(page_span(2 * page - 1, 2), (page, 3 * page));
        assert_eq!(page_span(page, page), (page, 2 * page));
        assert_eq!(page_span(page, 0), (page, page));
        // Never wraps: a range reaching the top ends at the last page boundary.
        assert_eq!(page_span(usize::MAX - 10, 100).1, usize::MAX & !(page - 1));
        assert_eq!(page_up(0), 0);
        assert_eq!(page_down(page - 1), 0);
    }

    /// The page size is the kernel's (what glibc's sysconf reports from the same vector),
    /// not a constant: run under `qemu-aarch64 -p 16384` and `-p 65536` by `ci/aarch64 unit`,
    /// which also runs it with `MRCACHE_TEST_A64_BREAK=page-4096` (the old `PAGE = 4096`),
    /// where it must fail.
    #[test]
    fn page_size_is_the_kernels() {
        // SAFETY: sysconf has no preconditions.
        let kernel = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        assert_eq!(page_size(), kernel);
        assert!(page_size().is_power_of_two() && page_size() >= 4096);
        // A fresh mapping starts on a page of that size.
        // SAFETY: a private anonymous mapping of our own, unmapped again.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                1,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            assert_eq!(p as usize % page_size(), 0);
            libc::munmap(p, 1);
        }
    }

    /// With 16 KiB and 64 KiB pages (aarch64 kernels) a call's range covers the whole pages
    /// the kernel acts on: munmap(p, 4096) of a 64 KiB page takes all of it, so every
    /// registration in it must be invalidated, not just the first 4 KiB.
    #[test]
    fn a_vector_without_the_page_size_leaves_glibcs() {
        assert_eq!(choose_page_size(16384, || 4096), 16384);
        // No AT_PAGESZ on a 64 KiB kernel: glibc's figure, never a smaller constant.
        assert_eq!(choose_page_size(0, || 65536), 65536);
        assert_eq!(choose_page_size(3000, || 16384), 16384);
        assert_eq!(choose_page_size(0, || -1), 4096);
    }

    #[test]
    fn rounding_follows_the_page_size() {
        for page in [4096usize, 16384, 65536] {
            let p = 7 * page;
            assert_eq!(span_in(p, 4096, page), (p, p + page), "{page}");
            assert_eq!(span_in(p + page / 2, 1, page), (p, p + page), "{page}");
            assert_eq!(span_in(p + page - 1, 2, page), (p, p + 2 * page), "{page}");
            assert_eq!(span_in(p, 0, page), (p, p), "{page}");
            assert_eq!(round_up(usize::MAX - 10, page), usize::MAX & !(page - 1));
            assert_eq!(round_down(p + page - 1, page), p);
        }
    }
}
