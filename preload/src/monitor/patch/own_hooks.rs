//! Our own exported memory hooks' first bytes: a patcher that overwrites every loaded
//! definition of a memory function (not only libc's) takes ours too, which the patch check
//! must notice like an overwrite of a jump in libc.

use super::*;
use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Our own exported memory hooks: (entry, first 16 bytes as two words, name). A patcher
/// that overwrites every loaded definition of munmap (not only libc's) takes ours too.
pub(super) const HOOKS: usize = 16;
pub(super) static HOOK_AT: [AtomicUsize; HOOKS] = [const { AtomicUsize::new(0) }; HOOKS];
pub(super) static HOOK_BYTES: [[AtomicUsize; 2]; HOOKS] =
    [const { [const { AtomicUsize::new(0) }; 2] }; HOOKS];
pub(super) static HOOK_NAME: [AtomicUsize; HOOKS] = [const { AtomicUsize::new(0) }; HOOKS];

pub(super) fn read16(at: usize) -> [usize; 2] {
    // SAFETY: code of our own library, never unloaded while hooks exist.
    unsafe {
        [
            std::ptr::read_volatile(at as *const usize),
            std::ptr::read_volatile((at + 8) as *const usize),
        ]
    }
}

/// Remember the first bytes of one of our exported hooks (constructor).
pub fn watch_hook(name: &'static CStr, at: usize) {
    for i in 0..HOOKS {
        if HOOK_AT[i].compare_exchange(0, at, Relaxed, Relaxed).is_ok() {
            let b = read16(at);
            HOOK_BYTES[i][0].store(b[0], Relaxed);
            HOOK_BYTES[i][1].store(b[1], Relaxed);
            HOOK_NAME[i].store(name.as_ptr() as usize, Relaxed);
            widen(HOOK_SPAN, at, at + 16);
            return;
        }
    }
}
/// One of our exported hooks that held another patcher's jump already when the constructor
/// looked: it patched the first definition it found, ours (UCX's bistro takes
/// `dlsym(RTLD_DEFAULT)` when `dlsym(RTLD_NEXT)` from libucm finds nothing, libucm being
/// last in the search order, or when libucm is preloaded before us).
pub fn hook_taken_before_start() -> Option<&'static CStr> {
    for i in 0..HOOKS {
        if HOOK_AT[i].load(Relaxed) == 0 {
            break;
        }
        let mut code = [0u8; 16];
        code[..8].copy_from_slice(&HOOK_BYTES[i][0].load(Relaxed).to_le_bytes());
        code[8..].copy_from_slice(&HOOK_BYTES[i][1].load(Relaxed).to_le_bytes());
        if foreign_jump(HOOK_AT[i].load(Relaxed), &code) {
            // SAFETY: a &'static CStr stored with it.
            return Some(unsafe { CStr::from_ptr(HOOK_NAME[i].load(Relaxed) as *const _) });
        }
    }
    None
}

/// Whether `code` (16 bytes at `at`) starts with another patcher's jump we know.
#[cfg(target_arch = "x86_64")]
fn foreign_jump(at: usize, code: &[u8; 16]) -> bool {
    foreign_target(at, code).is_some()
}

#[cfg(target_arch = "aarch64")]
fn foreign_jump(at: usize, code: &[u8; 16]) -> bool {
    let words: [u32; 4] = std::array::from_fn(|k| {
        u32::from_le_bytes([
            code[4 * k],
            code[4 * k + 1],
            code[4 * k + 2],
            code[4 * k + 3],
        ])
    });
    aarch64::foreign_target(at, &words).is_some()
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn foreign_jump(_: usize, _: &[u8; 16]) -> bool {
    false
}
