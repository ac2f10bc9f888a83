//! The engine's `dlsym` and `dlvsym` entry points (the front's jump to them): a few instructions of assembly that ask
//! `monitor::dlsym` what to do (handing it the verbs hooks we export) and either return its
//! answer or jump to libc's function with the caller's return address still on the stack.

use crate::monitor::dlsym;
use std::ffi::{c_char, c_void};

/// Called by the `dlsym` entry point: the address to jump to with the caller's arguments
/// (libc's `dlsym`), or 0 with the answer stored in `*out`.
extern "C" fn route_dlsym(
    handle: *mut c_void,
    name: *const c_char,
    caller: usize,
    out: *mut *mut c_void,
) -> usize {
    dlsym::route_dlsym(handle, name, caller, out, &super::HOOKED)
}

/// As `route_dlsym`, for `dlvsym`.
extern "C" fn route_dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
    caller: usize,
    out: *mut *mut c_void,
) -> usize {
    dlsym::route_dlvsym(handle, name, version, caller, out, &super::HOOKED)
}

unsafe extern "C" {
    fn mrcache_engine_dlsym();
    fn mrcache_engine_dlvsym();
}

/// The `dlsym` and `dlvsym` entry points, for the front's slots.
pub fn entries() -> (usize, usize) {
    (
        mrcache_engine_dlsym as *const () as usize,
        mrcache_engine_dlvsym as *const () as usize,
    )
}

// The entry points (the front's `dlsym`/`dlvsym` jump here). On entry the caller's return address is at [rsp]; the
// arguments are saved around the call to route_* and restored for the jump, so libc's
// function sees exactly the caller's call. Stack: entry rsp = 8 mod 16; pushes and the
// out slot keep the call to route_* 16-byte aligned.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".globl mrcache_engine_dlsym",
    ".hidden mrcache_engine_dlsym",
    ".type mrcache_engine_dlsym, @function",
    "mrcache_engine_dlsym:",
    "push rdi",
    "push rsi",
    "sub rsp, 24",
    "mov rdx, qword ptr [rsp + 40]",
    "mov rcx, rsp",
    "call {route_dlsym}",
    "mov r11, rax",
    "mov rax, qword ptr [rsp]",
    "add rsp, 24",
    "pop rsi",
    "pop rdi",
    "test r11, r11",
    "jz 2f",
    "jmp r11",
    "2:",
    "ret",
    ".size mrcache_engine_dlsym, . - mrcache_engine_dlsym",
    "",
    ".globl mrcache_engine_dlvsym",
    ".hidden mrcache_engine_dlvsym",
    ".type mrcache_engine_dlvsym, @function",
    "mrcache_engine_dlvsym:",
    "push rdi",
    "push rsi",
    "push rdx",
    "sub rsp, 16",
    "mov rcx, qword ptr [rsp + 40]",
    "mov r8, rsp",
    "call {route_dlvsym}",
    "mov r11, rax",
    "mov rax, qword ptr [rsp]",
    "add rsp, 16",
    "pop rdx",
    "pop rsi",
    "pop rdi",
    "test r11, r11",
    "jz 2f",
    "jmp r11",
    "2:",
    "ret",
    ".size mrcache_engine_dlvsym, . - mrcache_engine_dlvsym",
    route_dlsym = sym route_dlsym,
    route_dlvsym = sym route_dlvsym,
);
#[cfg(target_arch = "aarch64")]
#[path = "dlsym_aarch64.rs"]
mod aarch64;
