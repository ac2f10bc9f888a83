//! `dlsym` and `dlvsym`: a program that `dlopen`s libibverbs and looks its functions up
//! through the handle (NCCL does) gets libibverbs' own `ibv_reg_mr`/`ibv_dereg_mr`, which
//! bypass our hooks. libibverbs' `ibv_reg_mr` still reaches our `ibv_reg_mr_iova2` through
//! its PLT, so the cache keeps an MR that the program's `ibv_dereg_mr` pointer then
//! deregisters behind its back: the next hit hands out a freed MR. These hooks hand out our
//! hook wherever the lookup would have returned the libibverbs function it replaces.
//!
//! Every other lookup keeps the loader's own semantics. `dlsym(RTLD_NEXT, ..)` resolves
//! relative to the object that called it (glibc reads its return address), so the exported
//! entry points (`abi::dlsym`) are a few instructions of assembly that ask `route_*` what to do and, for
//! any name we do not hook (and for our own lookups), *jump* to libc's function with the
//! caller's return address still on the stack: to the loader it is the caller's call.
//!
//! libc's `dlsym`/`dlvsym` are found without calling `dlsym` (which would be us): in
//! libc.so.6's dynamic symbol table, through its GNU hash table, libc itself found in the
//! loader's list (`_r_debug`). No allocation, no lock of ours: memory hooks call `dlsym`
//! lazily from inside allocators. And no call a sanitizer intercepts before our
//! constructor: a sanitizer's runtime calls `dlsym` while setting up its interceptors,
//! whose pointers to the real functions are NULL until then (docs/design/monitor.md, "Sanitizer
//! builds").

use crate::sys::elf::{self, iterate_phdr, own_symbol, slot, span};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_DLVSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
/// The span of libmrcache.so's own segments (0, 0 until known): lookups made from inside it
/// are ours (`sys::symbol`, `monitor::memory`, std) and always go to libc untouched.
static SELF_LO: AtomicUsize = AtomicUsize::new(0);
static SELF_HI: AtomicUsize = AtomicUsize::new(0);

