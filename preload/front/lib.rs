//! libmrcache.so, the front: the library the loader maps into every process of a job. It
//! exports every entry point mrcache interposes, each a jump through a slot, and holds
//! nothing else: no allocator, no runtime, no standard library (`no_std`, `panic=abort`,
//! built by `preload/build.rs`), so a process that never calls verbs pays only the loader's
//! mapping of a few pages (docs/design/overview.md, "The front and the engine").
//!
//! Before the engine is attached a memory call (and `dlclose`, `_Fork`) goes on to the next
//! definition of its name after the front, found at its first call by a walk of the
//! loader's list (`link_map`: no lock, no allocation, safe in allocators and signal
//! handlers). The first verbs call (or `mrcache info`'s exports, or a `dlsym` whose answer
//! depends on the engine) loads libmrcache_engine.so from beside the front, and the engine
//! fills every slot with its own entry point.

#![no_std]
#![deny(clippy::undocumented_unsafe_blocks)]

#[path = "../src/sys/front_abi.rs"]
#[allow(dead_code)]
mod front_abi;
#[path = "../src/sys/link_map.rs"]
#[allow(dead_code)]
mod link_map;

use core::ffi::{CStr, c_char, c_int, c_uint, c_void};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use front_abi::{DLSYM, DLVSYM, FrontInfo, Kind, SLOTS, slot};

/// Where each entry point goes: 0 until it is resolved (the next definition) or the engine
/// filled it. In `.bss`: the loader relocates nothing here.
static SLOT: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    let abort = link_map::libc_symbol(c"abort");
    if !abort.is_null() {
        // SAFETY: libc's abort, of this prototype; it does not return.
        unsafe { core::mem::transmute::<*mut c_void, extern "C" fn() -> !>(abort)() }
    }
    loop {
        core::hint::spin_loop();
    }
}

// `core` is built for unwinding and names the personality routine; with `panic=abort` no
// frame of the front unwinds, so a routine that is never called satisfies the reference
// (hidden: a program's own stays its own).
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".globl rust_eh_personality",
    ".hidden rust_eh_personality",
    ".type rust_eh_personality, @function",
    "rust_eh_personality:",
    "ud2",
);
#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".globl rust_eh_personality",
    ".hidden rust_eh_personality",
    ".type rust_eh_personality, %function",
    "rust_eh_personality:",
    "brk #1",
);

/// Exported so that tools (and tests) can tell the library is loaded: `dlsym(RTLD_DEFAULT,
/// "mrcache_version")` returns a NUL-terminated version string.
#[unsafe(no_mangle)]
pub static mrcache_version: [u8; VERSION.len() + 1] = {
    let mut out = [0u8; VERSION.len() + 1];
    let v = VERSION.as_bytes();
    let mut i = 0;
    while i < v.len() {
        out[i] = v[i];
        i += 1;
    }
    out
};
const VERSION: &str = env!("MRCACHE_VERSION");

// ---- the front itself: its load base, dynamic section and span, from its ELF header ----

/// <elf.h> Elf64_Ehdr and Elf64_Phdr, the fields read here.
#[repr(C)]
struct Ehdr {
    ident: [u8; 16],
    e_type: u16,
    e_machine: u16,
    e_version: u32,
    e_entry: u64,
    e_phoff: u64,
    e_shoff: u64,
    e_flags: u32,
    e_ehsize: u16,
    e_phentsize: u16,
    e_phnum: u16,
}
#[repr(C)]
struct Phdr {
    p_type: u32,
    p_flags: u32,
    p_offset: u64,
    p_vaddr: u64,
    p_paddr: u64,
    p_filesz: u64,
    p_memsz: u64,
    p_align: u64,
}
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;

unsafe extern "C" {
    /// The linker's symbol for our own ELF header, at the start of our first segment.
    static __ehdr_start: Ehdr;
}

/// The front's load base, dynamic section and span.
#[derive(Clone, Copy)]
struct Own {
    base: usize,
    dynamic: usize,
    lo: usize,
    hi: usize,
}

/// The front's ELF header's address and its program headers.
fn own_phdrs() -> (usize, &'static [Phdr]) {
    let ehdr = &raw const __ehdr_start;
    // SAFETY: our own ELF header and program headers, mapped in our first segment.
    let phdrs = unsafe {
        let e = &*ehdr;
        core::slice::from_raw_parts(
            (ehdr as usize + e.e_phoff as usize) as *const Phdr,
            e.e_phnum as usize,
        )
    };
    (ehdr as usize, phdrs)
}

fn own() -> Own {
    let (ehdr, phdrs) = own_phdrs();
    // The header is where the segment that maps file offset 0 was put.
    let base = phdrs
        .iter()
        .find(|p| p.p_type == PT_LOAD && p.p_offset == 0)
        .map_or(0, |p| ehdr.wrapping_sub(p.p_vaddr as usize));
    let (mut lo, mut hi) = (usize::MAX, 0usize);
    for ph in phdrs.iter().filter(|p| p.p_type == PT_LOAD) {
        let start = base.wrapping_add(ph.p_vaddr as usize);
        lo = lo.min(start);
        hi = hi.max(start.saturating_add(ph.p_memsz as usize));
    }
    let dynamic = phdrs
        .iter()
        .find(|p| p.p_type == PT_DYNAMIC)
        .map_or(0, |p| base.wrapping_add(p.p_vaddr as usize));
    Own {
        base,
        dynamic,
        lo: lo.min(hi),
        hi,
    }
}

// ---- libc, by its address ----

/// libc's function `name`, typed `F` (looked up once into `cache`).
fn libc<F: Copy>(cache: &AtomicPtr<c_void>, name: &CStr) -> Option<F> {
    let p = link_map::slot(cache, name)?;
    // SAFETY: the callers name F as the function's C prototype; p is non-null.
    Some(unsafe { core::mem::transmute_copy::<*mut c_void, F>(&p) })
}

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

