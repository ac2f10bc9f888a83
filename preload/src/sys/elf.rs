//! The loader's view, read from its own data (`_r_debug`, our ELF header) and the objects'
//! mapped tables: libc.so.6's link map and symbols, libmrcache.so's own symbols and span,
//! a walk of the loaded objects through libc's own `dl_iterate_phdr`.
//!
//! It runs inside `dlsym` while a sanitizer's runtime looks up what
//! it intercepts (its interceptors of dl_iterate_phdr, dlopen, malloc or pthread_* call
//! through NULL until then), and inside allocators: it calls no function but libc's own
//! dl_iterate_phdr (by its address, past any interceptor) and strlen/memcmp, which the
//! sanitizers' interceptors serve themselves before their set-up.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering::*};

/// libc's function `name`, looked up once into `slot` (from libc's own symbol table).
pub fn slot(slot: &AtomicPtr<c_void>, name: &CStr) -> Option<*mut c_void> {
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

/// The last object in the loader's list when the library was set up (`walks_answer`, or
/// the first walk before it): the objects up to it were loaded at start-up, in the order of
/// the search, and stay loaded. Null until known.
static LAST_AT_START: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The objects loaded at start-up, in load order, up to `LAST_AT_START`.
fn start_up_maps() -> impl Iterator<Item = &'static LinkMap> {
    let mut last = LAST_AT_START.load(Acquire) as *const LinkMap;
    if last.is_null() {
        last = maps()
            .last()
            .map_or(std::ptr::null(), |m| m as *const LinkMap);
        LAST_AT_START.store(last as *mut c_void, Release);
    }
    let mut done = last.is_null();
    maps().take_while(move |m| {
        let go = !done;
        done |= std::ptr::eq(*m, last);
        go
    })
}

/// Whether the walks below answer for libmrcache.so: it is in the base namespace's list
/// with libc after it among the objects loaded at start-up, as when it is preloaded. Else
/// (loaded with `dlopen` after libc, or `dlmopen`ed into a namespace of its own) the
/// constructor asks libc's `dlsym` at once for what the hooks will need. Decided once, at
/// the first call (the constructor's, or a hook's before it), which also notes which
/// objects were loaded at start-up.
pub fn walks_answer() -> bool {
    static ANSWER: AtomicU8 = AtomicU8::new(0);
    match ANSWER.load(Acquire) {
        0 => {
            let (own, libc) = (Own::get().base, libc_handle() as *const LinkMap);
            let mut after = false;
            let mut yes = false;
            for m in start_up_maps() {
                if after && std::ptr::eq(m, libc) {
                    yes = true;
                    break;
                }
                after |= m.l_addr == own;
            }
            ANSWER.store(1 + yes as u8, Release);
            yes
        }
        known => known == 2,
    }
}

/// The definition of `name` that follows libmrcache.so among the objects loaded at start-up:
/// what `dlsym(RTLD_NEXT, name)` called from our code answers (those objects are listed in
/// the order of the search: the program, the preloads, their dependencies), read from their
/// symbol tables as the loader reads them (GNU or SysV hash table, default versions only, an
/// IFUNC's resolver called). No lock, no allocation, no call into libc: safe inside
/// allocators, signal handlers and a sanitizer's set-up, so the hooks look their next
/// definition up at their first call. Where libmrcache.so was not preloaded
/// (`walks_answer` says so) it is libc's `dlsym`, which the constructor asked already for
/// every name the hooks use. Null when none is found.
pub fn next_after_own(name: &CStr) -> *mut c_void {
    if !walks_answer() {
        return dlsym_next(name);
    }
    let own = Own::get().base;
    let mut after = false;
    for m in start_up_maps() {
        if !after {
            after = m.l_addr == own;
            continue;
        }
        // SAFETY: m is one of the loader's link_maps: its load base and mapped dynamic
        // section.
        if let Some(at) = unsafe { lookup(m.l_addr, m.l_ld, name, AS_DLSYM) }.filter(|&a| a != 0) {
            return at as *mut c_void;
        }
    }
    std::ptr::null_mut()
}

/// libc's `dlsym(RTLD_NEXT, name)`, called from here.
fn dlsym_next(name: &CStr) -> *mut c_void {
    let dlsym = libc_symbol(c"dlsym");
    if dlsym.is_null() {
        return dlsym;
    }
    type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
    // SAFETY: libc's dlsym, of this prototype, called from here: RTLD_NEXT starts after
    // libmrcache.so.
    unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(dlsym)(libc::RTLD_NEXT, name.as_ptr()) }
}

