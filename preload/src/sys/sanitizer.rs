//! A sanitizer's runtime in the process, and with it an allocator that takes memory from the
//! kernel and gives it back with its own system calls, which no hook of ours sees.
//!
//! A runtime is known by the one symbol each defines for its set-up (`__asan_init`, ...),
//! or by the allocator interface every runtime with an allocator of its own defines
//! (`__sanitizer_get_allocated_size`); UBSan has neither (its runtime defines other
//! `__sanitizer_*` and even `__asan_*` symbols, its copy of libbacktrace: a prefix is not
//! enough). Looked for in two places:
//!
//! - the dynamic symbol tables of the loaded objects (a shared runtime: `libasan.so`,
//!   `liblsan.so`, clang's runtimes exported from the program), through libc's own
//!   `dl_iterate_phdr` and the GNU hash tables (`elf`);
//! - the executable's file, its `.symtab` and `.dynsym` sections: a runtime linked in
//!   statically (`-static-libasan`, `-static-libtsan`, `-static-liblsan`) exports none of
//!   these symbols, and its `.symtab` is not loaded into memory. The file is mapped
//!   read-only with raw system calls, read through bounds-checked slices and unmapped: no
//!   allocation, no libc call a sanitizer intercepts. A stripped executable has no `.symtab`
//!   left: a static runtime in it is not found (docs/design/monitor.md, "What mrcache cannot see").

use crate::sys::elf::{defines, iterate_phdr};
use crate::sys::syscall6;
use std::ffi::{CStr, c_int, c_void};

/// The symbol each runtime with an allocator defines, and the name the line gives it; the
/// last one is common to all of them (a runtime not named above, or a later one).
const RUNTIMES: [(&CStr, &str); 6] = [
    (c"__asan_init", "AddressSanitizer"),
    (c"__tsan_init", "ThreadSanitizer"),
    (c"__msan_init", "MemorySanitizer"),
    (c"__hwasan_init", "HWAddressSanitizer"),
    (c"__lsan_init", "LeakSanitizer"),
    (c"__sanitizer_get_allocated_size", "a sanitizer runtime"),
];

/// A sanitizer runtime with its own allocator in the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runtime {
    /// What the line calls it ("AddressSanitizer").
    pub name: &'static str,
    /// Linked into the executable (found in its file's symbol tables), not a shared object.
    pub linked_in: bool,
}

/// The sanitizer whose runtime (and allocator) is in the process, if any. Read from the
/// loaded objects' symbol tables (not with `dlsym`, whose failure would leave an error for
/// the program's next `dlerror()`), then from the executable's file. Set-up only. `alone`:
/// the process has no other thread, so the loaded objects are read without the loader's lock
/// (`elf::defined_in_loaded_objects_alone`: a fork child can inherit that lock held).
pub fn allocator(alone: bool) -> Option<Runtime> {
    let loaded = if alone {
        RUNTIMES
            .iter()
            .position(|(symbol, _)| crate::sys::elf::defined_in_loaded_objects_alone(symbol))
    } else {
        in_loaded_objects()
    };
    if let Some(i) = loaded {
        return Some(Runtime {
            name: RUNTIMES[i].1,
            linked_in: false,
        });
    }
    in_executable_file().map(|i| Runtime {
        name: RUNTIMES[i].1,
        linked_in: true,
    })
}

/// The first of `RUNTIMES` an object's dynamic symbol table defines.
fn in_loaded_objects() -> Option<usize> {
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
    found
}

