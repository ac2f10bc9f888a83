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
//! libc.so.6's dynamic symbol table, through its GNU hash table. No allocation, no lock of
//! ours: memory hooks call `dlsym` lazily from inside allocators.

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
    let answer = match crate::patch::libc_entry_instead(target, found) {
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
        unsafe {
            libc::dl_iterate_phdr(Some(visit_after), &mut after as *mut After as *mut c_void)
        };
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
    let find = Find::run(self_span as *const () as usize, None);
    if find.hi != 0 {
        SELF_LO.store(find.lo, Relaxed);
        SELF_HI.store(find.hi, Release);
    }
    (find.lo, find.hi)
}

/// What the `dl_iterate_phdr` callback looks for: the object containing `addr` (its span),
/// or the object named `want` (its load base and dynamic section).
struct Find {
    addr: usize,
    lo: usize,
    hi: usize,
    want: Option<&'static [u8]>,
    base: usize,
    dynamic: *const Dyn,
}

impl Find {
    /// Walk the loaded objects for the one containing `addr`, or the one named `want`.
    fn run(addr: usize, want: Option<&'static [u8]>) -> Find {
        let mut find = Find {
            addr,
            lo: 0,
            hi: 0,
            want,
            base: 0,
            dynamic: std::ptr::null(),
        };
        // SAFETY: visit matches dl_iterate_phdr's callback type and only reads what it is
        // given.
        unsafe { libc::dl_iterate_phdr(Some(visit), &mut find as *mut Find as *mut c_void) };
        find
    }
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: data is the &mut Find passed to dl_iterate_phdr; info is the loader's
    // description of one loaded object, valid during the call.
    let (find, info) = unsafe { (&mut *(data as *mut Find), &*info) };
    let base = info.dlpi_addr as usize;
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    if let Some(want) = find.want {
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: dlpi_name is a NUL-terminated path ("" for the main program).
        let path = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
        if path.rsplit(|&b| b == b'/').next() != Some(want) {
            return 0;
        }
        let Some(dynamic) = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC) else {
            return 0;
        };
        find.base = base;
        find.dynamic = base.wrapping_add(dynamic.p_vaddr as usize) as *const Dyn;
        return 1;
    }
    let (mut lo, mut hi, mut inside) = (usize::MAX, 0usize, false);
    for ph in phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD) {
        let start = base.wrapping_add(ph.p_vaddr as usize);
        let end = start.saturating_add(ph.p_memsz as usize);
        inside |= (start..end).contains(&find.addr);
        lo = lo.min(start);
        hi = hi.max(end);
    }
    if inside {
        (find.lo, find.hi) = (lo, hi);
        if let Some(dynamic) = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC) {
            find.base = base;
            find.dynamic = base.wrapping_add(dynamic.p_vaddr as usize) as *const Dyn;
        }
        return 1;
    }
    0
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

/// Where libmrcache.so itself defines `name`, from its own dynamic symbol table: not
/// `munmap as usize`, which reads our GOT entry for the exported symbol, and another
/// library may have pointed that entry at its own function (UCX's reloc mode does, before
/// our constructor when its hooks came first). None when not found.
pub fn own_symbol(name: &CStr) -> Option<usize> {
    let find = Find::run(own_symbol as *const () as usize, None);
    if find.dynamic.is_null() {
        return None;
    }
    // SAFETY: find.dynamic is our own mapped dynamic section, ended by DT_NULL.
    let p = unsafe { lookup_gnu_hash(find.base, find.dynamic, name) }.unwrap_or(0);
    (p != 0).then_some(p)
}

/// The address of `name` as libc.so.6 defines it, from its dynamic symbol table (any
/// version: libc's two versions of `dlsym` and of `dlvsym` are one function each).
pub fn libc_symbol(name: &CStr) -> *mut c_void {
    let find = Find::run(0, Some(b"libc.so.6"));
    if find.dynamic.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: find.dynamic is libc's mapped dynamic section, ended by DT_NULL; the tables it
    // points to are mapped for as long as libc is (the whole process).
    unsafe { lookup_gnu_hash(find.base, find.dynamic, name) }.unwrap_or(0) as *mut c_void
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

/// The address of `name` in an object (0: not defined there; None: no GNU hash table).
///
/// # Safety
/// `dynamic` must be a loaded object's dynamic section and `base` its load base.
unsafe fn lookup_gnu_hash(base: usize, dynamic: *const Dyn, name: &CStr) -> Option<usize> {
    let (mut symtab, mut strtab, mut gnu_hash) = (0usize, 0usize, 0usize);
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
        loop {
            let entry = *chain.add((i - symoffset) as usize);
            let sym = &*(symtab as *const libc::Elf64_Sym).add(i as usize);
            if (entry | 1) == (hash | 1)
                && sym.st_shndx != 0
                && sym.st_value != 0
                && CStr::from_ptr((strtab + sym.st_name as usize) as *const c_char).to_bytes()
                    == want
            {
                return Some(base.wrapping_add(sym.st_value as usize));
            }
            if entry & 1 != 0 {
                return Some(0);
            }
            i += 1;
        }
    }
}

// The exported entry points. On entry the caller's return address is at [rsp]; the
// arguments are saved around the call to route_* and restored for the jump, so libc's
// function sees exactly the caller's call. Stack: entry rsp = 8 mod 16; pushes and the
// out slot keep the call to route_* 16-byte aligned.
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