/// The first definition of `name` among the objects loaded at start-up, the program's
/// first: what `dlsym(RTLD_DEFAULT, name)` answers (a variable the program holds a copy of
/// is the program's). Read as `next_after_own`. Null when none is found.
pub fn first_definition(name: &CStr) -> *mut c_void {
    start_up_maps()
        // SAFETY: each map is one of the loader's, its load base and mapped dynamic section.
        .find_map(|m| unsafe { lookup(m.l_addr, m.l_ld, name, AS_DLSYM) }.filter(|&a| a != 0))
        .map_or(std::ptr::null_mut(), |a| a as *mut c_void)
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
/// `dlsym` on it crashes), so it is used as a handle only with `symbol::address`, which
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

/// The span of libmrcache.so's own loadable segments ((0, 0) when unknown).
pub fn own_span() -> (usize, usize) {
    let own = Own::get();
    (own.lo, own.hi)
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
const DT_HASH: i64 = 4;
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

/// How `lookup` reads a table.
#[derive(Clone, Copy)]
struct How {
    /// As `dlsym` answers: a SysV hash table where there is no GNU one, never a hidden
    /// version, an IFUNC's resolver called.
    dlsym: bool,
}

/// Libc's own tables, read as they are (a hidden version when there is nothing else).
const AS_IS: How = How { dlsym: false };
/// As `dlsym(handle, name)` answers.
const AS_DLSYM: How = How { dlsym: true };

/// The address of `name` in an object as its GNU hash table answers (0: not defined there;
/// None: no GNU hash table): its default version (`name@@VER`) or an unversioned
/// definition, as `dlsym` answers; a hidden version (`name@VER`) only when there is nothing
/// else.
///
/// # Safety
/// `dynamic` must be a loaded object's dynamic section and `base` its load base.
unsafe fn lookup_gnu_hash(base: usize, dynamic: *const Dyn, name: &CStr) -> Option<usize> {
    // SAFETY: the caller's promise.
    unsafe { lookup(base, dynamic, name, AS_IS) }
}

/// The address of `name` in an object (0: not defined there; None: no hash table `how`
/// reads).
///
/// # Safety
/// `dynamic` must be a loaded object's dynamic section and `base` its load base.
unsafe fn lookup(base: usize, dynamic: *const Dyn, name: &CStr, how: How) -> Option<usize> {
    let (mut symtab, mut strtab, mut gnu_hash, mut sysv_hash, mut versym) = (0, 0, 0, 0, 0);
    let mut d = dynamic;
    // SAFETY: the caller's promise (whole function); every table read below lies inside
    // the object's mapped, read-only data, at the places its dynamic section names.
    unsafe {
        while (*d).tag != DT_NULL {
            let v = (*d).val as usize;
            match (*d).tag {
                DT_SYMTAB => symtab = v,
                DT_STRTAB => strtab = v,
                DT_GNU_HASH => gnu_hash = v,
                DT_HASH => sysv_hash = v,
                DT_VERSYM => versym = v,
                _ => {}
            }
            d = d.add(1);
        }
        if symtab == 0 || strtab == 0 {
            return None;
        }
        // glibc relocates these entries in place on x86-64; a loader that does not leaves
        // them relative to the base, below it.
        let fix = |p: usize| if p < base { base + p } else { p };
        let table = Table {
            base,
            symtab: fix(symtab) as *const libc::Elf64_Sym,
            strtab: fix(strtab),
            versym: (versym != 0).then(|| fix(versym) as *const u16),
            want: name.to_bytes(),
            how,
        };
        if gnu_hash != 0 {
            return Some(table.in_gnu_hash(fix(gnu_hash)));
        }
        if sysv_hash != 0 && how.dlsym {
            return Some(table.in_sysv_hash(fix(sysv_hash)));
        }
        None
    }
}

/// One object's symbol table, searched for one name.
struct Table<'a> {
    base: usize,
    symtab: *const libc::Elf64_Sym,
    strtab: usize,
    versym: Option<*const u16>,
    want: &'a [u8],
    how: How,
}

/// `STT_GNU_IFUNC`: the symbol's value is a resolver that returns the function.
const STT_GNU_IFUNC: u8 = 10;

impl Table<'_> {
    /// Symbol `i`, if it is a definition of the name: Some(address, hidden version).
    ///
    /// # Safety
    /// `i` must index the object's symbol table.
    unsafe fn matches(&self, i: usize) -> Option<(usize, bool)> {
        // SAFETY: the caller's promise; the name lies in the object's string table.
        unsafe {
            let sym = &*self.symtab.add(i);
            if sym.st_shndx == 0
                || sym.st_value == 0
                || CStr::from_ptr((self.strtab + sym.st_name as usize) as *const c_char).to_bytes()
                    != self.want
            {
                return None;
            }
            let hidden = self.versym.is_some_and(|v| *v.add(i) & VERSYM_HIDDEN != 0);
            Some((self.base.wrapping_add(sym.st_value as usize), hidden))
        }
    }

    /// What `dlsym` hands out for a found definition: an IFUNC's resolver's answer.
    ///
    /// # Safety
    /// `i` must index the object's symbol table and `at` be its address.
    unsafe fn answer(&self, i: usize, at: usize) -> usize {
        // SAFETY: the caller's promise.
        let ifunc = unsafe { (*self.symtab.add(i)).st_info & 0xf } == STT_GNU_IFUNC;
        if !(self.how.dlsym && ifunc) {
            return at;
        }
        // SAFETY: an IFUNC's value is its resolver, which the loader calls as here.
        unsafe { resolve_ifunc(at) }
    }

    /// The GNU hash table at `table`: the default version, else a hidden one when `how`
    /// takes it.
    ///
    /// # Safety
    /// `table` must be the object's GNU hash table.
    unsafe fn in_gnu_hash(&self, table: usize) -> usize {
        // SAFETY: the caller's promise; the buckets and chains follow the header.
        unsafe {
            let header = table as *const u32;
            let (nbuckets, symoffset, bloom_words) = (*header, *header.add(1), *header.add(2));
            if nbuckets == 0 {
                return 0;
            }
            let buckets = (table + 16 + bloom_words as usize * 8) as *const u32;
            let chain = buckets.add(nbuckets as usize);
            let hash = self
                .want
                .iter()
                .fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(c as u32));
            let mut i = *buckets.add((hash % nbuckets) as usize);
            if i < symoffset {
                return 0;
            }
            let mut hidden = 0;
            loop {
                let entry = *chain.add((i - symoffset) as usize);
                if (entry | 1) == (hash | 1)
                    && let Some((at, h)) = self.matches(i as usize)
                {
                    if !h {
                        return self.answer(i as usize, at);
                    }
                    if hidden == 0 && !self.how.dlsym {
                        hidden = at;
                    }
                }
                if entry & 1 != 0 {
                    return hidden;
                }
                i += 1;
            }
        }
    }

    /// The SysV hash table at `table` (an object linked `--hash-style=sysv`): the default
    /// version.
    ///
    /// # Safety
    /// `table` must be the object's SysV hash table.
    unsafe fn in_sysv_hash(&self, table: usize) -> usize {
        // SAFETY: the caller's promise; the buckets and chains follow the two counts.
        unsafe {
            let header = table as *const u32;
            let nbuckets = *header;
            if nbuckets == 0 {
                return 0;
            }
            let buckets = header.add(2);
            let chain = buckets.add(nbuckets as usize);
            let hash = self.want.iter().fold(0u32, |h, &c| {
                let h = (h << 4).wrapping_add(c as u32);
                (h ^ ((h & 0xf000_0000) >> 24)) & 0x0fff_ffff
            });
            let mut i = *buckets.add((hash % nbuckets) as usize) as usize;
            while i != 0 {
                if let Some((at, false)) = self.matches(i) {
                    return self.answer(i, at);
                }
                i = *chain.add(i) as usize;
            }
            0
        }
    }
}

