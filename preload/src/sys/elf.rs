//! The loader's view for the engine: the front's own symbols and the engine's span, the
//! walks of `link_map` made for the front, a walk of the loaded objects through libc's own
//! `dl_iterate_phdr`.
//!
//! It runs inside `dlsym` while a sanitizer's runtime looks up what
//! it intercepts (its interceptors of dl_iterate_phdr, dlopen, malloc or pthread_* call
//! through NULL until then), and inside allocators: it calls no function but libc's own
//! dl_iterate_phdr (by its address, past any interceptor) and strlen/memcmp, which the
//! sanitizers' interceptors serve themselves before their set-up.

use super::link_map::{self, Dyn, lookup_gnu_hash, maps};
pub use super::link_map::{first_definition, libc_handle, libc_symbol, slot};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::AtomicPtr;

/// The span of an object's loadable segments.
///
/// # Safety
/// `info` must be the loader's description of a loaded object.
pub unsafe fn span(info: &libc::dl_phdr_info) -> (usize, usize) {
    let base = info.dlpi_addr as usize;
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let (mut lo, mut hi) = (usize::MAX, 0usize);
    for ph in phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD) {
        let start = base.wrapping_add(ph.p_vaddr as usize);
        lo = lo.min(start);
        hi = hi.max(start.saturating_add(ph.p_memsz as usize));
    }
    (lo, hi)
}

/// The objects loaded at start-up, and whether the walks answer for the front: the front
/// (`sys::front`) once it attached the engine, else this library itself.
pub fn walks_answer() -> bool {
    link_map::walks_answer(Own::get().base)
}

/// The definition of `name` that follows the front among the objects loaded at start-up:
/// what `dlsym(RTLD_NEXT, name)` called from the front answers (`link_map::next_after`: no
/// lock, no allocation, no call into libc: safe inside allocators, signal handlers and a
/// sanitizer's set-up, so the hooks look their next definition up at their first call).
/// Where the front was not preloaded (`walks_answer` says so) it is libc's `dlsym` called
/// from the front, which the engine's start asked already for every name the hooks use.
/// Null when none is found.
pub fn next_after_own(name: &CStr) -> *mut c_void {
    if !walks_answer() {
        return dlsym_next(name);
    }
    link_map::next_after(Own::get().base, name)
}

/// libc's `dlsym(RTLD_NEXT, name)`, called from the front's code (from ours before the
/// front attached us).
fn dlsym_next(name: &CStr) -> *mut c_void {
    let dlsym = libc_symbol(c"dlsym");
    if dlsym.is_null() {
        return dlsym;
    }
    if let Some(p) = super::front::call(dlsym as usize, usize::MAX, name.as_ptr() as usize, 0) {
        return p as *mut c_void;
    }
    type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
    // SAFETY: libc's dlsym, of this prototype, called from here.
    unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(dlsym)(libc::RTLD_NEXT, name.as_ptr()) }
}

/// An object's span, load base and dynamic section: the front's (its entry points are
/// what the program calls and what the watch watches; the walks start after it), or this
/// library's own (`engine`).
struct Own {
    lo: usize,
    hi: usize,
    base: usize,
    dynamic: *const Dyn,
}

/// The span of the engine's own loadable segments ((0, 0) when unknown): lookups made from
/// there are ours.
pub fn own_span() -> (usize, usize) {
    let own = Own::engine();
    (own.lo, own.hi)
}

unsafe extern "C" {
    /// The linker's symbol for our own ELF header, at the start of our first segment.
    static __ehdr_start: libc::Elf64_Ehdr;
}

impl Own {
    /// The front, once it attached the engine; before that (unit tests) the engine.
    fn get() -> Own {
        match super::front::attached() {
            Some(f) => Own {
                lo: f.lo,
                hi: f.hi,
                base: f.base,
                dynamic: f.dynamic as *const Dyn,
            },
            None => Own::engine(),
        }
    }

