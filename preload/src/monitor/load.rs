//! The constructor's part: find libc's pieces and install the monitor `MRCACHE_MONITOR`
//! names. Runs before `main`, possibly before the allocator is ready: getenv only, no
//! allocation, nothing printed (a bad value is reported at the first verbs call).

use crate::monitor::memory::{
    CURBRK, GLIBC_REALLOC, REPORTING, brk, madvise, mmap, mmap64, mprotect, mremap, munmap,
    pkey_mprotect, realloc, sbrk, shmat, shmdt,
};
use crate::monitor::patch::{self, PatchTarget, Target};
use crate::sys::symbol;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::Relaxed};

/// libc's own handle, for its internal entry points: its `struct link_map`, from the
/// loader's list (`dlsym::libc_handle`, not `dlopen`, which a sanitizer intercepts).
/// Look symbols up in it with `symbol::address`/`symbol::function` only: libc's `dlsym` does
/// not take a link_map `dlopen` did not prepare.
pub static LIBC: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Which of libc's entry points were patched: `PatchTarget::bit`s.
pub static PATCHED: AtomicUsize = AtomicUsize::new(0);

/// `MRCACHE_MONITOR` as read at load. An invalid value patches nothing; the first verbs
/// call reports it and runs with the cache off.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LoadMonitor {
    Patch,
    Symbols,
    None,
    Invalid,
}

impl LoadMonitor {
    fn from_env() -> LoadMonitor {
        match env_is(c"MRCACHE_MONITOR", &[b"patch"]) {
            None | Some(true) => LoadMonitor::Patch,
            Some(false) if env_is(c"MRCACHE_MONITOR", &[b"symbols"]) == Some(true) => {
                LoadMonitor::Symbols
            }
            Some(false) if env_is(c"MRCACHE_MONITOR", &[b"none"]) == Some(true) => {
                LoadMonitor::None
            }
            Some(false) => LoadMonitor::Invalid,
        }
    }
}

fn env_is(name: &std::ffi::CStr, values: &[&[u8]]) -> Option<bool> {
    // SAFETY: getenv with a valid name; the result is read before anything can change it.
    let v = unsafe { libc::getenv(name.as_ptr()) };
    if v.is_null() {
        return None;
    }
    // SAFETY: getenv returns a NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes();
    Some(values.contains(&v))
}

/// Constructor part: find libc's pieces and install the monitor `MRCACHE_MONITOR` names.
/// Reads the environment with getenv only (no allocation), prints nothing: a bad value is
/// reported at the first verbs call. Runs once: from our constructor, or earlier from
/// `dlsym` when another library's constructor looks up a memory function before ours ran
/// (UCX's bistro then patches what it is given: it must be given libc's entry).
pub fn install() {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if STARTED.swap(true, Relaxed) {
        return;
    }
    crate::monitor::forward::resolve_next();
    // May run inside a sanitizer's set-up (its dlsym of a memory function): nothing here
    // calls what it intercepts (no dlopen, dl_iterate_phdr, malloc or pthread_*).
    let h = crate::sys::elf::libc_handle();
    if h.is_null() {
        return;
    }
    LIBC.store(h, Relaxed);
    crate::monitor::forward::resolve(h);
    // The definition libc's own code uses (through its GOT): a program that reads
    // __curbrk holds a copy of it (a copy relocation), found first; libc's original is not.
    CURBRK.store(
        symbol::address(libc::RTLD_DEFAULT, c"__curbrk") as *mut *mut c_void,
        Relaxed,
    );
    symbol::REALLOC.resolve();
    let next = symbol::REALLOC.address();
    GLIBC_REALLOC.store(
        !next.is_null() && next == symbol::address(h, c"realloc"),
        Relaxed,
    );
    let monitor = LoadMonitor::from_env();
    if monitor == LoadMonitor::None {
        REPORTING.store(false, Relaxed);
    }
    // Our hooks' own addresses, not our GOT entries for them (see dlsym::own_symbol).
    let own = |name: &std::ffi::CStr, at: usize| crate::sys::elf::own_symbol(name).unwrap_or(at);
    for (name, at) in [
        (c"munmap", munmap as *const () as usize),
        (c"madvise", madvise as *const () as usize),
        (c"mremap", mremap as *const () as usize),
        (c"mmap", mmap as *const () as usize),
        (c"mmap64", mmap64 as *const () as usize),
        (c"brk", brk as *const () as usize),
        (c"sbrk", sbrk as *const () as usize),
        (c"shmat", shmat as *const () as usize),
        (c"shmdt", shmdt as *const () as usize),
        (c"realloc", realloc as *const () as usize),
        (c"mprotect", mprotect as *const () as usize),
        (c"pkey_mprotect", pkey_mprotect as *const () as usize),
    ] {
        crate::monitor::patch::watch_hook(name, own(name, at));
    }
    let disabled = env_is(c"MRCACHE_ENABLE", &[b"0", b"off", b"false", b"no"]) == Some(true);
    if monitor != LoadMonitor::Patch || disabled {
        return;
    }
    let targets = PatchTarget::ALL.map(|t| Target {
        name: t.name(),
        prologues: t.prologues(),
        hook: crate::monitor::memory::from_libc(t),
    });
    PATCHED.store(patch::install(h, &targets), Relaxed);
    // libc's own mprotect entry: glibc's internal `__mprotect` callers taking access away
    // invalidate (docs/design.md, "Protection changes"), and the patch check's watch
    // (unpatched, it never clears and every hit reads every site). Our own code pages are
    // made writable by raw system calls (cross_modify), which no hook sees.
    let mprotect = Target {
        name: c"mprotect",
        prologues: &patch::MPROTECT,
        hook: crate::monitor::memory::mprotect_from_libc as *const () as usize,
    };
    patch::MPROTECT_PATCHED.store(patch::patch(h, &mprotect).is_ok(), Relaxed);
}