fn libc_dlsym() -> Option<DlsymFn> {
    static AT: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
    libc(&AT, c"dlsym")
}

/// Set errno.
fn set_errno(e: c_int) {
    static AT: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
    if let Some(f) = libc::<unsafe extern "C" fn() -> *mut c_int>(&AT, c"__errno_location") {
        // SAFETY: __errno_location returns this thread's errno.
        unsafe { *f() = e };
    }
}

/// A system call through libc's `syscall`, which only issues it.
fn syscall(nr: i64, a: usize, b: usize, c: usize) -> i64 {
    static AT: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
    type SyscallFn = unsafe extern "C" fn(i64, usize, usize, usize) -> i64;
    match libc::<SyscallFn>(&AT, c"syscall") {
        // SAFETY: libc's variadic syscall takes the number and register-sized arguments.
        Some(f) => unsafe { f(nr, a, b, c) },
        None => -1,
    }
}

#[cfg(target_arch = "x86_64")]
mod nr {
    pub const WRITE: i64 = 1;
    pub const SCHED_YIELD: i64 = 24;
    pub const GETPID: i64 = 39;
    pub const MEMBARRIER: i64 = 324;
}
#[cfg(target_arch = "aarch64")]
mod nr {
    pub const WRITE: i64 = 64;
    pub const SCHED_YIELD: i64 = 124;
    pub const GETPID: i64 = 172;
    pub const MEMBARRIER: i64 = 283;
}

/// Write `parts` to stderr as one line.
fn say(parts: &[&[u8]]) {
    let mut line = [0u8; 1024];
    let mut n = 0;
    for p in parts.iter().chain([&b"\n"[..]].iter()) {
        let take = p.len().min(line.len() - n);
        line[n..n + take].copy_from_slice(&p[..take]);
        n += take;
    }
    syscall(nr::WRITE, 2, line.as_ptr() as usize, n);
}

/// The environment variable `name` (libc's getenv), if set.
fn env(name: &CStr) -> Option<&'static [u8]> {
    static AT: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
    type GetenvFn = unsafe extern "C" fn(*const c_char) -> *const c_char;
    let getenv = libc::<GetenvFn>(&AT, c"getenv")?;
    // SAFETY: libc's getenv with a NUL-terminated name.
    let v = unsafe { getenv(name.as_ptr()) };
    // SAFETY: getenv returns null or a NUL-terminated string of the environment, which the
    // front reads before the program can change it (constructor) or only compares.
    (!v.is_null()).then(|| unsafe { CStr::from_ptr(v) }.to_bytes())
}

/// Whether the environment variable `name` is one of `values` (None: unset).
fn env_is(name: &CStr, values: &[&[u8]]) -> Option<bool> {
    env(name).map(|v| values.contains(&v))
}

// ---- the slots ----

/// Where slot `i` leads now, resolving it first when it is empty.
fn target(i: usize) -> usize {
    let at = SLOT[i].load(Acquire);
    if at != 0 {
        return at;
    }
    match slot(i).1 {
        Kind::Forward => forward(i),
        Kind::Verbs | Kind::Engine => {
            let attached = attach();
            match SLOT[i].load(Acquire) {
                0 if !attached && STATE.load(Acquire) & 3 == FAILED => {
                    // For good: later calls go straight there.
                    let at = unattached(i);
                    match SLOT[i].compare_exchange(0, at, AcqRel, Acquire) {
                        Ok(_) => at,
                        Err(now) => now,
                    }
                }
                0 => unattached(i),
                at => at,
            }
        }
        Kind::Lookup => unattached(i),
    }
}

/// Resolve a `Forward` slot: the next definition of its name after the front.
fn forward(i: usize) -> usize {
    let own = own().base;
    let name = slot(i).0;
    let mut at = if link_map::walks_answer(own) {
        link_map::next_after(own, name) as usize
    } else {
        dlsym_next(name)
    };
    if at == 0 {
        at = unattached(i);
    }
    match SLOT[i].compare_exchange(0, at, AcqRel, Acquire) {
        Ok(_) => at,
        Err(now) => now,
    }
}

/// libc's `dlsym(RTLD_NEXT, name)` called from the front: the next definition after it.
fn dlsym_next(name: &CStr) -> usize {
    const RTLD_NEXT: usize = usize::MAX;
    let Some(dlsym) = libc_dlsym() else { return 0 };
    // SAFETY: call_from_front calls libc's dlsym, of a compatible prototype, from here.
    unsafe {
        call_from_front(
            dlsym as *const () as usize,
            RTLD_NEXT,
            name.as_ptr() as usize,
            0,
        )
    }
}

/// Where slot `i` leads without the engine and without a next definition: libc's
/// `dlsym`/`dlvsym`, libibverbs' function, or a function that fails (ENOSYS).
fn unattached(i: usize) -> usize {
    let (name, kind) = slot(i);
    match kind {
        Kind::Lookup => {
            static AT: [AtomicPtr<c_void>; 2] = [const { AtomicPtr::new(core::ptr::null_mut()) }; 2];
            link_map::slot(&AT[i - DLSYM], name).map_or(fails_null as *const () as usize, |p| p as usize)
        }
        Kind::Verbs => {
            let own = own().base;
            let mut at = if link_map::walks_answer(own) {
                link_map::next_after(own, name) as usize
            } else {
                dlsym_next(name)
            };
            if at == 0 {
                at = libibverbs_loaded_locally(name, i);
            }
            match (at, name.to_bytes().starts_with(b"ibv_reg_")) {
                (0, true) => fails_null as *const () as usize,
                (0, false) => returns_enosys as *const () as usize,
                (at, _) => at,
            }
        }
        Kind::Engine => returns_zero as *const () as usize,
        Kind::Forward if name == c"realloc" => fails_null as *const () as usize,
        Kind::Forward => fails as *const () as usize,
    }
}

