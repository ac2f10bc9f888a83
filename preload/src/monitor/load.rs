//! The constructor's part: find libc's pieces and remember what the monitor
//! `MRCACHE_MONITOR` names; and patching libc's entry points, at the first registration.
//! The constructor runs before `main`, possibly before the allocator is ready: getenv only,
//! no allocation, nothing printed (a bad value is reported at the first registration).

use crate::monitor::memory::{
    REPORTING, brk, madvise, mmap, mmap64, mprotect, mremap, munmap, pkey_mprotect, realloc, sbrk,
    shmat, shmdt,
};
use crate::monitor::patch::{self, PatchTarget, Target};
use std::ffi::c_void;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

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

/// libc's own `getenv`, called by its address: MemorySanitizer intercepts `getenv`, and its
/// interceptor calls through NULL until the runtime has set itself up, which is when its
/// `dlsym` runs `install` (libc's `getenv` calls nothing interposable).
fn getenv(name: &std::ffi::CStr) -> *const std::ffi::c_char {
    static REAL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let Some(p) = crate::sys::elf::slot(&REAL, c"getenv") else {
        return std::ptr::null();
    };
    type GetenvFn = unsafe extern "C" fn(*const std::ffi::c_char) -> *const std::ffi::c_char;
    // SAFETY: p is libc's getenv, of this prototype; `name` is NUL-terminated.
    unsafe { std::mem::transmute::<*mut c_void, GetenvFn>(p)(name.as_ptr()) }
}

fn env_is(name: &std::ffi::CStr, values: &[&[u8]]) -> Option<bool> {
    // The result is read before anything can change it.
    let v = getenv(name);
    if v.is_null() {
        return None;
    }
    // SAFETY: getenv returns a NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(v) }.to_bytes();
    Some(values.contains(&v))
}

/// Constructor part: find libc's pieces and decide whether `MRCACHE_MONITOR` asks for
/// libc's entry points to be patched (`patch_libc` does it, at the first registration).
/// Reads the environment with getenv only (no allocation), prints nothing: a bad value is
/// reported at the first registration. Runs once: from our constructor, or earlier from
/// `dlsym` when another library's constructor looks up a memory function before ours ran.
pub fn install() {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if STARTED.swap(true, Relaxed) {
        return;
    }
    // May run inside a sanitizer's set-up (its dlsym of a memory function): nothing here
    // calls what it intercepts (no dlopen, dl_iterate_phdr, malloc or pthread_*). The hooks
    // find libc's functions and the next definitions at their first call (`forward`).
    let h = crate::sys::elf::libc_handle();
    if h.is_null() {
        return;
    }
    LIBC.store(h, Relaxed);
    if !crate::sys::elf::walks_answer() {
        // Not preloaded (loaded with dlopen after libc, or dlmopen'ed): the hooks' lookups
        // are libc's dlsym, which must not run in a hook: made now, in the constructor.
        crate::monitor::forward::resolve_all();
        let _ = crate::sys::symbol::REALLOC.get();
        let _ = crate::sys::symbol::FORK.get();
        let _ = crate::sys::symbol::DLCLOSE.get();
    }
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
    PATCH_WANTED.store(true, Relaxed);
    if patching_needs_one_thread() {
        // Some entry can only be patched while no other thread runs: now, not at the first
        // registration, when the program usually has threads (docs/design/monitor.md, "When the
        // monitor is installed").
        patch_libc();
    }
}

/// Whether the constructor found `MRCACHE_MONITOR=patch` (the default) with caching on.
static PATCH_WANTED: AtomicBool = AtomicBool::new(false);