fn real_dlsym() -> Option<DlsymFn> {
    let p = slot(&REAL_DLSYM, c"dlsym")?;
    // SAFETY: libc's dlsym has this prototype.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

fn real_dlvsym() -> Option<DlvsymFn> {
    let p = slot(&REAL_DLVSYM, c"dlvsym")?;
    // SAFETY: libc's dlvsym has this prototype.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlvsymFn>(p) })
}

/// One verbs function we export, as `dlsym` of it from libibverbs would name it.
pub struct Hooked {
    pub name: &'static CStr,
    pub version: &'static CStr,
    pub hook: fn() -> usize,
}

/// Called by the `dlsym` entry point: the address to jump to with the caller's arguments
/// (libc's `dlsym`), or 0 with the answer stored in `*out`.
/// `hooks`: the verbs hooks the library exports (`abi::HOOKED`).
pub fn route_dlsym(
    handle: *mut c_void,
    name: *const c_char,
    caller: usize,
    out: *mut *mut c_void,
    hooks: &'static [Hooked],
) -> usize {
    let Some(real) = real_dlsym() else {
        // SAFETY: out points to the entry point's stack slot.
        unsafe { *out = std::ptr::null_mut() };
        return 0;
    };
    let hooked = match hooked(name, None, hooks) {
        Some(h) if !from_us(caller) => h,
        None if !from_us(caller) => return memory_entry(handle, name, caller, real, out),
        _ => return real as usize,
    };
    let found = if handle == libc::RTLD_NEXT {
        // SAFETY: h is a live handle; name is the caller's NUL-terminated string.
        match next_hook(caller, hooked, |h| unsafe { real(h, name) }) {
            Some(ours) => {
                // SAFETY: out points to the entry point's stack slot.
                unsafe { *out = ours };
                return 0;
            }
            None => return real as usize,
        }
    } else {
        // SAFETY: the caller's own lookup, made from here: a handle or RTLD_DEFAULT
        // answers the same for every caller in the base namespace (see docs/nccl.md).
        unsafe { real(handle, name) }
    };
    // SAFETY: out points to the entry point's stack slot.
    unsafe { *out = substitute(found, hooked) };
    0
}

/// A lookup of one of libc's memory functions that our patch monitor took: libc's entry
/// where the loader's answer would be our own hook (`patch::libc_entry_instead`). Returns
/// as `route_dlsym` does; any other lookup goes to libc's `dlsym` untouched.
fn memory_entry(
    handle: *mut c_void,
    name: *const c_char,
    caller: usize,
    real: DlsymFn,
    out: *mut *mut c_void,
) -> usize {
    if name.is_null() {
        return real as usize;
    }
    // SAFETY: dlsym's name argument is a NUL-terminated string.
    let wanted = unsafe { CStr::from_ptr(name) };
    let Some(target) = crate::monitor::patch::PatchTarget::ALL
        .into_iter()
        .find(|t| t.name() == wanted)
    else {
        return real as usize;
    };
    // The answer may be libc's entry, which must lead to our hook: patch libc now (also
    // before our constructor, when another library's constructor asks).
    crate::monitor::load::patch_libc();
    let found = if handle == libc::RTLD_NEXT {
        // Only the program and the libraries preloaded before ours find ours next.
        match own_symbol(target.name()) {
            Some(ours) if crate::monitor::search::ours_comes_next(caller, target.name(), ours) => {
                // Answered without libc's dlsym, whose success would clear an error a
                // failed lookup left for dlerror(): one lookup that succeeds (ours) does.
                // SAFETY: libc's dlsym with a pseudo-handle and the caller's name.
                unsafe { real(libc::RTLD_DEFAULT, name) };
                ours
            }
            _ => return real as usize,
        }
    } else {
        // SAFETY: libc's dlsym with the caller's handle and name; a handle or RTLD_DEFAULT
        // answers the same for every caller in the base namespace (as in route_dlsym).
        unsafe { real(handle, name) as usize }
    };
    let next = crate::monitor::forward::next_definition(wanted);
    let answer = match crate::monitor::patch::libc_entry_instead(target, found) {
        // Another interposer comes after ours: without us, this answer would have led to it.
        Some(_) if !next.is_null() => next as usize,
        Some(entry) => entry,
        None if handle == libc::RTLD_NEXT => return real as usize,
        None => found,
    };
    // SAFETY: out points to the entry point's stack slot.
    unsafe { *out = answer as *mut c_void };
    0
}

/// As `route_dlsym`, for `dlvsym`: only the exact version we export is replaced (a lookup
/// of `ibv_reg_mr@IBVERBS_1.0`, the old ABI, stays libibverbs').
pub fn route_dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
    caller: usize,
    out: *mut *mut c_void,
    hooks: &'static [Hooked],
) -> usize {
    let Some(real) = real_dlvsym() else {
        // SAFETY: out points to the entry point's stack slot.
        unsafe { *out = std::ptr::null_mut() };
        return 0;
    };
    let hooked = match hooked(name, Some(version), hooks) {
        Some(h) if !from_us(caller) => h,
        _ => return real as usize,
    };
    let found = if handle == libc::RTLD_NEXT {
        // SAFETY: h is a live handle; name and version are the caller's strings.
        match next_hook(caller, hooked, |h| unsafe { real(h, name, version) }) {
            Some(ours) => {
                // SAFETY: out points to the entry point's stack slot.
                unsafe { *out = ours };
                return 0;
            }
            None => return real as usize,
        }
    } else {
        // SAFETY: as in route_dlsym.
        unsafe { real(handle, name, version) }
    };
    // SAFETY: out points to the entry point's stack slot.
    unsafe { *out = substitute(found, hooked) };
    0
}