extern "C" fn fails() -> isize {
    set_errno(38); // ENOSYS
    -1
}

extern "C" fn fails_null() -> *mut c_void {
    set_errno(38); // ENOSYS
    core::ptr::null_mut()
}

extern "C" fn returns_zero() -> usize {
    0
}

/// A verbs call that returns an error number (libibverbs returns them positive).
extern "C" fn returns_enosys() -> c_int {
    38 // ENOSYS
}

/// libibverbs' `name` at the version the front exports (slot `i`), where libibverbs was
/// loaded by a plugin with `RTLD_LOCAL` (NCCL's, an MPI's): through a `RTLD_NOLOAD` handle.
fn libibverbs_loaded_locally(name: &CStr, i: usize) -> usize {
    const RTLD_LAZY: c_int = 1;
    const RTLD_NOLOAD: c_int = 4;
    static DLOPEN: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
    static DLVSYM: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
    type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
    type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;
    let (Some(dlopen), Some(dlvsym)) = (
        libc::<DlopenFn>(&DLOPEN, c"dlopen"),
        libc::<DlvsymFn>(&DLVSYM, c"dlvsym"),
    ) else {
        return 0;
    };
    // SAFETY: RTLD_NOLOAD only returns a handle to an already loaded object (or NULL); the
    // reference it adds is kept (libibverbs stays while its functions are in the slots).
    let h = unsafe { dlopen(c"libibverbs.so.1".as_ptr(), RTLD_NOLOAD | RTLD_LAZY) };
    if h.is_null() {
        return 0;
    }
    // SAFETY: a live handle, NUL-terminated name and version.
    unsafe { dlvsym(h, name.as_ptr(), front_abi::verbs_version(i).as_ptr()) as usize }
}

/// Call `f(a, b, c)` from here: `dlsym(RTLD_NEXT)` reads its caller's address, and from
/// the front's code it starts after the front. Never a tail call (`black_box`).
///
/// # Safety
/// `f` must be a function taking three register-sized arguments (or fewer) and returning
/// one.
unsafe extern "C" fn call_from_front(f: usize, a: usize, b: usize, c: usize) -> usize {
    type F3 = unsafe extern "C" fn(usize, usize, usize) -> usize;
    // SAFETY: the caller's promise.
    let r = unsafe { core::mem::transmute::<usize, F3>(f)(a, b, c) };
    core::hint::black_box(r)
}

// ---- the engine's per-thread words ----

// `TLS_WORDS` words of every thread's TLS, and the function that returns this thread's.
// The front is loaded at start-up, so its block is part of the static TLS allocated with
// each thread, never by `malloc` at a first access as a dlopened object's is. Accessed
// through a TLS descriptor: for a block in the static TLS the loader's resolver returns its
// offset (no call into libc, no lock), and a front loaded with `dlopen` after the static
// TLS's spare room is used up still loads (its block is then dynamic).
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".section .tbss,\"awT\",@nobits",
    ".p2align 4",
    "mrcache_front_tls_block:",
    ".zero {size}",
    ".size mrcache_front_tls_block, {size}",
    ".text",
    ".globl mrcache_front_tls",
    ".hidden mrcache_front_tls",
    ".type mrcache_front_tls, @function",
    "mrcache_front_tls:",
    "subq $8, %rsp",
    "leaq mrcache_front_tls_block@TLSDESC(%rip), %rax",
    "call *mrcache_front_tls_block@TLSCALL(%rax)",
    "addq $8, %rsp",
    "addq %fs:0, %rax",
    "ret",
    ".size mrcache_front_tls, . - mrcache_front_tls",
    size = const front_abi::TLS_WORDS * 8,
    options(att_syntax),
);
#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".section .tbss,\"awT\",%nobits",
    ".p2align 4",
    "mrcache_front_tls_block:",
    ".zero {size}",
    ".size mrcache_front_tls_block, {size}",
    ".text",
    ".globl mrcache_front_tls",
    ".hidden mrcache_front_tls",
    ".type mrcache_front_tls, %function",
    "mrcache_front_tls:",
    "stp x29, x30, [sp, -16]!",
    "mov x29, sp",
    "adrp x0, :tlsdesc:mrcache_front_tls_block",
    "ldr x1, [x0, :tlsdesc_lo12:mrcache_front_tls_block]",
    "add x0, x0, :tlsdesc_lo12:mrcache_front_tls_block",
    ".tlsdesccall mrcache_front_tls_block",
    "blr x1",
    "mrs x1, tpidr_el0",
    "add x0, x0, x1",
    "ldp x29, x30, [sp], 16",
    "ret",
    ".size mrcache_front_tls, . - mrcache_front_tls",
    size = const front_abi::TLS_WORDS * 8,
);
unsafe extern "C" {
    fn mrcache_front_tls() -> *mut usize;
}

// ---- attaching the engine ----

/// The attach state and the process it belongs to, in one word: `pid << 2 | state`.
const NONE: u64 = 0;
const ATTACHING: u64 = 1;
const ATTACHED: u64 = 2;
const FAILED: u64 = 3;
static STATE: AtomicU64 = AtomicU64::new(NONE);

/// This thread is opening or attaching the engine (a word of the front's static TLS).
fn in_attach() -> *mut usize {
    // SAFETY: this thread's TLS_WORDS words; TLS_FRONT_IN_ATTACH is the front's own.
    unsafe { mrcache_front_tls().add(front_abi::TLS_FRONT_IN_ATTACH) }
}

/// Run `f` marked as inside `attach` on this thread.
fn marked<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: this thread's word, read and written by this thread only.
    unsafe { *in_attach() = 1 };
    let r = f();
    // SAFETY: as above.
    unsafe { *in_attach() = 0 };
    r
}