/// Patch libc's entry points, once, when `MRCACHE_MONITOR` asks for it: at the first
/// registration (`runtime::init`), for `mrcache info`'s self-test, and when a `dlsym` lookup
/// of one of libc's memory functions must be answered with libc's patched entry. Patching
/// is safe with the program's threads running (`cross_modify`). A process that never
/// registers memory keeps libc as it was.
pub fn patch_libc() {
    install();
    if !PATCH_WANTED.load(Relaxed) || !claim_patch() {
        return;
    }
    let h = LIBC.load(Relaxed);
    let targets = PatchTarget::ALL.map(|t| Target {
        name: t.name(),
        prologues: t.prologues(),
        hook: crate::monitor::memory::from_libc(t),
    });
    PATCHED.store(patch::install(h, &targets), Relaxed);
    // libc's own mprotect entry: glibc's internal `__mprotect` callers taking access away
    // invalidate (docs/design/monitor.md, "Protection changes"), and the patch check's watch
    // (unpatched, it never clears and every hit reads every site). Our own code pages are
    // made writable by raw system calls (cross_modify), which no hook sees.
    let mprotect = Target {
        name: c"mprotect",
        prologues: &patch::MPROTECT,
        hook: crate::monitor::memory::mprotect_from_libc as *const () as usize,
    };
    patch::MPROTECT_PATCHED.store(patch::patch(h, &mprotect).is_ok(), Relaxed);
    PATCH_DONE.store(true, Release);
}

/// The process whose thread patches (or patched) libc (0: none yet), that thread, and
/// whether it is done.
static PATCH_OWNER: AtomicI32 = AtomicI32::new(0);
static PATCH_TID: AtomicI32 = AtomicI32::new(0);
static PATCH_DONE: AtomicBool = AtomicBool::new(false);

/// How long a caller waits for another thread's patch of libc.
const PATCH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether the caller is to patch libc now. Once per process: a caller that finds another
/// thread of its process patching waits until it is done (at most `PATCH_WAIT`), so that no
/// caller goes on to create the cache before libc is patched; the patching thread come back
/// (a signal handler's `dlsym`) returns at once. A fork child whose parent was patching when
/// it forked (that thread is not in the child) patches itself when no jump was written yet
/// (its libc is as libc was: the patch's slow part, the membarrier registration, comes
/// first); one that inherited jumps keeps them and fails closed as before.
fn claim_patch() -> bool {
    let sys = |nr| crate::sys::syscall6(nr, 0, 0, 0, 0, 0, 0) as i32;
    let (me, tid) = (sys(libc::SYS_getpid), sys(libc::SYS_gettid));
    let mut seen = PATCH_OWNER.load(Acquire);
    loop {
        if seen == me {
            if PATCH_TID.load(Acquire) != tid {
                let deadline = std::time::Instant::now() + PATCH_WAIT;
                while !PATCH_DONE.load(Acquire) && std::time::Instant::now() < deadline {
                    std::thread::yield_now();
                }
            }
            return false;
        }
        if seen != 0 && (PATCH_DONE.load(Acquire) || patch::any_site_written()) {
            return false;
        }
        match PATCH_OWNER.compare_exchange(seen, me, AcqRel, Acquire) {
            Ok(_) => {
                PATCH_TID.store(tid, Release);
                return true;
            }
            Err(now) => seen = now,
        }
    }
}

/// Whether libc's entries can only be patched while the process has no other thread, so
/// that the constructor patches them rather than the first registration. aarch64: glibc
/// 2.36's brk, sbrk, mmap, mremap, shmdt and shmat start with an ordinary instruction, which
/// is patched only alone (`cross_modify::replace_word`). x86-64: every entry is patched with
/// threads running where the kernel offers SYNC_CORE membarriers (Linux 4.16+; one query,
/// which registers nothing).
fn patching_needs_one_thread() -> bool {
    if cfg!(not(target_arch = "x86_64")) {
        return true;
    }
    const MEMBARRIER_CMD_QUERY: usize = 0;
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: usize = 1 << 5;
    let offered = crate::sys::syscall6(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0, 0, 0, 0);
    offered < 0 || offered as usize & MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE == 0
}