/// The verbs hook exported under `name` (and `version`, when given), if any.
fn hooked(
    name: *const c_char,
    version: Option<*const c_char>,
    hooks: &'static [Hooked],
) -> Option<&'static Hooked> {
    if name.is_null() {
        return None;
    }
    // SAFETY: dlsym's name argument is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) };
    if !name.to_bytes().starts_with(b"ibv_") {
        return None;
    }
    let version = match version {
        Some(v) if v.is_null() => return None,
        // SAFETY: dlvsym's version argument is a NUL-terminated string.
        Some(v) => Some(unsafe { CStr::from_ptr(v) }),
        None => None,
    };
    hooks
        .iter()
        .find(|h| h.name == name && version.is_none_or(|v| v == h.version))
}

/// `found` if it is not libibverbs' definition of `hooked`, else our hook.
fn substitute(found: *mut c_void, hooked: &Hooked) -> *mut c_void {
    if found.is_null() {
        return found;
    }
    let Some(real) = real_dlvsym() else {
        return found;
    };
    // SAFETY: Dl_info is four pointers, for which all zeroes are valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables; info is written on success.
    if unsafe { libc::dladdr(found, &mut info) } == 0 || info.dli_fname.is_null() {
        return found;
    }
    // SAFETY: dli_fname is the object's NUL-terminated path.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    let base = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    if !base.starts_with(b"libibverbs.so") {
        return found;
    }
    // The object is libibverbs: is `found` the very version our hook implements?
    // SAFETY: RTLD_NOLOAD returns a handle to the already-loaded object (or NULL).
    let h = unsafe { libc::dlopen(info.dli_fname, libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if h.is_null() {
        return found;
    }
    // SAFETY: h is live; the real dlclose drops only the reference NOLOAD added (ours would
    // report libibverbs' span as unmapped).
    let same = unsafe {
        let ours = real(h, hooked.name.as_ptr(), hooked.version.as_ptr());
        if let Some(close) = crate::sys::symbol::DLCLOSE.get() {
            close(h);
        }
        ours == found
    };
    if same {
        // The front's entry point (the same one the program's own calls reach).
        own_symbol(hooked.name).unwrap_or_else(|| (hooked.hook)()) as *mut c_void
    } else {
        found
    }
}

/// For `RTLD_NEXT`, which glibc resolves relative to the object containing the return
/// address: our hook if glibc's answer for `caller` would be libibverbs' definition of
/// `hooked`, else None (the caller then gets glibc's own answer). A lookup made from
/// libmrcache.so instead would start after us: it could return the caller's own definition
/// (a wrapper calling it recurses forever) or miss the libibverbs a `RTLD_LOCAL` plugin
/// brought. Approximates glibc's search: objects loaded after the caller's, in load order,
/// the first that defines the name itself, if that is a libibverbs in the global scope or
/// among the caller's own dependencies; if none does, the caller's own dependencies.
fn next_hook(
    caller: usize,
    hooked: &Hooked,
    lookup: impl Fn(*mut c_void) -> *mut c_void,
) -> Option<*mut c_void> {
    let close = crate::sys::symbol::DLCLOSE.get()?;
    // SAFETY: (closure) path is NULL (the program) or a NUL-terminated name; RTLD_NOLOAD
    // loads nothing (an object unloaded since the walk just gives NULL) and the real
    // dlclose drops only the reference it added (ours would report the object's span as
    // unmapped).
    let with_handle = |path: *const c_char, f: &dyn Fn(*mut c_void) -> *mut c_void| unsafe {
        let h = libc::dlopen(path, libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        if h.is_null() {
            return std::ptr::null_mut();
        }
        let found = f(h);
        close(h);
        found
    };
    let mut after = After {
        caller,
        caller_path: std::ptr::null(),
        caller_span: (0, 0),
        seen: false,
        index: 0,
        named: 0,
        span: None,
        path: [0; PATH_MAX],
    };
    let (found, lo, hi) = loop {
        (after.seen, after.named, after.span) = (false, 0, None);
        // SAFETY: visit_after matches dl_iterate_phdr's callback type and only reads what
        // it is given.
        unsafe { iterate_phdr(visit_after, &mut after as *mut After as *mut c_void) };
        let Some((lo, hi)) = after.span else {
            // Nothing loaded after the caller defines it. A plugin dlopen'd RTLD_LOCAL
            // searches its own dependencies, which may have been loaded before it (a
            // libibverbs the program links): what its handle finds beyond itself.
            if after.caller_path.is_null() {
                return None;
            }
            let found = with_handle(after.caller_path, &lookup);
            let (lo, hi) = after.caller_span;
            if found.is_null() || (lo..hi).contains(&(found as usize)) {
                return None;
            }
            let ours = substitute(found, hooked);
            return (ours != found).then_some(ours);
        };
        after.index += 1;
        if after.path[0] == 0 {
            continue;
        }
        let found = with_handle(after.path.as_ptr(), &lookup);
        // A definition outside the object comes from one of its dependencies.
        if (lo..hi).contains(&(found as usize)) {
            break (found, lo, hi);
        }
    };
    let ours = substitute(found, hooked);
    if ours == found {
        return None;
    }
    // Is that libibverbs in the caller's search scope? (One loaded RTLD_LOCAL by someone
    // else is not.) Any function of its that we do not hook tells where it is found.
    let real = real_dlsym()?;
    let probe = c"ibv_get_device_list".as_ptr();
    // SAFETY: libc's dlsym with a valid name.
    let global = unsafe { real(libc::RTLD_DEFAULT, probe) };
    // SAFETY: h is a live handle.
    let own = with_handle(after.caller_path, &|h| unsafe { real(h, probe) });
    [global, own]
        .iter()
        .any(|&p| (lo..hi).contains(&(p as usize)))
        .then_some(ours)
}

const PATH_MAX: usize = libc::PATH_MAX as usize;

/// One step of the walk: the `index`-th named object loaded after the caller's.
struct After {
    caller: usize,
    /// The caller's object's name (NULL for the program: dlopen(NULL) is its handle). Its
    /// code is running, so it stays loaded.
    caller_path: *const c_char,
    caller_span: (usize, usize),
    seen: bool,
    index: usize,
    named: usize,
    /// That object's span (None: there is none), and its name, copied: the loader frees
    /// it if another thread unloads the object before we open it.
    span: Option<(usize, usize)>,
    path: [c_char; PATH_MAX],
}

unsafe extern "C" fn visit_after(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: data is the &mut After passed to dl_iterate_phdr; info is the loader's
    // description of one loaded object, valid during the call.
    let (after, info) = unsafe { (&mut *(data as *mut After), &*info) };
    // SAFETY: as in visit.
    let (lo, hi) = unsafe { span(info) };
    // The main program and the vDSO have no name to open them by.
    // SAFETY: dlpi_name is NULL or a NUL-terminated path.
    let name = (!info.dlpi_name.is_null())
        .then(|| unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes_with_nul())
        .filter(|n| n.len() > 1);
    if !after.seen {
        after.seen = (lo..hi).contains(&after.caller);
        if after.seen && name.is_some() {
            after.caller_path = info.dlpi_name;
            after.caller_span = (lo, hi);
        }
        return 0;
    }
    let Some(name) = name else { return 0 };
    after.named += 1;
    if after.named <= after.index {
        return 0;
    }
    // A name too long to copy is skipped (empty).
    after.path[0] = 0;
    if name.len() <= PATH_MAX {
        for (d, &c) in after.path.iter_mut().zip(name) {
            *d = c as c_char;
        }
    }
    after.span = Some((lo, hi));
    1
}

fn from_us(caller: usize) -> bool {
    let (lo, hi) = self_span();
    caller >= lo && caller < hi
}

fn self_span() -> (usize, usize) {
    let hi = SELF_HI.load(Acquire);
    if hi != 0 {
        return (SELF_LO.load(Relaxed), hi);
    }
    let (lo, hi) = elf::own_span();
    if hi != 0 {
        SELF_LO.store(lo, Relaxed);
        SELF_HI.store(hi, Release);
    }
    (lo, hi)
}