/// Load and attach the engine, once; whether it is attached. Every thread that needs the
/// engine `dlopen`s it itself: the loader serialises those calls, and one made while this
/// thread holds the loader's lock (a verbs call in a constructor that a `dlopen` runs)
/// loads it there, where waiting for another thread's `dlopen` would wait for ever. Only
/// the engine's attach function is called once; a thread that finds another in it waits for
/// that call (which takes no lock of the loader's where the front is preloaded), at most
/// `WAIT_NS`. This thread inside `attach` (a lookup made while the engine starts, a signal
/// handler) and a fork child of a process caught attaching go on without it: the call goes
/// to libibverbs, uncached.
#[inline(never)]
fn attach() -> bool {
    match STATE.load(Acquire) & 3 {
        ATTACHED => return true,
        FAILED => return false,
        _ => {}
    }
    // SAFETY: this thread's word.
    if unsafe { *in_attach() } != 0 {
        return false;
    }
    let pid = syscall(nr::GETPID, 0, 0, 0) as u64;
    // A fork child of a process caught in the attach call: without the engine for good (the
    // fallbacks are then kept in the slots, no dlopen per call).
    let now = STATE.load(Acquire);
    if now & 3 == ATTACHING && now >> 2 != pid {
        let _ = STATE.compare_exchange(now, pid << 2 | FAILED, AcqRel, Acquire);
        return STATE.load(Acquire) & 3 == ATTACHED;
    }
    let f = match marked(open_engine) {
        Ok(f) => f,
        Err(why) => return fail_once(pid, why),
    };
    loop {
        let now = STATE.load(Acquire);
        match now & 3 {
            ATTACHED => return true,
            FAILED => return false,
            ATTACHING if now >> 2 != pid => return false,
            ATTACHING => {
                if waited_too_long() {
                    return false;
                }
                syscall(nr::SCHED_YIELD, 0, 0, 0);
            }
            _ => {
                if !tls_is_static() {
                    return fail_once(
                        pid,
                        b"libmrcache.so was loaded with dlopen and its thread-local words are not in the static TLS (a hook inside malloc would allocate them)",
                    );
                }
                if STATE
                    .compare_exchange(now, pid << 2 | ATTACHING, AcqRel, Acquire)
                    .is_err()
                {
                    continue;
                }
                let ok = marked(|| call_attach(f));
                STATE.store(pid << 2 | if ok { ATTACHED } else { FAILED }, Release);
                if !ok {
                    say(&[b"mrcache: the engine beside libmrcache.so is from another build; verbs calls go to libibverbs uncached"]);
                }
                return ok;
            }
        }
    }
}

/// Mark the engine failed for the process (unless another thread attached it), saying why
/// once: whether it is attached.
fn fail_once(pid: u64, why: &[u8]) -> bool {
    let mut now = STATE.load(Acquire);
    while now & 3 == NONE {
        match STATE.compare_exchange(now, pid << 2 | FAILED, AcqRel, Acquire) {
            Ok(_) => {
                say(&[b"mrcache: ", why, b"; verbs calls go to libibverbs uncached"]);
                return false;
            }
            Err(n) => now = n,
        }
    }
    now & 3 == ATTACHED
}

/// Whether waiting for another thread's attach call has lasted 2 s: one deadline for the
/// process, set by the first waiter, so that after it no call waits again (a call that gave
/// up goes to libibverbs, which may call back into the front).
fn waited_too_long() -> bool {
    const WAIT_NS: u64 = 2_000_000_000;
    static DEADLINE: AtomicU64 = AtomicU64::new(0);
    let now = monotonic_ns();
    let deadline = match DEADLINE.compare_exchange(0, now + WAIT_NS, AcqRel, Acquire) {
        Ok(_) => now + WAIT_NS,
        Err(set) => set,
    };
    now > deadline
}

/// Whether this thread's TLS words are in the static TLS (always so for a front loaded at
/// start-up): a front loaded later with `dlopen` may get a block glibc allocates with
/// `malloc` at a thread's first access, which a hook inside malloc cannot wait for. The
/// static TLS lies below the thread pointer on x86-64 and above it on aarch64, within the
/// size glibc reports (`_dl_get_tls_static_info`; without it, assumed static).
fn tls_is_static() -> bool {
    let f = link_map::first_definition(c"_dl_get_tls_static_info");
    if f.is_null() {
        return true;
    }
    let (mut size, mut align) = (0usize, 0usize);
    type InfoFn = unsafe extern "C" fn(*mut usize, *mut usize);
    // SAFETY: ld.so's function of this prototype; it writes two size_t.
    unsafe { core::mem::transmute::<*mut c_void, InfoFn>(f)(&mut size, &mut align) };
    // SAFETY: this thread's words (allocated now if dynamic: attach runs outside hooks).
    let words = unsafe { mrcache_front_tls() } as usize;
    let tp = thread_pointer();
    if cfg!(target_arch = "x86_64") {
        words < tp && tp - words <= size
    } else {
        words >= tp && words - tp < size
    }
}

/// The thread pointer (x86-64: %fs base, read from its self-pointer; aarch64: TPIDR_EL0).
fn thread_pointer() -> usize {
    let tp: usize;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: %fs:0 holds the thread control block's own address (the x86-64 TLS ABI).
    unsafe {
        core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: reading TPIDR_EL0 has no effect.
    unsafe {
        core::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, preserves_flags))
    };
    tp
}

/// CLOCK_MONOTONIC in nanoseconds (libc's clock_gettime, served by the vDSO).
fn monotonic_ns() -> u64 {
    static AT: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
    type ClockFn = unsafe extern "C" fn(c_int, *mut [i64; 2]) -> c_int;
    let Some(f) = libc::<ClockFn>(&AT, c"clock_gettime") else {
        return 0;
    };
    let mut ts = [0i64; 2];
    // SAFETY: clock_gettime writes a struct timespec (two longs).
    unsafe { f(1, &mut ts) };
    (ts[0] as u64).wrapping_mul(1_000_000_000).wrapping_add(ts[1] as u64)
}

