//! The real libibverbs functions behind our hooks.
//!
//! Looked up with `dlvsym(RTLD_NEXT, name, version)` in the constructor when libibverbs is
//! already loaded, else on first use; when RTLD_NEXT misses (libibverbs loaded RTLD_LOCAL by
//! a plugin, as NCCL and some MPIs do) through `dlopen("libibverbs.so.1", RTLD_NOLOAD)`,
//! which never loads it. Slots are plain atomics: racing lookups store the same value, and
//! nothing here can block or re-enter (no `Once`).

use crate::ffi::{IbvContext, IbvMr, IbvPd};
use std::ffi::{CStr, c_int, c_void};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, Ordering};

/// Where a symbol is looked up.
#[derive(Clone, Copy)]
enum Scope {
    /// libibverbs, under this symbol version: `dlvsym(RTLD_NEXT)`, else through a
    /// `RTLD_NOLOAD` handle (libibverbs loaded `RTLD_LOCAL`).
    Verbs(&'static CStr),
    /// The next definition after ours: `dlsym(RTLD_NEXT)`.
    Next,
}

/// A real function, stored with its type `F` (an `unsafe extern "C" fn`): looked up at the
/// first `get` (or stored by the constructor), then one atomic load.
pub struct Symbol<F> {
    name: &'static CStr,
    scope: Scope,
    slot: AtomicPtr<c_void>,
    _type: PhantomData<F>,
}

impl<F: Copy> Symbol<F> {
    /// # Safety
    /// `F` must be the C prototype of `name@version` (verbs.h).
    pub const unsafe fn verbs(name: &'static CStr, version: &'static CStr) -> Self {
        Symbol {
            name,
            scope: Scope::Verbs(version),
            slot: AtomicPtr::new(std::ptr::null_mut()),
            _type: PhantomData,
        }
    }

    /// # Safety
    /// `F` must be the C prototype of `name` in the library after ours (libc's).
    pub const unsafe fn next(name: &'static CStr) -> Self {
        Symbol {
            name,
            scope: Scope::Next,
            slot: AtomicPtr::new(std::ptr::null_mut()),
            _type: PhantomData,
        }
    }

    /// The real function, or None when it is not in the process.
    pub fn get(&self) -> Option<F> {
        let mut p = self.slot.load(Ordering::Acquire);
        if p.is_null() {
            p = match self.scope {
                Scope::Verbs(version) => lookup_verbs(self.name, version),
                Scope::Next => address(libc::RTLD_NEXT, self.name),
            };
            if p.is_null() {
                return None;
            }
            self.slot.store(p, Ordering::Release);
        }
        const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
        // SAFETY: F is a function pointer type (same size, checked above) with the symbol's
        // prototype (the constructor's contract); p is that function's address.
        Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }

    /// The symbol's name.
    pub fn name(&self) -> &'static CStr {
        self.name
    }

    /// Where it is, without looking it up.
    pub fn address(&self) -> *mut c_void {
        self.slot.load(Ordering::Acquire)
    }

    /// Use the function at `p`.
    pub fn store(&self, p: *mut c_void) {
        self.slot.store(p, Ordering::Release);
    }

    /// Use the definition in `handle` (the constructor: libc's own, by its handle).
    pub fn resolve_in(&self, handle: *mut c_void) {
        self.slot
            .store(address(handle, self.name), Ordering::Release);
    }

    /// Look it up now (the constructor), where it is not yet.
    pub fn resolve(&self) {
        let _ = self.get();
    }
}

/// `dlsym(handle, name)`: the one place a symbol's address is looked up (a variable's, or a
/// function's to compare). libc's handle (`load::LIBC`, its link_map) is answered from
/// libc's own symbol table: libc's `dlsym` cannot take it, and the table needs no call.
pub fn address(handle: *mut c_void, name: &CStr) -> *mut c_void {
    if !handle.is_null() && handle == crate::dlsym::libc_handle() {
        return crate::dlsym::libc_symbol(name);
    }
    // SAFETY: dlsym with a valid handle (or pseudo-handle) and a NUL-terminated name.
    unsafe { libc::dlsym(handle, name.as_ptr()) }
}

/// The function `name` in `handle`, typed.
///
/// # Safety
/// `F` must be a function pointer type with `name`'s C prototype.
pub unsafe fn function<F: Copy>(handle: *mut c_void, name: &CStr) -> Option<F> {
    const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
    let p = address(handle, name);
    // SAFETY: the caller's contract; p is non-null.
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

fn lookup_verbs(name: &CStr, version: &CStr) -> *mut c_void {
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

// libc's functions under our hooks (the next definition after ours, or libc's own).
// SAFETY (each): glibc's prototype.
pub static REALLOC: Symbol<unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void> =
    unsafe { Symbol::next(c"realloc") };
pub static FORK: Symbol<unsafe extern "C" fn() -> libc::pid_t> = unsafe { Symbol::next(c"_Fork") };
pub static DLCLOSE: Symbol<unsafe extern "C" fn(*mut c_void) -> c_int> =
    unsafe { Symbol::next(c"dlclose") };

/// Resolve what is already loaded (called from the constructor; never loads libibverbs).
pub fn resolve_loaded() {
    REG_MR_IOVA2.resolve();
    DEREG_MR.resolve();
    REREG_MR.resolve();
    REG_DMABUF_MR.resolve();
    DEALLOC_PD.resolve();
    CLOSE_DEVICE.resolve();
    FORK_INIT.resolve();
}

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
