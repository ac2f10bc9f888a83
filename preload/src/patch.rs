//! The `patch` monitor: glibc calls its own `__munmap`, `__madvise` and `__brk` from
//! `free`, `malloc_trim`, arena shrinking and `sbrk`, past any symbol interposition. In
//! glibc these internal entry points are the same code as the exported `munmap`,
//! `madvise` and `brk`, so we overwrite the first 13 bytes of each with a jump to our hook
//! (`movabs r11, hook; jmp r11`), once, in the constructor, before the program has
//! threads, and never undo it (libfabric's crashes came from patching and un-patching while
//! other threads ran the code). A function whose first bytes are not the expected system
//! call stub is left alone, and the self-test then reports that path as not covered.

use std::ffi::{CStr, c_void};

pub struct Target {
    pub name: &'static CStr,
    /// The bytes libc's function must start with: `mov eax, NR; syscall`.
    pub expect: [u8; 7],
    pub hook: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchError {
    NotFound,
    Unexpected,
    Mprotect,
}

const JUMP_LEN: usize = 13;

/// Overwrite libc's `target.name` with a jump to `target.hook`.
#[cfg(target_arch = "x86_64")]
pub fn patch(libc_handle: *mut c_void, target: &Target) -> Result<(), PatchError> {
    // SAFETY: dlsym on a live handle with a valid name.
    let f = unsafe { libc::dlsym(libc_handle, target.name.as_ptr()) } as *mut u8;
    if f.is_null() {
        return Err(PatchError::NotFound);
    }
    // SAFETY: f is the start of a libc function of at least 16 bytes (a syscall stub).
    let head = unsafe { std::slice::from_raw_parts(f, target.expect.len()) };
    if head != target.expect {
        return Err(PatchError::Unexpected);
    }
    let mut code = [0u8; JUMP_LEN];
    code[0] = 0x49; // movabs r11, imm64
    code[1] = 0xbb;
    code[2..10].copy_from_slice(&(target.hook as u64).to_le_bytes());
    code[10] = 0x41; // jmp r11
    code[11] = 0xff;
    code[12] = 0xe3;
    let page = 4096usize;
    let start = f as usize & !(page - 1);
    let end = (f as usize + JUMP_LEN + page - 1) & !(page - 1);
    let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
    // SAFETY: the pages hold libc's text; we make them writable for the copy and give
    // them back read+execute. Raw syscalls: libc's mprotect could itself be hooked.
    unsafe {
        if libc::syscall(libc::SYS_mprotect, start, end - start, rwx) != 0 {
            return Err(PatchError::Mprotect);
        }
        std::ptr::copy_nonoverlapping(code.as_ptr(), f, JUMP_LEN);
        libc::syscall(
            libc::SYS_mprotect,
            start,
            end - start,
            libc::PROT_READ | libc::PROT_EXEC,
        );
    }
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
pub fn patch(_libc_handle: *mut c_void, _target: &Target) -> Result<(), PatchError> {
    Err(PatchError::Unexpected)
}