/// `dlopen` the engine from beside the front: its attach function, or why not.
#[inline(never)]
fn open_engine() -> Result<usize, &'static [u8]> {
    const RTLD_NOW: c_int = 2;
    let mut path = [0u8; 4096];
    let path = engine_path(&mut path).ok_or(&b"cannot tell the directory of libmrcache.so"[..])?;
    static DLOPEN: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
    type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
    let dlopen = libc::<DlopenFn>(&DLOPEN, c"dlopen").or_else(|| {
        // glibc before 2.34: dlopen is libdl's.
        let p = link_map::first_definition(c"dlopen");
        // SAFETY: dlopen's prototype.
        (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, DlopenFn>(p) })
    });
    let (Some(dlopen), Some(dlsym)) = (dlopen, libc_dlsym()) else {
        return Err(b"no dlopen in the process");
    };
    // SAFETY: dlopen with a NUL-terminated path (RTLD_LOCAL: the engine's symbols stay out
    // of the process's scope). Each thread's open adds a reference; none is dropped.
    let h = unsafe { dlopen(path.as_ptr() as *const c_char, RTLD_NOW) };
    if h.is_null() {
        static DLERROR: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
        return Err(libc::<unsafe extern "C" fn() -> *const c_char>(&DLERROR, c"dlerror")
            // SAFETY: dlerror returns null or a NUL-terminated message.
            .map(|f| unsafe { f() })
            .filter(|p| !p.is_null())
            // SAFETY: as above; the message stays until this thread's next dl* call.
            .map_or(&b"cannot load libmrcache_engine.so"[..], |p| unsafe {
                CStr::from_ptr(p)
            }
            .to_bytes()));
    }
    // SAFETY: libc's dlsym with the engine's handle and a NUL-terminated name.
    let f = unsafe { dlsym(h, front_abi::ATTACH.as_ptr()) };
    if f.is_null() {
        return Err(b"libmrcache_engine.so beside libmrcache.so is not mrcache's engine");
    }
    Ok(f as usize)
}

/// Call the engine's attach function `f`: whether it attached.
fn call_attach(f: usize) -> bool {
    let me = own();
    let info = FrontInfo {
        abi: front_abi::ABI,
        base: me.base,
        dynamic: me.dynamic,
        lo: me.lo,
        hi: me.hi,
        last_at_start: link_map::last_at_start(),
        slots: SLOT.as_ptr(),
        call_from_front,
        tls: mrcache_front_tls,
    };
    type AttachFn = unsafe extern "C" fn(*const FrontInfo) -> c_int;
    // SAFETY: the engine's attach function, of this prototype (front_abi::ATTACH).
    unsafe { core::mem::transmute::<usize, AttachFn>(f)(&info) == 1 }
}

/// The engine's path, NUL-terminated in `out`: beside the file the front was mapped from,
/// as the kernel names it (`/proc/self/map_files`: absolute, symbolic links resolved, right
/// even after the program left the directory a relative `LD_PRELOAD` path was relative to),
/// else beside the loader's name for the front, symbolic links resolved.
fn engine_path(out: &mut [u8; PATH_MAX]) -> Option<&[u8]> {
    // The front's file's path first, in `out` itself (one page of stack: the first verbs
    // call may come on a thread with a small stack).
    let n = match mapped_file(out) {
        Some(n) => n,
        None => {
            let map = own_map()?;
            if map.l_name.is_null() {
                return None;
            }
            // SAFETY: l_name is the loader's NUL-terminated path of the object.
            let name = unsafe { CStr::from_ptr(map.l_name) };
            static REALPATH: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
            type RealpathFn = unsafe extern "C" fn(*const c_char, *mut u8) -> *mut u8;
            match libc::<RealpathFn>(&REALPATH, c"realpath") {
                // SAFETY: realpath reads a NUL-terminated path and writes at most PATH_MAX
                // bytes into out.
                Some(f) if !unsafe { f(name.as_ptr(), out.as_mut_ptr()) }.is_null() => {
                    out.iter().position(|&b| b == 0).unwrap_or(0)
                }
                _ => {
                    let name = name.to_bytes();
                    let k = name.len().min(PATH_MAX - 1);
                    out[..k].copy_from_slice(&name[..k]);
                    k
                }
            }
        }
    };
    // The file name replaced by the engine's.
    let dir = match out[..n].iter().rposition(|&b| b == b'/') {
        Some(k) => k + 1,
        None => {
            out[0] = b'.';
            out[1] = b'/';
            2
        }
    };
    let n = dir + front_abi::ENGINE_FILE.len();
    if n + 1 > out.len() {
        return None;
    }
    out[dir..n].copy_from_slice(front_abi::ENGINE_FILE);
    out[n] = 0;
    Some(&out[..n])
}

const PATH_MAX: usize = 4096;

/// The path of the file the front's first segment is mapped from, read from
/// `/proc/self/map_files/START-END` into `out` (its length; None where that cannot be read).
fn mapped_file(out: &mut [u8; PATH_MAX]) -> Option<usize> {
    let (ehdr, phdrs) = own_phdrs();
    let first = phdrs.iter().find(|p| p.p_type == PT_LOAD && p.p_offset == 0)?;
    // The kernel's page (4, 16 or 64 KiB on aarch64): the mapping's bounds.
    static GETAUXVAL: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
    const AT_PAGESZ: u64 = 6;
    let getauxval = libc::<unsafe extern "C" fn(u64) -> u64>(&GETAUXVAL, c"getauxval")?;
    // SAFETY: getauxval only reads the auxiliary vector.
    let page = unsafe { getauxval(AT_PAGESZ) } as usize;
    if !page.is_power_of_two() {
        return None;
    }
    let start = ehdr & !(page - 1);
    let end = (ehdr + first.p_filesz as usize + page - 1) & !(page - 1);
    let mut link = [0u8; 64];
    let mut n = 0;
    let mut put = |bytes: &[u8]| {
        for &b in bytes {
            link[n] = b;
            n += 1;
        }
    };
    put(b"/proc/self/map_files/");
    let hex = |v: usize, put: &mut dyn FnMut(&[u8])| {
        let digits = (usize::BITS - v.leading_zeros()).div_ceil(4).max(1);
        for k in (0..digits).rev() {
            put(&[b"0123456789abcdef"[(v >> (4 * k)) & 0xf]]);
        }
    };
    hex(start, &mut put);
    put(b"-");
    hex(end, &mut put);
    static READLINK: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
    type ReadlinkFn = unsafe extern "C" fn(*const u8, *mut u8, usize) -> isize;
    let readlink = libc::<ReadlinkFn>(&READLINK, c"readlink")?;
    // SAFETY: a NUL-terminated path (link is zeroed past n) and a buffer of PATH_MAX bytes.
    let k = unsafe { readlink(link.as_ptr(), out.as_mut_ptr(), PATH_MAX - 1) };
    (k > 0 && out[0] == b'/').then_some(k as usize)
}