    fn engine() -> Own {
        let ehdr = &raw const __ehdr_start;
        // SAFETY: our own ELF header and program headers, mapped in our first segment.
        let phdrs = unsafe {
            let e = &*ehdr;
            std::slice::from_raw_parts(
                (ehdr as usize + e.e_phoff as usize) as *const libc::Elf64_Phdr,
                e.e_phnum as usize,
            )
        };
        // The header is where the segment that maps file offset 0 was put.
        let base = phdrs
            .iter()
            .find(|p| p.p_type == libc::PT_LOAD && p.p_offset == 0)
            .map_or(0, |p| (ehdr as usize).wrapping_sub(p.p_vaddr as usize));
        let (mut lo, mut hi) = (usize::MAX, 0usize);
        for ph in phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD) {
            let start = base.wrapping_add(ph.p_vaddr as usize);
            lo = lo.min(start);
            hi = hi.max(start.saturating_add(ph.p_memsz as usize));
        }
        let dynamic = phdrs
            .iter()
            .find(|p| p.p_type == libc::PT_DYNAMIC)
            .map_or(std::ptr::null(), |p| {
                base.wrapping_add(p.p_vaddr as usize) as *const Dyn
            });
        Own {
            lo: lo.min(hi),
            hi,
            base,
            dynamic,
        }
    }
}

/// Where the front (libmrcache.so) defines `name`, from its dynamic symbol table: not
/// `munmap as usize`, which reads our GOT entry for the exported symbol, and another
/// library may have pointed that entry at its own function (UCX's reloc mode does, before
/// our constructor when its hooks came first). None when not found.
pub fn own_symbol(name: &CStr) -> Option<usize> {
    let own = Own::get();
    if own.dynamic.is_null() {
        return None;
    }
    // SAFETY: own.dynamic is our own mapped dynamic section, ended by DT_NULL.
    let p = unsafe { lookup_gnu_hash(own.base, own.dynamic, name) }.unwrap_or(0);
    (p != 0).then_some(p)
}

/// Call `dl_iterate_phdr` as libc defines it, not through our PLT entry, which a sanitizer
/// runtime interposes: its interceptor calls through a NULL pointer until the runtime has
/// set itself up, and that set-up (lazy, at the first intercepted call, when the runtime is
/// preloaded into a program not built with it) looks up what it intercepts with `dlsym`,
/// ours. libc's own walks the loader's list under the loader's lock and calls nothing
/// interposable. None when libc's is not found (then nothing is walked).
///
/// # Safety
/// `callback` must be a valid `dl_iterate_phdr` callback for `data`.
pub unsafe fn iterate_phdr(
    callback: unsafe extern "C" fn(*mut libc::dl_phdr_info, usize, *mut c_void) -> c_int,
    data: *mut c_void,
) -> Option<c_int> {
    static REAL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let p = slot(&REAL, c"dl_iterate_phdr")?;
    type IterateFn = unsafe extern "C" fn(
        Option<unsafe extern "C" fn(*mut libc::dl_phdr_info, usize, *mut c_void) -> c_int>,
        *mut c_void,
    ) -> c_int;
    // SAFETY: p is libc's dl_iterate_phdr, of this prototype; the callback is the caller's.
    Some(unsafe { std::mem::transmute::<*mut c_void, IterateFn>(p)(Some(callback), data) })
}

/// Whether the object `info` describes defines `name` (None: it has no GNU hash table).
///
/// # Safety
/// `info` must be the loader's description of a loaded object.
pub unsafe fn defines(info: &libc::dl_phdr_info, name: &CStr) -> Option<bool> {
    let base = info.dlpi_addr as usize;
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let dynamic = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC)?;
    let dynamic = base.wrapping_add(dynamic.p_vaddr as usize) as *const Dyn;
    // SAFETY: the object's mapped dynamic section.
    Some(unsafe { lookup_gnu_hash(base, dynamic, name) }? != 0)
}

/// Whether an object in the loader's list defines `name`, read without the loader's lock.
/// Only for a process with no thread but the caller's, where nothing can load or unload an
/// object meanwhile: `dl_iterate_phdr` takes that lock, and in a fork child it may be held
/// for ever by a thread that exists only in the parent.
pub fn defined_in_loaded_objects_alone(name: &CStr) -> bool {
    // SAFETY: each map is one of the loader's, its load base and mapped dynamic section;
    // with no other thread, none is unloaded while it is read.
    maps().any(|m| unsafe { lookup_gnu_hash(m.l_addr, m.l_ld, name) }.is_some_and(|a| a != 0))
}