/// Call an IFUNC's resolver as the loader does, for the function it picks.
///
/// # Safety
/// `resolver` must be an IFUNC symbol's value.
unsafe fn resolve_ifunc(resolver: usize) -> usize {
    #[cfg(target_arch = "aarch64")]
    {
        // glibc's aarch64 loader passes the hardware capabilities with _IFUNC_ARG_HWCAP and
        // a pointer to { size, hwcap, hwcap2 }.
        const IFUNC_ARG_HWCAP: u64 = 1 << 62;
        // SAFETY: getauxval only reads the auxiliary vector.
        let (hwcap, hwcap2) = unsafe {
            (
                libc::getauxval(libc::AT_HWCAP),
                libc::getauxval(libc::AT_HWCAP2),
            )
        };
        let arg: [u64; 3] = [24, hwcap, hwcap2];
        type Resolver = unsafe extern "C" fn(u64, *const u64) -> usize;
        // SAFETY: the caller's promise: a resolver of this prototype.
        unsafe {
            std::mem::transmute::<usize, Resolver>(resolver)(hwcap | IFUNC_ARG_HWCAP, arg.as_ptr())
        }
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        type Resolver = unsafe extern "C" fn() -> usize;
        // SAFETY: the caller's promise: x86-64's loader calls the resolver with no argument.
        unsafe { std::mem::transmute::<usize, Resolver>(resolver)() }
    }
}