// ---- the constructor ----

/// Set when the constructor has run: before it (another library's constructor, a
/// sanitizer's set-up) a lookup never loads the engine.
static CONSTRUCTED: AtomicBool = AtomicBool::new(false);

/// Notes which objects were loaded at start-up; where the front was not preloaded
/// (`dlopen`, `dlmopen`), asks libc's `dlsym` now for every name a memory call forwards to
/// (a hook may run inside an allocator, where `dlsym` must not). The engine is loaded here
/// only where libc's entries can be patched only while the process has one thread
/// (aarch64, or x86-64 without SYNC_CORE membarriers) and `MRCACHE_MONITOR` asks for
/// patching with caching on: patching happens at the engine's start.
extern "C" fn init() {
    CONSTRUCTED.store(true, Release);
    let own = own().base;
    if !link_map::walks_answer(own) {
        for i in (0..SLOTS).filter(|&i| slot(i).1 == Kind::Forward) {
            forward(i);
        }
    }
    let patch = env_is(c"MRCACHE_MONITOR", &[b"patch"]) != Some(false);
    let disabled = env_is(c"MRCACHE_ENABLE", &[b"0", b"off", b"false", b"no"]) == Some(true);
    if patch && !disabled && patching_needs_one_thread() {
        attach();
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;

/// aarch64: glibc's entries start with ordinary instructions, patched only alone. x86-64:
/// every entry is patched with threads running where the kernel offers SYNC_CORE
/// membarriers (one query, which registers nothing).
fn patching_needs_one_thread() -> bool {
    if cfg!(not(target_arch = "x86_64")) {
        return true;
    }
    const QUERY: usize = 0;
    const PRIVATE_EXPEDITED_SYNC_CORE: i64 = 1 << 5;
    let offered = syscall(nr::MEMBARRIER, QUERY, 0, 0);
    offered < 0 || offered & PRIVATE_EXPEDITED_SYNC_CORE == 0
}

// ---- the entry points ----

/// An entry point: a call through its slot with the caller's arguments.
macro_rules! entry {
    ($i:expr, $name:ident ( $($a:ident : $t:ty),* ) -> $r:ty) => {
        /// # Safety
        /// The C function's contract (the call goes on unchanged).
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $r {
            type F = unsafe extern "C" fn($($t),*) -> $r;
            const { assert!(slot($i).0.to_bytes().len() == stringify!($name).len()) };
            // SAFETY: slot $i leads to a function of this prototype (the next definition
            // of the name, the engine's hook, or a fallback that ignores its arguments).
            unsafe { core::mem::transmute::<usize, F>(target($i))($($a),*) }
        }
    };
}

entry!(0, munmap(addr: *mut c_void, len: usize) -> c_int);
entry!(1, madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int);
entry!(2, mremap(old: *mut c_void, old_len: usize, new_len: usize, flags: c_int, new: *mut c_void) -> *mut c_void);
entry!(3, mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void);
entry!(4, mmap64(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void);
entry!(5, brk(addr: *mut c_void) -> c_int);
entry!(6, sbrk(incr: isize) -> *mut c_void);
entry!(7, shmat(id: c_int, addr: *const c_void, flags: c_int) -> *mut c_void);
entry!(8, shmdt(addr: *const c_void) -> c_int);
entry!(9, realloc(p: *mut c_void, size: usize) -> *mut c_void);
entry!(10, mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int);
entry!(11, pkey_mprotect(addr: *mut c_void, len: usize, prot: c_int, pkey: c_int) -> c_int);
entry!(12, posix_madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int);
entry!(13, process_madvise(fd: c_int, iov: *const c_void, n: usize, advice: c_int, flags: c_uint) -> isize);
entry!(14, remap_file_pages(addr: *mut c_void, len: usize, prot: c_int, pgoff: usize, flags: c_int) -> c_int);
entry!(15, dlclose(handle: *mut c_void) -> c_int);
entry!(16, _Fork() -> i32);
entry!(26, mrcache_selftest_report(buf: *mut u8, len: usize) -> usize);
entry!(27, mrcache_patch_watch_clean() -> c_int);

/// A verbs entry point, exported under libibverbs' symbol version (`libmrcache.map`) as an
/// alias defined with `global_asm!` (rustc's own version script exports every `no_mangle`
/// name unversioned).
macro_rules! verbs {
    ($i:expr, $export:literal = $name:ident ( $($a:ident : $t:ty),* ) -> $r:ty) => {
        unsafe extern "C" fn $name($($a: $t),*) -> $r {
            type F = unsafe extern "C" fn($($t),*) -> $r;
            // SAFETY: slot $i leads to a function of this prototype (the engine's hook,
            // libibverbs' function, or a fallback that ignores its arguments).
            unsafe { core::mem::transmute::<usize, F>(target($i))($($a),*) }
        }
        core::arch::global_asm!(
            concat!(".globl ", $export),
            concat!(".type ", $export, ", @function"),
            concat!(".set ", $export, ", {f}"),
            f = sym $name,
        );
    };
}

type P = *mut c_void;
verbs!(17, "ibv_reg_mr" = reg_mr(pd: P, addr: P, len: usize, access: c_int) -> P);
verbs!(18, "ibv_reg_mr_iova" = reg_mr_iova(pd: P, addr: P, len: usize, iova: u64, access: c_int) -> P);
verbs!(19, "ibv_reg_mr_iova2" = reg_mr_iova2(pd: P, addr: P, len: usize, iova: u64, access: c_uint) -> P);
verbs!(20, "ibv_dereg_mr" = dereg_mr(mr: P) -> c_int);
verbs!(21, "ibv_rereg_mr" = rereg_mr(mr: P, flags: c_int, pd: P, addr: P, len: usize, access: c_int) -> c_int);
verbs!(22, "ibv_reg_dmabuf_mr" = reg_dmabuf_mr(pd: P, off: u64, len: usize, iova: u64, fd: c_int, access: c_int) -> P);
verbs!(23, "ibv_dealloc_pd" = dealloc_pd(pd: P) -> c_int);
verbs!(24, "ibv_close_device" = close_device(ctx: P) -> c_int);
verbs!(25, "ibv_fork_init" = fork_init() -> c_int);

/// Before the engine is attached, where `dlsym`/`dlvsym` (slot `i`) go with the caller's
/// arguments: the engine's entry point for a verbs name (the engine is attached for it);
/// libc's function for any other name, except where the answer would be the front's own
/// entry point of a memory function that the patch monitor patches in libc (UCX's bistro,
/// a profiler preloaded before the front): that answer (`*out`, 0 returned) is what it would
/// be without mrcache, the next definition after the front (libc's entry, which the engine
/// patches at its start and chains to whatever another patcher wrote there), so that no
/// patcher writes its jump over the front's code. The engine answers the same way.
extern "C" fn lookup_target(
    handle: *mut c_void,
    name: *const c_char,
    i: usize,
    caller: usize,
    out: *mut *mut c_void,
) -> usize {
    if !name.is_null() {
        // SAFETY: dlsym's name is a NUL-terminated string.
        let wanted = unsafe { CStr::from_ptr(name) };
        let kind = front_abi::slot_of(wanted.to_bytes()).map(|k| slot(k).1);
        if kind == Some(Kind::Verbs) && CONSTRUCTED.load(Acquire) && attach() {
            let at = SLOT[i].load(Acquire);
            if at != 0 {
                return at;
            }
        }
        if i == DLSYM && PATCHED.contains(&wanted.to_bytes()) && patch_monitor() {
            if let Some(answer) = memory_answer(handle, wanted, caller) {
                // SAFETY: out is the entry point's stack slot.
                unsafe { *out = answer };
                return 0;
            }
        }
    }
    target(i)
}

/// The memory functions the patch monitor patches in libc (`monitor::patch::PatchTarget`).
const PATCHED: [&[u8]; 8] = [
    b"munmap", b"madvise", b"brk", b"mmap", b"mremap", b"shmdt", b"sbrk", b"shmat",
];

/// Whether `MRCACHE_MONITOR` and `MRCACHE_ENABLE` ask for libc to be patched (the default).
fn patch_monitor() -> bool {
    env_is(c"MRCACHE_MONITOR", &[b"patch"]) != Some(false)
        && env_is(c"MRCACHE_ENABLE", &[b"0", b"off", b"false", b"no"]) != Some(true)
}

/// `dlsym(handle, name)` for a memory function the monitor patches, when libc's answer
/// would be the front's own entry point: the next definition after the front. None: libc's
/// answer stands.
fn memory_answer(handle: *mut c_void, name: &CStr, caller: usize) -> Option<*mut c_void> {
    const RTLD_NEXT: *mut c_void = usize::MAX as *mut c_void;
    const RTLD_DEFAULT: *mut c_void = core::ptr::null_mut();
    let me = own();
    // SAFETY: the front's own mapped dynamic section and base.
    let ours = unsafe {
        link_map::lookup_gnu_hash(me.base, me.dynamic as *const link_map::Dyn, name)
    }
    .filter(|&a| a != 0)?;
    let dlsym = libc_dlsym()?;
    if handle == RTLD_NEXT {
        if !front_comes_next(caller, name, me.base) {
            return None;
        }
        // A lookup that succeeds, as the caller's would have: it clears a pending dlerror().
        // SAFETY: libc's dlsym with a pseudo-handle and the caller's name.
        unsafe { dlsym(RTLD_DEFAULT, name.as_ptr()) };
    } else {
        // SAFETY: libc's dlsym with the caller's handle and name (a handle or RTLD_DEFAULT
        // answers the same for every caller of the base namespace).
        let found = unsafe { dlsym(handle, name.as_ptr()) };
        if found as usize != ours {
            return Some(found);
        }
    }
    let next = if link_map::walks_answer(me.base) {
        link_map::next_after(me.base, name) as usize
    } else {
        dlsym_next(name)
    };
    Some(if next == 0 { ours } else { next } as *mut c_void)
}

/// The link map of the object holding `addr` (`dladdr1`, which takes the loader's lock).
fn map_of(addr: usize) -> Option<&'static link_map::LinkMap> {
    static AT: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
    type Dladdr1Fn =
        unsafe extern "C" fn(*const c_void, *mut [usize; 4], *mut *mut c_void, c_int) -> c_int;
    const RTLD_DL_LINKMAP: c_int = 2;
    let dladdr1 = libc::<Dladdr1Fn>(&AT, c"dladdr1").or_else(|| {
        // glibc before 2.34: dladdr1 is libdl's.
        let p = link_map::first_definition(c"dladdr1");
        // SAFETY: dladdr1's prototype.
        (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, Dladdr1Fn>(p) })
    })?;
    let (mut info, mut map) = ([0usize; 4], core::ptr::null_mut());
    // SAFETY: dladdr1 only reads the loader's tables and writes info and map.
    if unsafe { dladdr1(addr as *const c_void, &mut info, &mut map, RTLD_DL_LINKMAP) } == 0 {
        return None;
    }
    // SAFETY: a link map the loader keeps while the object is loaded (the caller's code, or
    // ours, is running).
    unsafe { (map as *const link_map::LinkMap).as_ref() }
}

/// The front's own link map.
fn own_map() -> Option<&'static link_map::LinkMap> {
    map_of(own_map as *const () as usize)
}

