//! The real libibverbs functions behind our hooks.
//!
//! Looked up with `dlvsym(RTLD_NEXT, name, version)` in the constructor when libibverbs is
//! already loaded, else on first use; when RTLD_NEXT misses (libibverbs loaded RTLD_LOCAL by
//! a plugin, as NCCL and some MPIs do) through `dlopen("libibverbs.so.1", RTLD_NOLOAD)`,
//! which never loads it. Slots are plain atomics: racing lookups store the same value, and
//! nothing here can block or re-enter (no `Once`).

use crate::ffi::{IbvContext, IbvMr, IbvPd};
use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

pub struct Symbol {
    name: &'static CStr,
    version: &'static CStr,
    slot: AtomicPtr<c_void>,
}

impl Symbol {
    pub const fn new(name: &'static CStr, version: &'static CStr) -> Symbol {
        Symbol {
            name,
            version,
            slot: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The real function's address, or None when libibverbs is not in the process.
    pub fn get(&self) -> Option<*mut c_void> {
        let p = self.slot.load(Ordering::Acquire);
        if !p.is_null() {
            return Some(p);
        }
        let p = lookup(self.name, self.version);
        if p.is_null() {
            return None;
        }
        self.slot.store(p, Ordering::Release);
        Some(p)
    }
}

fn lookup(name: &CStr, version: &CStr) -> *mut c_void {
    // SAFETY: dlvsym with valid NUL-terminated strings; RTLD_NEXT is a valid pseudo-handle.
    let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), version.as_ptr()) };
    if !p.is_null() {
        return p;
    }
    // SAFETY: RTLD_NOLOAD only returns a handle to an already-loaded library (or NULL).
    let h = unsafe {
        libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_NOLOAD | libc::RTLD_LAZY,
        )
    };
    if h.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: h is a live handle; the dlclose only drops the reference NOLOAD added.
    unsafe {
        let p = libc::dlvsym(h, name.as_ptr(), version.as_ptr());
        libc::dlclose(h);
        p
    }
}

pub static REG_MR_IOVA2: Symbol = Symbol::new(c"ibv_reg_mr_iova2", c"IBVERBS_1.8");
pub static DEREG_MR: Symbol = Symbol::new(c"ibv_dereg_mr", c"IBVERBS_1.1");
pub static REREG_MR: Symbol = Symbol::new(c"ibv_rereg_mr", c"IBVERBS_1.1");
pub static REG_DMABUF_MR: Symbol = Symbol::new(c"ibv_reg_dmabuf_mr", c"IBVERBS_1.12");
pub static DEALLOC_PD: Symbol = Symbol::new(c"ibv_dealloc_pd", c"IBVERBS_1.1");
pub static CLOSE_DEVICE: Symbol = Symbol::new(c"ibv_close_device", c"IBVERBS_1.1");
pub static FORK_INIT: Symbol = Symbol::new(c"ibv_fork_init", c"IBVERBS_1.1");
pub static IS_FORK_INITIALIZED: Symbol = Symbol::new(c"ibv_is_fork_initialized", c"IBVERBS_1.13");
pub static DONTFORK_RANGE: Symbol = Symbol::new(c"ibv_dontfork_range", c"IBVERBS_1.1");
pub static DOFORK_RANGE: Symbol = Symbol::new(c"ibv_dofork_range", c"IBVERBS_1.1");

const ALL: [&Symbol; 7] = [
    &REG_MR_IOVA2,
    &DEREG_MR,
    &REREG_MR,
    &REG_DMABUF_MR,
    &DEALLOC_PD,
    &CLOSE_DEVICE,
    &FORK_INIT,
];

/// Resolve what is already loaded (called from the constructor; never loads libibverbs).
pub fn resolve_loaded() {
    for s in ALL {
        let _ = s.get();
    }
}

pub use crate::sys::set_errno;

// The calls below: each transmutes a resolved address to the C prototype libibverbs
// exports under that symbol version (verbs.h, IBVERBS_1.x), then calls it.

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
    // SAFETY: f is ibv_reg_mr_iova2@IBVERBS_1.8 with this prototype; arguments are the app's.
    unsafe {
        let f: unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, u64, u32) -> *mut IbvMr =
            std::mem::transmute(f);
        f(pd, addr, len, iova, access)
    }
}

pub fn dereg_mr(mr: *mut IbvMr) -> i32 {
    let Some(f) = DEREG_MR.get() else {
        return libc::ENOSYS;
    };
    // SAFETY: f is ibv_dereg_mr@IBVERBS_1.1.
    unsafe {
        let f: unsafe extern "C" fn(*mut IbvMr) -> i32 = std::mem::transmute(f);
        f(mr)
    }
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
    // SAFETY: f is ibv_rereg_mr@IBVERBS_1.1.
    unsafe {
        let f: unsafe extern "C" fn(*mut IbvMr, i32, *mut IbvPd, *mut c_void, usize, i32) -> i32 =
            std::mem::transmute(f);
        f(mr, flags, pd, addr, len, access)
    }
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
    // SAFETY: f is ibv_reg_dmabuf_mr@IBVERBS_1.12.
    unsafe {
        let f: unsafe extern "C" fn(*mut IbvPd, u64, usize, u64, i32, i32) -> *mut IbvMr =
            std::mem::transmute(f);
        f(pd, offset, len, iova, fd, access)
    }
}

pub fn dealloc_pd(pd: *mut IbvPd) -> i32 {
    let Some(f) = DEALLOC_PD.get() else {
        return libc::ENOSYS;
    };
    // SAFETY: f is ibv_dealloc_pd@IBVERBS_1.1.
    unsafe {
        let f: unsafe extern "C" fn(*mut IbvPd) -> i32 = std::mem::transmute(f);
        f(pd)
    }
}

pub fn close_device(ctx: *mut IbvContext) -> i32 {
    let Some(f) = CLOSE_DEVICE.get() else {
        return libc::ENOSYS;
    };
    // SAFETY: f is ibv_close_device@IBVERBS_1.1.
    unsafe {
        let f: unsafe extern "C" fn(*mut IbvContext) -> i32 = std::mem::transmute(f);
        f(ctx)
    }
}

pub fn fork_init() -> i32 {
    let Some(f) = FORK_INIT.get() else {
        return libc::ENOSYS;
    };
    // SAFETY: f is ibv_fork_init@IBVERBS_1.1.
    unsafe {
        let f: unsafe extern "C" fn() -> i32 = std::mem::transmute(f);
        f()
    }
}
