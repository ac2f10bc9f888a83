//! The loader's list and the objects' symbol tables, read without a call: the objects
//! loaded at start-up (`_r_debug`), libc.so.6's link map and symbols, and the definition of
//! a name that follows a given object, as `dlsym(RTLD_NEXT)` from it answers.
//!
//! Written against `core` alone: libmrcache.so (the front, `preload/front`) and
//! libmrcache_engine.so both compile this file. It runs inside allocators, signal handlers
//! and a sanitizer's set-up: no lock, no allocation, and no call but an IFUNC's resolver
//! (and, on aarch64, libc's `getauxval` by its address, for that resolver's argument).

use core::ffi::{CStr, c_char, c_int, c_void};
use core::sync::atomic::{AtomicPtr, AtomicU8, Ordering::*};

/// The start of glibc's `struct link_map` (<link.h>: the public, stable part).
#[repr(C)]
pub struct LinkMap {
    pub l_addr: usize,
    pub l_name: *const c_char,
    pub l_ld: *const Dyn,
    pub l_next: *const LinkMap,
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
}

/// The objects of the base namespace in load order (the program first). Objects loaded at
/// start-up (the program, its preloads and dependencies, libc) are never unloaded, and the
/// loader links a new object in only at the end: a walk that stops at one of them reads
/// only links that stay.
pub fn maps() -> impl Iterator<Item = &'static LinkMap> {
    // SAFETY: _r_debug is the loader's; reading its head pointer is a plain load.
    let mut m = unsafe { _r_debug.r_map };
    core::iter::from_fn(move || {
        // SAFETY: m is null or one of the loader's link_maps (see above).
        let map = unsafe { m.as_ref()? };
        m = map.l_next;
        Some(map)
    })
}

/// The last object in the loader's list when the library was set up (`walks_answer`, or
/// the first walk before it, or what the front noted: `note_start_up`): the objects up to
/// it were loaded at start-up, in the order of the search, and stay loaded. Null until
/// known.
static LAST_AT_START: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// The last object loaded at start-up, noting it if it is not known yet.
pub fn last_at_start() -> *mut c_void {
    let mut last = LAST_AT_START.load(Acquire);
    if last.is_null() {
        last = maps().last().map_or(core::ptr::null_mut(), |m| {
            m as *const LinkMap as *mut c_void
        });
        LAST_AT_START.store(last, Release);
    }
    last
}

/// Take `last` as the last object loaded at start-up (the engine, from the front, which
/// noted it before anything was loaded with `dlopen`).
pub fn note_start_up(last: *mut c_void) {
    if !last.is_null() {
        LAST_AT_START.store(last, Release);
    }
}

/// The objects loaded at start-up, in load order, up to `last_at_start`.
pub fn start_up_maps() -> impl Iterator<Item = &'static LinkMap> {
    let last = last_at_start() as *const LinkMap;
    let mut done = last.is_null();
    maps().take_while(move |m| {
        let go = !done;
        done |= core::ptr::eq(*m, last);
        go
    })
}