/// Whether `dlsym(RTLD_NEXT, name)` from `caller` finds the front's definition: the caller's
/// object is in the loader's list before the front, and no object between them defines it.
fn front_comes_next(caller: usize, name: &CStr, front: usize) -> bool {
    let Some(map) = map_of(caller) else {
        return false;
    };
    let mut m = map as *const link_map::LinkMap;
    // SAFETY: m is the caller's link_map; the objects after it up to the front were loaded
    // at start-up (the front is preloaded) and stay.
    unsafe {
        if m.is_null() || (*m).l_addr == front {
            return false;
        }
        m = (*m).l_next;
        while let Some(o) = m.as_ref() {
            if o.l_addr == front {
                return true;
            }
            if link_map::defines(o, name) {
                return false;
            }
            m = o.l_next;
        }
    }
    false
}

// `dlsym` and `dlvsym`: the caller's return address must reach libc's function (RTLD_NEXT
// is resolved relative to it), so these jump, never call: through the slot once the engine
// filled it, else to where `lookup_target` says, the arguments restored, or they return its
// answer. Stack (x86-64): entry rsp = 8 mod 16; the pushes and the out slot keep the call
// 16-byte aligned.
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".globl dlsym",
    ".globl mrcache_dlsym_2_2_5",
    ".symver mrcache_dlsym_2_2_5, dlsym@GLIBC_2.2.5",
    ".type dlsym, @function",
    ".type mrcache_dlsym_2_2_5, @function",
    "dlsym:",
    "mrcache_dlsym_2_2_5:",
    "mov r11, qword ptr [rip + {slots} + {dlsym} * 8]",
    "test r11, r11",
    "jz 2f",
    "jmp r11",
    "2:",
    "push rdi",
    "push rsi",
    "sub rsp, 24",
    "mov edx, {dlsym}",
    "mov rcx, qword ptr [rsp + 40]",
    "mov r8, rsp",
    "call {target}",
    "mov r11, rax",
    "mov rax, qword ptr [rsp]",
    "add rsp, 24",
    "pop rsi",
    "pop rdi",
    "test r11, r11",
    "jz 3f",
    "jmp r11",
    "3:",
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
    "mov r11, qword ptr [rip + {slots} + {dlvsym} * 8]",
    "test r11, r11",
    "jz 2f",
    "jmp r11",
    "2:",
    "push rdi",
    "push rsi",
    "push rdx",
    "sub rsp, 16",
    "mov edx, {dlvsym}",
    "mov rcx, qword ptr [rsp + 40]",
    "mov r8, rsp",
    "call {target}",
    "mov r11, rax",
    "mov rax, qword ptr [rsp]",
    "add rsp, 16",
    "pop rdx",
    "pop rsi",
    "pop rdi",
    "test r11, r11",
    "jz 3f",
    "jmp r11",
    "3:",
    "ret",
    ".size dlvsym, . - dlvsym",
    slots = sym SLOT,
    target = sym lookup_target,
    dlsym = const DLSYM,
    dlvsym = const DLVSYM,
);

