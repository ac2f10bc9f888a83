//! A symbol's address, looked up once: `Symbol<F>` (a typed function found at first use:
//! in libibverbs under a symbol version, or the next definition after ours), `address`
//! and `function` (libc's own handle answered from its symbol table, `elf`), and libc's
//! functions under our hooks. Slots are plain atomics: racing lookups store the same
//! value, and nothing here can block or re-enter (no `Once`). And `pin_object_of`: the
//! object holding an address kept loaded for good.

use std::ffi::{CStr, c_int, c_void};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, Ordering};

/// Where a symbol is looked up.
#[derive(Clone, Copy)]
enum Scope {
    /// libibverbs, under this symbol version: `dlvsym(RTLD_NEXT)`, else through a
    /// `RTLD_NOLOAD` handle (libibverbs loaded `RTLD_LOCAL`).
    Verbs(&'static CStr),
    /// The next definition after ours, as `dlsym(RTLD_NEXT)` answers
    /// (`elf::next_after_own`: no lock, no allocation).
    Next,
}

/// A real function, stored with its type `F` (an `unsafe extern "C" fn`): looked up at the
/// first `get` (or stored beforehand), then one atomic load.
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
                Scope::Next => super::elf::next_after_own(self.name),
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
}

/// `dlsym(handle, name)`: the one place a symbol's address is looked up (a variable's, or a
/// function's to compare). libc's handle (`load::LIBC`, its link_map) is answered from
/// libc's own symbol table: libc's `dlsym` cannot take it, and the table needs no call.
pub fn address(handle: *mut c_void, name: &CStr) -> *mut c_void {
    if !handle.is_null() && handle == super::elf::libc_handle() {
        return super::elf::libc_symbol(name);
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
    // libc's dlvsym called from the front: RTLD_NEXT starts after it (after us, before the
    // front attached us).
    let dlvsym = super::elf::libc_symbol(c"dlvsym");
    let p = match super::front::call(
        dlvsym as usize,
        usize::MAX,
        name.as_ptr() as usize,
        version.as_ptr() as usize,
    ) {
        Some(p) if !dlvsym.is_null() => p as *mut c_void,
        // SAFETY: dlvsym with valid NUL-terminated strings; RTLD_NEXT is a valid
        // pseudo-handle.
        _ => unsafe { libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), version.as_ptr()) },
    };
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

// libc's functions under our hooks (the next definition after ours, or libc's own).
// Each type is glibc's prototype.
// SAFETY: glibc's realloc has this prototype.
pub static REALLOC: Symbol<unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void> =
    unsafe { Symbol::next(c"realloc") };
// SAFETY: glibc's _Fork has this prototype.
pub static FORK: Symbol<unsafe extern "C" fn() -> libc::pid_t> = unsafe { Symbol::next(c"_Fork") };
// SAFETY: glibc's dlclose has this prototype.
pub static DLCLOSE: Symbol<unsafe extern "C" fn(*mut c_void) -> c_int> =
    unsafe { Symbol::next(c"dlclose") };

/// Keep the object that holds `addr` (another patcher's hook, which our hooks now call)
/// loaded for good: a program may dlclose it (libfabric's memhooks writes libc's bytes back
/// when its last cache closes), and our jump, not its, is at libc's entry then. UCX pins
/// its own library the same way. Code outside any loaded object cannot be pinned.
pub fn pin_object_of(addr: usize) {
    // SAFETY: Dl_info is plain data, written by dladdr on success.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables.
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return;
    }
    // SAFETY: RTLD_NOLOAD never loads anything; RTLD_NODELETE marks the loaded object as
    // never unloaded. The reference this adds is never dropped, on purpose.
    unsafe {
        libc::dlopen(
            info.dli_fname,
            libc::RTLD_NOLOAD | libc::RTLD_NODELETE | libc::RTLD_LAZY,
        )
    };
}
