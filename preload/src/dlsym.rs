//! `dlsym` and `dlvsym`: a program that `dlopen`s libibverbs and looks its functions up
//! through the handle (NCCL does) gets libibverbs' own `ibv_reg_mr`/`ibv_dereg_mr`, which
//! bypass our hooks. libibverbs' `ibv_reg_mr` still reaches our `ibv_reg_mr_iova2` through
//! its PLT, so the cache keeps an MR that the program's `ibv_dereg_mr` pointer then
//! deregisters behind its back: the next hit hands out a freed MR. These hooks hand out our
//! hook wherever the lookup would have returned the libibverbs function it replaces.
//!
//! Every other lookup keeps the loader's own semantics. `dlsym(RTLD_NEXT, ..)` resolves
//! relative to the object that called it (glibc reads its return address), so the exported
//! entry points are a few instructions of assembly that ask `route_*` what to do and, for
//! any name we do not hook (and for our own lookups), *jump* to libc's function with the
//! caller's return address still on the stack: to the loader it is the caller's call.
//!
//! libc's `dlsym`/`dlvsym` are found without calling `dlsym` (which would be us): in
//! libc.so.6's dynamic symbol table, through its GNU hash table, libc itself found in the
//! loader's list (`_r_debug`). No allocation, no lock of ours: memory hooks call `dlsym`
//! lazily from inside allocators. And no call a sanitizer intercepts before our
//! constructor: a sanitizer's runtime calls `dlsym` while setting up its interceptors,
//! whose pointers to the real functions are NULL until then (docs/design.md, "Sanitizer
//! builds run").

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_DLVSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
/// The span of libmrcache.so's own segments (0, 0 until known): lookups made from inside it
/// are ours (real.rs, memory.rs, std) and always go to libc untouched.
static SELF_LO: AtomicUsize = AtomicUsize::new(0);
static SELF_HI: AtomicUsize = AtomicUsize::new(0);

/// Resolve libc's functions and our own span (constructor; also done lazily).
pub fn resolve() {
    let _ = real_dlsym();
    let _ = real_dlvsym();
    let _ = self_span();
}

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

fn slot(slot: &AtomicPtr<c_void>, name: &CStr) -> Option<*mut c_void> {
    let mut p = slot.load(Acquire);
    if p.is_null() {
        p = libc_symbol(name);
        if p.is_null() {
            return None;
        }
        slot.store(p, Release);
    }
    Some(p)
}

/// One verbs function we export, as `dlsym` of it from libibverbs would name it.
pub struct Hooked {
    pub name: &'static CStr,
    pub version: &'static CStr,
    pub hook: fn() -> usize,
}