/// The first of `RUNTIMES` the executable's file defines in `.symtab` or `.dynsym`.
fn in_executable_file() -> Option<usize> {
    let path = c"/proc/self/exe";
    let fd = syscall6(
        libc::SYS_openat,
        libc::AT_FDCWD as usize,
        path.as_ptr() as usize,
        (libc::O_RDONLY | libc::O_CLOEXEC) as usize,
        0,
        0,
        0,
    );
    if fd < 0 {
        return None;
    }
    // SAFETY: a plain struct of integers, filled by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let ok = syscall6(
        libc::SYS_fstat,
        fd as usize,
        &raw mut st as usize,
        0,
        0,
        0,
        0,
    ) == 0;
    let len = usize::try_from(st.st_size).unwrap_or(0);
    let map = if ok && len > 0 {
        syscall6(
            libc::SYS_mmap,
            0,
            len,
            libc::PROT_READ as usize,
            libc::MAP_PRIVATE as usize,
            fd as usize,
            0,
        )
    } else {
        -1
    };
    syscall6(libc::SYS_close, fd as usize, 0, 0, 0, 0, 0);
    if map < 0 {
        return None;
    }
    // SAFETY: `len` bytes mapped read-only just above, ours until the munmap below. (A
    // file truncated meanwhile faults on a read past its end: the executable is in use,
    // and the kernel refuses writes to it, ETXTBSY.)
    let file = unsafe { std::slice::from_raw_parts(map as *const u8, len) };
    let found = defined_in_file(file);
    syscall6(libc::SYS_munmap, map as usize, len, 0, 0, 0, 0);
    found
}

const SHT_SYMTAB: usize = 2;
const SHT_DYNSYM: usize = 11;
const SHDR_LEN: usize = 64;
const SYM_LEN: usize = 24;

fn u16_at(b: &[u8], at: usize) -> Option<usize> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?) as usize)
}
fn u32_at(b: &[u8], at: usize) -> Option<usize> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize)
}
fn u64_at(b: &[u8], at: usize) -> Option<usize> {
    usize::try_from(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?)).ok()
}