#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".globl dlsym",
    ".globl mrcache_dlsym_2_17",
    ".symver mrcache_dlsym_2_17, dlsym@GLIBC_2.17",
    ".type dlsym, %function",
    ".type mrcache_dlsym_2_17, %function",
    "dlsym:",
    "mrcache_dlsym_2_17:",
    "adrp x16, {slots} + {dlsym} * 8",
    "ldr x16, [x16, :lo12:{slots} + {dlsym} * 8]",
    "cbz x16, 2f",
    "br x16",
    "2:",
    "mov x2, {dlsym}",
    "b 4f",
    ".size dlsym, . - dlsym",
    "",
    ".globl dlvsym",
    ".globl mrcache_dlvsym_2_17",
    ".symver mrcache_dlvsym_2_17, dlvsym@GLIBC_2.17",
    ".type dlvsym, %function",
    ".type mrcache_dlvsym_2_17, %function",
    "dlvsym:",
    "mrcache_dlvsym_2_17:",
    "adrp x16, {slots} + {dlvsym} * 8",
    "ldr x16, [x16, :lo12:{slots} + {dlvsym} * 8]",
    "cbz x16, 2f",
    "br x16",
    "2:",
    "stp x29, x30, [sp, -48]!",
    "mov x29, sp",
    "stp x0, x1, [sp, 16]",
    "str x2, [sp, 32]",
    "mov x2, {dlvsym}",
    "b 5f",
    // dlsym's slow path: the same frame (x2, not an argument of dlsym, is saved anyway).
    "4:",
    "stp x29, x30, [sp, -48]!",
    "mov x29, sp",
    "stp x0, x1, [sp, 16]",
    "str x2, [sp, 32]",
    "5:",
    "mov x3, x30",
    "add x4, sp, 40",
    "bl {target}",
    "mov x16, x0",
    "ldr x0, [sp, 40]",
    "cbz x16, 6f",
    "ldp x0, x1, [sp, 16]",
    "ldr x2, [sp, 32]",
    "ldp x29, x30, [sp], 48",
    "br x16",
    "6:",
    "ldp x29, x30, [sp], 48",
    "ret",
    ".size dlvsym, . - dlvsym",
    slots = sym SLOT,
    target = sym lookup_target,
    dlsym = const DLSYM,
    dlvsym = const DLVSYM,
);