/// Called by the `dlsym` entry point: the address to jump to with the caller's arguments
/// (libc's `dlsym`), or 0 with the answer stored in `*out`.
extern "C" fn route_dlsym(
    handle: *mut c_void,
    name: *const c_char,
    caller: usize,
    out: *mut *mut c_void,
) -> usize {
    let Some(real) = real_dlsym() else {
        // SAFETY: out points to the entry point's stack slot.
        unsafe { *out = std::ptr::null_mut() };
        return 0;
    };
    let hooked = match hooked(name, None) {
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
    let Some(target) = crate::patch::PatchTarget::ALL
        .into_iter()
        .find(|t| t.name() == wanted)
    else {
        return real as usize;
    };
    // Before our constructor (another library's constructor asks): patch libc now.
    crate::load::install();
    let found = if handle == libc::RTLD_NEXT {
        // Only the program and the libraries preloaded before ours find ours next.
        match own_symbol(target.name()) {
            Some(ours) if crate::search::ours_comes_next(caller, target.name(), ours) => {
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
    let next = crate::forward::next_definition(wanted);
    let answer = match crate::patch::libc_entry_instead(target, found) {
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
extern "C" fn route_dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
    caller: usize,
    out: *mut *mut c_void,
) -> usize {
    let Some(real) = real_dlvsym() else {
        // SAFETY: out points to the entry point's stack slot.
        unsafe { *out = std::ptr::null_mut() };
        return 0;
    };
    let hooked = match hooked(name, Some(version)) {
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
fn hooked(name: *const c_char, version: Option<*const c_char>) -> Option<&'static Hooked> {
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
    crate::HOOKED
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
    // SAFETY: dladdr only reads the loader's tables; info is written on success.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
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
        if let Some(close) = crate::real::DLCLOSE.get() {
            close(h);
        }
        ours == found
    };
    if same {
        (hooked.hook)() as *mut c_void
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
    let close = crate::real::DLCLOSE.get()?;
    // SAFETY (closure): path is NULL (the program) or a NUL-terminated name; RTLD_NOLOAD
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

fn from_us(caller: usize) -> bool {
    let (lo, hi) = self_span();
    caller >= lo && caller < hi
}

fn self_span() -> (usize, usize) {
    let hi = SELF_HI.load(Acquire);
    if hi != 0 {
        return (SELF_LO.load(Relaxed), hi);
    }
    let own = Own::get();
    if own.hi != 0 {
        SELF_LO.store(own.lo, Relaxed);
        SELF_HI.store(own.hi, Release);
    }
    (own.lo, own.hi)
}

// What follows answers from the loader's own data (`_r_debug`, our ELF header) and the
// objects' mapped tables. It runs inside `dlsym` while a sanitizer's runtime looks up what
// it intercepts (its interceptors of dl_iterate_phdr, dlopen, malloc or pthread_* call
// through NULL until then), and inside allocators: it calls no function but libc's own
// dl_iterate_phdr (by its address, past any interceptor) and strlen/memcmp, which the
// sanitizers' interceptors serve themselves before their set-up.

/// The start of glibc's `struct link_map` (<link.h>: the public, stable part).
#[repr(C)]
struct LinkMap {
    l_addr: usize,
    l_name: *const c_char,
    l_ld: *const Dyn,
    l_next: *const LinkMap,
    l_prev: *const LinkMap,
}

/// glibc's `struct r_debug` (<link.h>): `r_map` heads the base namespace's objects, in
/// load order (the program first). Set by the loader before any constructor runs.
#[repr(C)]
struct RDebug {
    r_version: c_int,
    r_map: *const LinkMap,
}

unsafe extern "C" {
    /// The loader's debugger interface (ld.so exports it; a data reference, no call).
    static _r_debug: RDebug;
    /// The linker's symbol for our own ELF header, at the start of our first segment.
    static __ehdr_start: libc::Elf64_Ehdr;
}

/// The objects of the base namespace in load order (the program first). Objects loaded at
/// start-up (the program, its preloads and dependencies, libc) are never unloaded, and the
/// loader links a new object in only at the end: a walk that stops at one of them reads
/// only links that stay.
fn maps() -> impl Iterator<Item = &'static LinkMap> {
    // SAFETY: _r_debug is the loader's; reading its head pointer is a plain load.
    let mut m = unsafe { _r_debug.r_map };
    std::iter::from_fn(move || {
        // SAFETY: m is null or one of the loader's link_maps (see above).
        let map = unsafe { m.as_ref()? };
        m = map.l_next;
        Some(map)
    })
}

/// An object's file name without its directory ("" for the program).
fn base_name(map: &LinkMap) -> &[u8] {
    if map.l_name.is_null() {
        return b"";
    }
    // SAFETY: l_name is the loader's NUL-terminated path of the object.
    let path = unsafe { CStr::from_ptr(map.l_name) }.to_bytes();
    path.rsplit(|&b| b == b'/').next().unwrap_or(path)
}

static LIBC_MAP: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// libc.so.6's `struct link_map`, found in the loader's list (null when it is not there).
/// In glibc a handle `dlopen` returns is this pointer; but libc's `dlsym` needs a handle
/// `dlopen` prepared (an object only loaded as a dependency has no search list yet, and
/// `dlsym` on it crashes), so it is used as a handle only with `real::address`, which
/// answers from libc's own symbol table (`libc_symbol`).
pub fn libc_handle() -> *mut c_void {
    let mut p = LIBC_MAP.load(Acquire);
    if p.is_null() {
        p = maps()
            .find(|m| base_name(m) == b"libc.so.6")
            .map_or(std::ptr::null_mut(), |m| m as *const LinkMap as *mut c_void);
        LIBC_MAP.store(p, Release);
    }
    p
}

/// The address of `name` as libc.so.6 defines it, from its dynamic symbol table: the
/// default version, as libc's `dlsym(handle, name)` answers. Null when not found.
pub fn libc_symbol(name: &CStr) -> *mut c_void {
    // SAFETY: a non-null libc_handle is libc's link_map, which stays for the process.
    let Some(map) = (unsafe { (libc_handle() as *const LinkMap).as_ref() }) else {
        return std::ptr::null_mut();
    };
    // SAFETY: libc's mapped dynamic section and load base; its tables stay mapped.
    unsafe { lookup_gnu_hash(map.l_addr, map.l_ld, name) }.unwrap_or(0) as *mut c_void
}

/// libmrcache.so itself, from its own ELF header: the span of its segments, its load base
/// and dynamic section.
struct Own {
    lo: usize,
    hi: usize,
    base: usize,
    dynamic: *const Dyn,
}

impl Own {
    fn get() -> Own {
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

/// A dynamic section entry (<elf.h> Elf64_Dyn; the libc crate has no such type).
#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}
const DT_NULL: i64 = 0;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
/// A `DT_VERSYM` entry's bit for a hidden (non-default) version (`name@VER`, not `@@`).
const VERSYM_HIDDEN: u16 = 0x8000;

/// Where libmrcache.so itself defines `name`, from its own dynamic symbol table: not
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

/// The sanitizer whose runtime (and allocator) is in the process, if any: its `malloc`
/// takes memory from the kernel and gives it back with its own system calls, which no
/// hook of ours sees. Read from the loaded objects' symbol tables (not with `dlsym`, whose
/// failure would leave an error for the program's next `dlerror()`). Set-up only.
pub fn sanitizer_allocator() -> Option<&'static str> {
    const RUNTIMES: [(&CStr, &str); 4] = [
        (c"__asan_init", "AddressSanitizer"),
        (c"__tsan_init", "ThreadSanitizer"),
        (c"__msan_init", "MemorySanitizer"),
        (c"__hwasan_init", "HWAddressSanitizer"),
    ];
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: data is the &mut Option<usize> passed below; info is the loader's
        // description of one loaded object, valid during the call.
        let (found, info) = unsafe { (&mut *(data as *mut Option<usize>), &*info) };
        for (i, (symbol, _)) in RUNTIMES.iter().enumerate() {
            // SAFETY: as above.
            if unsafe { defines(info, symbol) } == Some(true) {
                *found = Some(i);
                return 1;
            }
        }
        0
    }
    let mut found: Option<usize> = None;
    // SAFETY: visit matches the callback type and only reads what it is given.
    unsafe { iterate_phdr(visit, &mut found as *mut Option<usize> as *mut c_void) };
    found.map(|i| RUNTIMES[i].1)
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

/// The address of `name` in an object (0: not defined there; None: no GNU hash table):
/// its default version (`name@@VER`) or an unversioned definition, as `dlsym` answers;
/// a hidden version (`name@VER`) only when there is nothing else.
///
/// # Safety
/// `dynamic` must be a loaded object's dynamic section and `base` its load base.
unsafe fn lookup_gnu_hash(base: usize, dynamic: *const Dyn, name: &CStr) -> Option<usize> {
    let (mut symtab, mut strtab, mut gnu_hash, mut versym) = (0usize, 0usize, 0usize, 0usize);
    let mut d = dynamic;
    // SAFETY (whole function): the caller's promise; every table read below lies inside
    // the object's mapped, read-only data, at the places its dynamic section names.
    unsafe {
        while (*d).tag != DT_NULL {
            let v = (*d).val as usize;
            match (*d).tag {
                DT_SYMTAB => symtab = v,
                DT_STRTAB => strtab = v,
                DT_GNU_HASH => gnu_hash = v,
                DT_VERSYM => versym = v,
                _ => {}
            }
            d = d.add(1);
        }
        if symtab == 0 || strtab == 0 || gnu_hash == 0 {
            return None;
        }
        // glibc relocates these entries in place on x86-64; a loader that does not leaves
        // them relative to the base, below it.
        let fix = |p: usize| if p < base { base + p } else { p };
        let (symtab, strtab, gnu_hash) = (fix(symtab), fix(strtab), fix(gnu_hash));
        let versym = (versym != 0).then(|| fix(versym) as *const u16);
        let header = gnu_hash as *const u32;
        let (nbuckets, symoffset, bloom_words) = (*header, *header.add(1), *header.add(2));
        if nbuckets == 0 {
            return Some(0);
        }
        let buckets = (gnu_hash + 16 + bloom_words as usize * 8) as *const u32;
        let chain = buckets.add(nbuckets as usize);
        let want = name.to_bytes();
        let hash = want
            .iter()
            .fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(c as u32));
        let mut i = *buckets.add((hash % nbuckets) as usize);
        if i < symoffset {
            return Some(0);
        }
        let mut hidden = 0;
        loop {
            let entry = *chain.add((i - symoffset) as usize);
            let sym = &*(symtab as *const libc::Elf64_Sym).add(i as usize);
            if (entry | 1) == (hash | 1)
                && sym.st_shndx != 0
                && sym.st_value != 0
                && CStr::from_ptr((strtab + sym.st_name as usize) as *const c_char).to_bytes()
                    == want
            {
                let at = base.wrapping_add(sym.st_value as usize);
                match versym {
                    Some(v) if *v.add(i as usize) & VERSYM_HIDDEN != 0 => {
                        if hidden == 0 {
                            hidden = at;
                        }
                    }
                    _ => return Some(at),
                }
            }
            if entry & 1 != 0 {
                return Some(hidden);
            }
            i += 1;
        }
    }
}

// The exported entry points. On entry the caller's return address is at [rsp]; the
// arguments are saved around the call to route_* and restored for the jump, so libc's
// function sees exactly the caller's call. Stack: entry rsp = 8 mod 16; pushes and the
// out slot keep the call to route_* 16-byte aligned.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".globl dlsym",
    ".globl mrcache_dlsym_2_2_5",
    ".symver mrcache_dlsym_2_2_5, dlsym@GLIBC_2.2.5",
    ".type dlsym, @function",
    ".type mrcache_dlsym_2_2_5, @function",
    "dlsym:",
    "mrcache_dlsym_2_2_5:",
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
    ".size dlsym, . - dlsym",
    "",
    ".globl dlvsym",
    ".globl mrcache_dlvsym_2_2_5",
    ".symver mrcache_dlvsym_2_2_5, dlvsym@GLIBC_2.2.5",
    ".type dlvsym, @function",
    ".type mrcache_dlvsym_2_2_5, @function",
    "dlvsym:",
    "mrcache_dlvsym_2_2_5:",
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
    ".size dlvsym, . - dlvsym",
    route_dlsym = sym route_dlsym,
    route_dlvsym = sym route_dlvsym,
);
#[cfg(target_arch = "aarch64")]
#[path = "dlsym_aarch64.rs"]
mod aarch64;