/// The first of `RUNTIMES` that the 64-bit ELF file `file` defines (a symbol with a section)
/// in a `SHT_SYMTAB` or `SHT_DYNSYM` section. Anything out of bounds ends the search.
pub fn defined_in_file(file: &[u8]) -> Option<usize> {
    if file.get(..5)? != b"\x7fELF\x02" {
        return None;
    }
    let shoff = u64_at(file, 40)?;
    let mut shnum = u16_at(file, 60)?;
    if u16_at(file, 58)? != SHDR_LEN || shoff == 0 {
        return None;
    }
    let shdr = |i: usize| {
        file.get(shoff.checked_add(i.checked_mul(SHDR_LEN)?)?..)?
            .get(..SHDR_LEN)
    };
    if shnum == 0 {
        // More sections than e_shnum holds: the count is section 0's sh_size.
        shnum = u64_at(shdr(0)?, 32)?;
    }
    let mut best: Option<usize> = None;
    for i in 0..shnum {
        let Some(sh) = shdr(i) else { break };
        let kind = u32_at(sh, 4)?;
        if kind != SHT_SYMTAB && kind != SHT_DYNSYM {
            continue;
        }
        let section = |sh: &[u8]| {
            let (off, size) = (u64_at(sh, 24)?, u64_at(sh, 32)?);
            file.get(off..off.checked_add(size)?)
        };
        let (Some(syms), Some(strs)) = (section(sh), shdr(u32_at(sh, 40)?).and_then(section))
        else {
            continue;
        };
        for sym in syms.chunks_exact(SYM_LEN) {
            // Defined here: a section index (not SHN_UNDEF).
            if u16_at(sym, 6)? == 0 {
                continue;
            }
            let Some(name) = strs.get(u32_at(sym, 0)?..) else {
                continue;
            };
            if !name.starts_with(b"__") {
                continue;
            }
            let hit = RUNTIMES
                .iter()
                .position(|(want, _)| name.starts_with(want.to_bytes_with_nul()));
            if let Some(k) = hit {
                best = Some(best.map_or(k, |b| b.min(k)));
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64-bit ELF file with one `.symtab` of the given names (each defined in section 1
    /// or, with a leading '!', undefined) and its string table.
    fn elf_with(names: &[&str]) -> Vec<u8> {
        let mut strs = vec![0u8];
        let mut syms = vec![0u8; SYM_LEN];
        for n in names {
            let (defined, n) = n.strip_prefix('!').map_or((true, *n), |n| (false, n));
            let mut sym = [0u8; SYM_LEN];
            sym[..4].copy_from_slice(&(strs.len() as u32).to_ne_bytes());
            sym[6..8].copy_from_slice(&u16::from(defined).to_ne_bytes());
            syms.extend_from_slice(&sym);
            strs.extend_from_slice(n.as_bytes());
            strs.push(0);
        }
        let shoff = 64;
        let data = shoff + 3 * SHDR_LEN;
        let mut f = vec![0u8; data];
        f[..5].copy_from_slice(b"\x7fELF\x02");
        f[40..48].copy_from_slice(&(shoff as u64).to_ne_bytes());
        f[58..60].copy_from_slice(&(SHDR_LEN as u16).to_ne_bytes());
        f[60..62].copy_from_slice(&3u16.to_ne_bytes());
        let mut put = |i: usize, kind: usize, off: usize, size: usize, link: u32| {
            let sh = &mut f[shoff + i * SHDR_LEN..][..SHDR_LEN];
            sh[4..8].copy_from_slice(&(kind as u32).to_ne_bytes());
            sh[24..32].copy_from_slice(&(off as u64).to_ne_bytes());
            sh[32..40].copy_from_slice(&(size as u64).to_ne_bytes());
            sh[40..44].copy_from_slice(&link.to_ne_bytes());
        };
        put(1, SHT_SYMTAB, data, syms.len(), 2);
        put(2, 3, data + syms.len(), strs.len(), 0);
        f.extend_from_slice(&syms);
        f.extend_from_slice(&strs);
        f
    }

    #[test]
    fn a_runtime_is_known_by_its_init_symbol_defined_in_the_file() {
        let name = |names: &[&str]| defined_in_file(&elf_with(names)).map(|i| RUNTIMES[i].1);
        assert_eq!(name(&["main", "__asan_init"]), Some("AddressSanitizer"));
        assert_eq!(
            name(&["__sanitizer_get_allocated_size", "__lsan_init"]),
            Some("LeakSanitizer")
        );
        assert_eq!(
            name(&["__sanitizer_get_allocated_size"]),
            Some("a sanitizer runtime")
        );
        // UBSan's static runtime: libbacktrace renamed `__asan_*`, `__sanitizer_*` helpers.
        assert_eq!(
            name(&["__asan_backtrace_alloc", "__sanitizer_print_stack_trace"]),
            None
        );
        assert_eq!(
            name(&["!__asan_init", "__asan_initx"]),
            None,
            "undefined, or longer"
        );
        let mut cut = elf_with(&["__tsan_init"]);
        cut.truncate(cut.len() - 3);
        assert_eq!(defined_in_file(&cut), None, "a string table past the end");
        assert_eq!(defined_in_file(b"\x7fELF\x01"), None);
    }

    #[test]
    fn the_test_binary_has_no_sanitizer() {
        // Through dl_iterate_phdr, and walking the loader's list as a process alone does
        // (no test here loads or unloads an object).
        assert_eq!(allocator(false), None);
        assert_eq!(allocator(true), None);
    }

    #[test]
    fn the_lock_free_walk_finds_what_dl_iterate_phdr_finds() {
        for name in [
            c"malloc",
            c"dl_iterate_phdr",
            c"__asan_init",
            c"no_such_symbol_here",
        ] {
            unsafe extern "C" fn visit(
                info: *mut libc::dl_phdr_info,
                _size: usize,
                data: *mut c_void,
            ) -> c_int {
                // SAFETY: data is the (&CStr, bool) passed below; info the loader's.
                let (name, found) = unsafe { &mut *(data as *mut (&CStr, bool)) };
                // SAFETY: as above.
                if unsafe { crate::sys::elf::defines(&*info, name) } == Some(true) {
                    *found = true;
                }
                0
            }
            let mut data = (name, false);
            // SAFETY: visit matches the callback type and only reads what it is given.
            unsafe { iterate_phdr(visit, &mut data as *mut (&CStr, bool) as *mut c_void) };
            assert_eq!(
                crate::sys::elf::defined_in_loaded_objects_alone(name),
                data.1,
                "{name:?}"
            );
        }
    }
}
