//! The bottom layer: raw system calls, errno and the page size (this file; hooks issue
//! their system calls here, never through a libc wrapper that could be patched or hooked
//! again), the loader's tables (`elf`), looking a symbol up (`symbol`) and our own threads
//! (`thread`).
//!
//! Layer: the bottom (with `ffi`); uses nothing else of the crate (docs/design.md,
//! "Architecture").

pub mod elf;
pub mod symbol;
pub mod thread;

use std::ffi::{c_int, c_long};

/// The base page size on x86-64 (huge pages are handled where they matter).
pub const PAGE: usize = 4096;

/// `addr` rounded down to its page.
#[inline]
pub const fn page_down(addr: usize) -> usize {
    addr & !(PAGE - 1)
}

/// `addr` rounded up to a page boundary (saturating at the top of the address space).
#[inline]
pub const fn page_up(addr: usize) -> usize {
    addr.saturating_add(PAGE - 1) & !(PAGE - 1)
}

/// The whole pages `[start, end)` that `[addr, addr + len)` touches.
#[inline]
pub const fn page_span(addr: usize, len: usize) -> (usize, usize) {
    (page_down(addr), page_up(addr.saturating_add(len)))
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
        assert_eq!(page_span(0x1000, 1), (0x1000, 0x2000));
        assert_eq!(page_span(0x1fff, 2), (0x1000, 0x3000));
        assert_eq!(page_span(0x1000, 0x1000), (0x1000, 0x2000));
        assert_eq!(page_span(0x1000, 0), (0x1000, 0x1000));
        // Never wraps: a range reaching the top ends at the last page boundary.
        assert_eq!(page_span(usize::MAX - 10, 100).1, usize::MAX & !(PAGE - 1));
        assert_eq!(page_up(0), 0);
        assert_eq!(page_down(4095), 0);
    }
}