/// Whether the walks below answer for the object loaded at `own` (the front's load base):
/// it is in the base namespace's list with libc after it among the objects loaded at
/// start-up, as when it is preloaded. Else (loaded with `dlopen` after libc, or
/// `dlmopen`ed into a namespace of its own) its next definitions are libc's `dlsym`'s.
/// Decided once, at the first call, which also notes which objects were loaded at start-up.
pub fn walks_answer(own: usize) -> bool {
    static ANSWER: AtomicU8 = AtomicU8::new(0);
    match ANSWER.load(Acquire) {
        0 => {
            let libc = libc_handle() as *const LinkMap;
            let mut after = false;
            let mut yes = false;
            for m in start_up_maps() {
                if after && core::ptr::eq(m, libc) {
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

/// The definition of `name` that follows the object loaded at `own` among the objects
/// loaded at start-up: what `dlsym(RTLD_NEXT, name)` called from that object answers
/// (those objects are listed in the order of the search: the program, the preloads, their
/// dependencies), read from their symbol tables as the loader reads them (GNU or SysV hash
/// table, default versions only, an IFUNC's resolver called). Null when none is found.
/// Only where `walks_answer(own)`.
pub fn next_after(own: usize, name: &CStr) -> *mut c_void {
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
    core::ptr::null_mut()
}

/// The first definition of `name` among the objects loaded at start-up, the program's
/// first: what `dlsym(RTLD_DEFAULT, name)` answers (a variable the program holds a copy of
/// is the program's). Read as `next_after`. Null when none is found.
pub fn first_definition(name: &CStr) -> *mut c_void {
    start_up_maps()
        // SAFETY: each map is one of the loader's, its load base and mapped dynamic section.
        .find_map(|m| unsafe { lookup(m.l_addr, m.l_ld, name, AS_DLSYM) }.filter(|&a| a != 0))
        .map_or(core::ptr::null_mut(), |a| a as *mut c_void)
}

/// Whether the object of `map` defines `name`, as `dlsym` reads its table.
pub fn defines(map: &LinkMap, name: &CStr) -> bool {
    // SAFETY: map is one of the loader's link_maps: its load base and mapped dynamic section.
    unsafe { lookup(map.l_addr, map.l_ld, name, AS_DLSYM) }.is_some_and(|a| a != 0)
}

/// An object's file name without its directory ("" for the program).
pub fn base_name(map: &LinkMap) -> &[u8] {
    if map.l_name.is_null() {
        return b"";
    }
    // SAFETY: l_name is the loader's NUL-terminated path of the object.
    let path = unsafe { CStr::from_ptr(map.l_name) }.to_bytes();
    path.rsplit(|&b| b == b'/').next().unwrap_or(path)
}

static LIBC_MAP: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// libc.so.6's `struct link_map`, found in the loader's list (null when it is not there).
/// In glibc a handle `dlopen` returns is this pointer; but libc's `dlsym` needs a handle
/// `dlopen` prepared (an object only loaded as a dependency has no search list yet, and
/// `dlsym` on it crashes), so it is used as a handle only to answer from libc's own symbol
/// table (`libc_symbol`).
pub fn libc_handle() -> *mut c_void {
    let mut p = LIBC_MAP.load(Acquire);
    if p.is_null() {
        p = maps()
            .find(|m| base_name(m) == b"libc.so.6")
            .map_or(core::ptr::null_mut(), |m| {
                m as *const LinkMap as *mut c_void
            });
        LIBC_MAP.store(p, Release);
    }
    p
}

/// The address of `name` as libc.so.6 defines it, from its dynamic symbol table: the
/// default version, as libc's `dlsym(handle, name)` answers. Null when not found.
pub fn libc_symbol(name: &CStr) -> *mut c_void {
    // SAFETY: a non-null libc_handle is libc's link_map, which stays for the process.
    let Some(map) = (unsafe { (libc_handle() as *const LinkMap).as_ref() }) else {
        return core::ptr::null_mut();
    };
    // SAFETY: libc's mapped dynamic section and load base; its tables stay mapped.
    unsafe { lookup_gnu_hash(map.l_addr, map.l_ld, name) }.unwrap_or(0) as *mut c_void
}

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

/// A dynamic section entry (<elf.h> Elf64_Dyn).
#[repr(C)]
pub struct Dyn {
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

/// <elf.h> Elf64_Sym.
#[repr(C)]
struct Sym {
    st_name: u32,
    st_info: u8,
    st_other: u8,
    st_shndx: u16,
    st_value: u64,
    st_size: u64,
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
pub unsafe fn lookup_gnu_hash(base: usize, dynamic: *const Dyn, name: &CStr) -> Option<usize> {
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
            symtab: fix(symtab) as *const Sym,
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
    symtab: *const Sym,
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
                if (entry | 1) == (hash | 1) {
                    if let Some((at, h)) = self.matches(i as usize) {
                        if !h {
                            return self.answer(i as usize, at);
                        }
                        if hidden == 0 && !self.how.dlsym {
                            hidden = at;
                        }
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
        // a pointer to { size, hwcap, hwcap2 }; libc's getauxval only reads the vector.
        const IFUNC_ARG_HWCAP: u64 = 1 << 62;
        const AT_HWCAP: u64 = 16;
        const AT_HWCAP2: u64 = 26;
        let getauxval = libc_symbol(c"getauxval");
        let (hwcap, hwcap2) = if getauxval.is_null() {
            (0, 0)
        } else {
            type Getauxval = unsafe extern "C" fn(u64) -> u64;
            // SAFETY: libc's getauxval, of this prototype.
            let f = unsafe { core::mem::transmute::<*mut c_void, Getauxval>(getauxval) };
            // SAFETY: getauxval has no preconditions.
            unsafe { (f(AT_HWCAP), f(AT_HWCAP2)) }
        };
        let arg: [u64; 3] = [24, hwcap, hwcap2];
        type Resolver = unsafe extern "C" fn(u64, *const u64) -> usize;
        // SAFETY: the caller's promise: a resolver of this prototype.
        unsafe {
            core::mem::transmute::<usize, Resolver>(resolver)(hwcap | IFUNC_ARG_HWCAP, arg.as_ptr())
        }
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        type Resolver = unsafe extern "C" fn() -> usize;
        // SAFETY: the caller's promise: x86-64's loader calls the resolver with no argument.
        unsafe { core::mem::transmute::<usize, Resolver>(resolver)() }
    }
}
