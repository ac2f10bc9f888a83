//! The real libibverbs functions behind our hooks.
//!
//! Looked up with `dlvsym(RTLD_NEXT, name, version)` at first use (never in the
//! constructor: a failed lookup allocates, in a process without libibverbs); when RTLD_NEXT misses (libibverbs loaded RTLD_LOCAL by
//! a plugin, as NCCL and some MPIs do) through `dlopen("libibverbs.so.1", RTLD_NOLOAD)`,
//! which never loads it (`sys::symbol` looks them up).
//!
//! Layer: verbs (docs/design/overview.md); the lookup itself is `sys::symbol`.

use crate::ffi::{IbvContext, IbvMr, IbvPd};
use crate::sys::symbol::Symbol;
use std::ffi::{c_int, c_void};

// The libibverbs functions, each with its IBVERBS_1.x prototype (verbs.h).
type RegMrIova2 = unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, u64, u32) -> *mut IbvMr;
type ReregMr =
    unsafe extern "C" fn(*mut IbvMr, c_int, *mut IbvPd, *mut c_void, usize, c_int) -> c_int;
type RegDmabufMr = unsafe extern "C" fn(*mut IbvPd, u64, usize, u64, c_int, c_int) -> *mut IbvMr;
pub type RangeFn = unsafe extern "C" fn(*mut c_void, usize) -> c_int;

// SAFETY (each): the type is the prototype of that symbol version in verbs.h.
pub static REG_MR_IOVA2: Symbol<RegMrIova2> =
    unsafe { Symbol::verbs(c"ibv_reg_mr_iova2", c"IBVERBS_1.8") };
pub static DEREG_MR: Symbol<unsafe extern "C" fn(*mut IbvMr) -> c_int> =
    unsafe { Symbol::verbs(c"ibv_dereg_mr", c"IBVERBS_1.1") };
pub static REREG_MR: Symbol<ReregMr> = unsafe { Symbol::verbs(c"ibv_rereg_mr", c"IBVERBS_1.1") };
pub static REG_DMABUF_MR: Symbol<RegDmabufMr> =
    unsafe { Symbol::verbs(c"ibv_reg_dmabuf_mr", c"IBVERBS_1.12") };
pub static DEALLOC_PD: Symbol<unsafe extern "C" fn(*mut IbvPd) -> c_int> =
    unsafe { Symbol::verbs(c"ibv_dealloc_pd", c"IBVERBS_1.1") };
pub static CLOSE_DEVICE: Symbol<unsafe extern "C" fn(*mut IbvContext) -> c_int> =
    unsafe { Symbol::verbs(c"ibv_close_device", c"IBVERBS_1.1") };
pub static FORK_INIT: Symbol<unsafe extern "C" fn() -> c_int> =
    unsafe { Symbol::verbs(c"ibv_fork_init", c"IBVERBS_1.1") };
pub static IS_FORK_INITIALIZED: Symbol<unsafe extern "C" fn() -> c_int> =
    unsafe { Symbol::verbs(c"ibv_is_fork_initialized", c"IBVERBS_1.13") };
pub static DONTFORK_RANGE: Symbol<RangeFn> =
    unsafe { Symbol::verbs(c"ibv_dontfork_range", c"IBVERBS_1.1") };
pub static DOFORK_RANGE: Symbol<RangeFn> =
    unsafe { Symbol::verbs(c"ibv_dofork_range", c"IBVERBS_1.1") };

pub use crate::sys::set_errno;

// The calls below: the real function, or the error libibverbs' absence gives.

pub fn reg_mr_iova2(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut IbvMr {
    let Some(f) = REG_MR_IOVA2.get() else {
        set_errno(libc::ENOSYS);
        return std::ptr::null_mut();
    };
    // SAFETY: ibv_reg_mr_iova2@IBVERBS_1.8 with the app's arguments.
    unsafe { f(pd, addr, len, iova, access) }
}

pub fn dereg_mr(mr: *mut IbvMr) -> i32 {
    let Some(f) = DEREG_MR.get() else {
        return libc::ENOSYS;
    };
    // SAFETY: ibv_dereg_mr@IBVERBS_1.1 with the app's argument.
    unsafe { f(mr) }
}

pub fn rereg_mr(
    mr: *mut IbvMr,
    flags: i32,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: i32,
) -> i32 {
    let Some(f) = REREG_MR.get() else {
        return crate::ffi::IBV_REREG_MR_ERR_INPUT;
    };
    // SAFETY: ibv_rereg_mr@IBVERBS_1.1 with the app's arguments.
    unsafe { f(mr, flags, pd, addr, len, access) }
}

pub fn reg_dmabuf_mr(
    pd: *mut IbvPd,
    offset: u64,
    len: usize,
    iova: u64,
    fd: i32,
    access: i32,
) -> *mut IbvMr {
    let Some(f) = REG_DMABUF_MR.get() else {
        set_errno(libc::ENOSYS);
        return std::ptr::null_mut();
    };
    // SAFETY: ibv_reg_dmabuf_mr@IBVERBS_1.12 with the app's arguments.
    unsafe { f(pd, offset, len, iova, fd, access) }
}

pub fn dealloc_pd(pd: *mut IbvPd) -> i32 {
    let Some(f) = DEALLOC_PD.get() else {
        return libc::ENOSYS;
    };
    // SAFETY: ibv_dealloc_pd@IBVERBS_1.1 with the app's argument.
    unsafe { f(pd) }
}

pub fn close_device(ctx: *mut IbvContext) -> i32 {
    let Some(f) = CLOSE_DEVICE.get() else {
        return libc::ENOSYS;
    };
    // SAFETY: ibv_close_device@IBVERBS_1.1 with the app's argument.
    unsafe { f(ctx) }
}

pub fn fork_init() -> i32 {
    let Some(f) = FORK_INIT.get() else {
        return libc::ENOSYS;
    };
    // SAFETY: ibv_fork_init@IBVERBS_1.1.
    unsafe { f() }
}
