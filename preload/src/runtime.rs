//! The process-wide state behind the hooks and what each hook does. Created at the first
//! verbs call, never in the constructor, so a process that never touches verbs reads no
//! configuration, prints nothing and starts nothing.

use crate::ffi::{self, IbvContext, IbvMr, IbvPd};
use crate::fork;
use crate::memory::{self, QUEUE};
use crate::once::InitOnce;
use crate::provider::Provider;
use crate::real;
use crate::selftest::{self, Coverage};
use crate::trace;
use mrcache::access::Bypass;
use mrcache::cache::{AcquireError, Cache, Detached, Limits, Released, Request};
use mrcache::config::{self, LogLevel, Monitor, StatsMode};
use mrcache::stats::Report;
use mrcache::trace::{Call, Outcome};
use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, Ordering::*};

pub struct Runtime {
    pub cache: Option<Cache<Provider>>,
    pub monitor: Monitor,
    pub coverage: Option<Coverage>,
    pub fork: Option<fork::Decision>,
    pub log: LogLevel,
    pub stats: StatsMode,
    pub stats_file: Option<String>,
}

/// Registrations passed to libibverbs untouched, by reason (`Bypass`, plus a NULL pd, a
/// panic, remote access, and a call made while another thread sets the library up).
static BYPASSED: [AtomicU64; 10] = [const { AtomicU64::new(0) }; 10];
const BYPASS_NAMES: [&str; 10] = [
    "on-demand",
    "zero-based",
    "unknown-access-flags",
    "bad-range",
    "nested",
    "disabled",
    "null-pd",
    "panic",
    "remote-access",
    "setting-up",
];

fn bypass_index(b: Bypass) -> usize {
    match b {
        Bypass::OnDemand => 0,
        Bypass::ZeroBased => 1,
        Bypass::UnknownFlags => 2,
        Bypass::BadRange => 3,
        Bypass::Nested => 4,
        Bypass::Disabled => 5,
        Bypass::Remote => 8,
    }
}

static FORKS: AtomicU64 = AtomicU64::new(0);
static FORK_FLUSHED: AtomicU64 = AtomicU64::new(0);
static FORK_DONTFORKED: AtomicU64 = AtomicU64::new(0);
static DRAIN_RUNNING: AtomicBool = AtomicBool::new(false);

/// One line on stderr at or above the configured level (`MRCACHE_LOG`). Only ever called
/// from verbs calls and fork handlers, never from memory hooks.
pub fn log(level: LogLevel, msg: std::fmt::Arguments<'_>) {
    if RUNTIME.get().is_some_and(|r| r.log >= level) {
        trace::write_line(&format!("mrcache[{}]: {msg}", std::process::id()));
    }
}

static RUNTIME: InitOnce<Runtime> = InitOnce::new();

/// The runtime, set up at the first call; None while another thread sets it up (the caller
/// passes through instead of waiting: see `once`).
fn runtime() -> Option<&'static Runtime> {
    RUNTIME.get_or_init(|| {
        test_init_delay();
        let phys = config::physical_memory();
        let vars = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())));
        let (config, problems) = config::parse(vars, phys);
        for p in &problems {
            eprintln!("{p}");
        }
        trace::set_log_file(config.log_file.as_deref());
        if config.stats != StatsMode::Off && !STATS_AT_EXIT.swap(true, SeqCst) {
            // SAFETY: registering a plain extern "C" fn with atexit.
            unsafe { libc::atexit(print_stats) };
        }
        if config.log >= LogLevel::Trace {
            trace::start(config.trace_buffer);
        }
        if config.enabled && config.monitor == Monitor::None {
            eprintln!(
                "mrcache: WARNING: MRCACHE_MONITOR=none: unmapped and freed memory is NOT tracked; cached registrations can go stale and remote writes can land in memory that no longer belongs to the buffer. For tests only."
            );
        }
        let mut coverage = None;
        let mut blind = None;
        let cache = config.enabled.then(|| {
            let c = run_selftest();
            let missed = c.missed();
            if config.monitor != Monitor::None && !missed.is_empty() {
                blind = Some(blind_spots(config.monitor, &missed));
            }
            coverage = Some(c);
            let mut verify = config.verify_pfn;
            if verify && !pagemap_shows_frames() {
                eprintln!("mrcache: MRCACHE_VERIFY=pfn needs root (CAP_SYS_ADMIN) to read page frame numbers from /proc/self/pagemap; verification is off");
                verify = false;
            }
            Cache::with_queue(
                Provider::new(verify),
                Limits {
                    max_entries: config.max_entries,
                    max_bytes: config.max_bytes,
                    shadow: config.shadow,
                    remote_superset: config.remote_superset,
                },
                &QUEUE,
            )
            .with_remote(config.remote)
        });
        if let Some(cache) = &cache {
            if let Some(why) = blind {
                fail_closed(cache, &why);
            } else if config.monitor == Monitor::Patch {
                check_patches(cache);
            }
        }
        let fork = cache.as_ref().map(|_| {
            // Once per address space: a fork child that takes the set-up over inherits the
            // parent's registrations (and this flag), and handlers registered twice would
            // run prepare twice and block on the lock the first one holds.
            if !ATFORK_REGISTERED.swap(true, SeqCst) {
                // SAFETY: registering plain extern "C" handlers.
                unsafe { libc::pthread_atfork(Some(fork::prepare), Some(fork::parent), Some(fork::child)) };
            }
            fork::decide(config.fork)
        });
        if let (Some(d), Some(c)) = (&fork, &coverage)
            && config.log >= LogLevel::Info
        {
            let pid = std::process::id();
            trace::write_line(&format!("mrcache[{pid}]: monitor {}; self-test {:.0} us: {}", config.monitor.as_str(), c.nanos as f64 / 1e3, c.summary()));
            trace::write_line(&format!("mrcache[{pid}]: fork policy: {}", d.why));
        }
        Runtime { cache, monitor: config.monitor, coverage, fork, log: config.log, stats: config.stats, stats_file: config.stats_file.clone() }
    })
}

/// What the monitor misses, and why, for the line that turns caching off.
fn blind_spots(monitor: Monitor, missed: &[&str]) -> String {
    let mut why = Vec::new();
    if monitor == Monitor::Patch {
        // One clause per reason: "libc's munmap, madvise were not patched: <why>".
        let refused: Vec<(&str, crate::patch::PatchError)> = memory::PATCH_TARGETS
            .iter()
            .enumerate()
            .filter_map(|(i, name)| Some((*name, crate::patch::refused(i)?)))
            .collect();
        let mut reasons: Vec<crate::patch::PatchError> = refused.iter().map(|r| r.1).collect();
        reasons.dedup();
        for e in reasons {
            let names: Vec<&str> = refused.iter().filter(|r| r.1 == e).map(|r| r.0).collect();
            why.push(format!(
                "libc's {} not patched: {}",
                names.join(", "),
                e.why()
            ));
        }
        if let Some(name) = crate::patch::overwritten() {
            why.push(format!(
                "libc's {} was patched, then overwritten by another code patcher",
                name.to_string_lossy()
            ));
        }
    } else {
        why.push(format!("monitor '{}' only sees calls through the symbol table (MRCACHE_MONITOR=patch also sees libc's own calls)", monitor.as_str()));
    }
    format!(
        "the monitor does not see: {} ({})",
        missed.join(", "),
        why.join("; ")
    )
}

/// Memory could now go away unseen: stop caching (one line, once). Registrations are made
/// and released uncached from here on; entries in use are deregistered at their release.
fn fail_closed(cache: &Cache<Provider>, why: &str) {
    if cache.stop_caching(why) {
        trace::write_line(&format!(
            "mrcache[{}]: caching is OFF: {why}; every registration now passes through uncached",
            std::process::id()
        ));
    }
}

/// Fail closed when another patcher wrote over one of our jumps in libc. A few byte
/// compares: run at the cache's creation, before every registration and on every
/// background drain cycle.
fn check_patches(cache: &Cache<Provider>) {
    if cache.caching_stopped().is_some() {
        return;
    }
    if let Some(name) = crate::patch::overwritten() {
        fail_closed(
            cache,
            &format!(
                "the {} entry point (libc's, or mrcache's own hook) was overwritten by another code patcher (UCX, Open MPI, libfabric, a profiler?) after mrcache's start; memory released through it is no longer seen",
                name.to_string_lossy()
            ),
        );
    }
}

/// Test-only: `MRCACHE_TEST_INIT_DELAY_MS` stalls the set-up at the first verbs call, so a
/// test can fork (or call from another thread) while it is in progress.
fn test_init_delay() {
    if let Some(ms) = std::env::var("MRCACHE_TEST_INIT_DELAY_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// A child of `_Fork()` (which may run in a signal handler, so it cannot lock or allocate)
/// still has the parent's cache, whose lock a parent thread may hold forever: its first
/// call replaces the cache. 0: current; 1: replace at the next call; 2: being replaced.
static RENEW: AtomicU8 = AtomicU8::new(0);
static RENEWED: AtomicPtr<Cache<Provider>> = AtomicPtr::new(std::ptr::null_mut());
/// Set by `_Fork()` in the parent when idle entries must go at fork: the next registration
/// deregisters them before it looks anything up.
static FLUSH_AFTER_FORK: AtomicBool = AtomicBool::new(false);
/// `_Fork()` calls begun and finished, twice each (odd while one is in progress): a lookup
/// meanwhile passes through uncached, so no registration made during it survives it idle.
static FORK_GEN: AtomicU64 = AtomicU64::new(0);
/// Process-wide registrations made once per address space (inherited by fork children).
static STATS_AT_EXIT: AtomicBool = AtomicBool::new(false);
static ATFORK_REGISTERED: AtomicBool = AtomicBool::new(false);

/// The cache, once set up (and not off); None also while a `_Fork` child's first call on
/// another thread is replacing it.
fn cache() -> Option<&'static Cache<Provider>> {
    let first = RUNTIME.get()?.cache.as_ref()?;
    if RENEW.load(Acquire) != 0 {
        match RENEW.compare_exchange(1, 2, AcqRel, Acquire) {
            Ok(_) => {
                let fresh = Cache::with_queue(
                    Provider::new(first.registrar().verify),
                    first.limits(),
                    &QUEUE,
                );
                RENEWED.store(Box::leak(Box::new(fresh)), Release);
                RENEW.store(0, Release);
            }
            Err(0) => {}
            Err(_) => return None,
        }
    }
    let p = RENEWED.load(Acquire);
    // SAFETY: a non-null RENEWED is a leaked Box, never freed.
    Some(if p.is_null() { first } else { unsafe { &*p } })
}

/// `_Fork()`, before the real call, in the forking process: only atomic stores (it may run
/// in a signal handler that interrupted a thread holding the cache lock or the allocator's).
pub fn before_signal_safe_fork() {
    FORK_GEN.fetch_add(1, SeqCst);
    FORKS.fetch_add(1, Relaxed);
}

/// `_Fork()` returned in the parent: idle entries (the ones cached before it and during it)
/// are flushed before the next lookup, when the policy says so. Only atomic stores.
pub fn after_signal_safe_fork_parent() {
    if let Some(d) = RUNTIME.get().and_then(|r| r.fork.as_ref())
        && d.flush_idle
    {
        FLUSH_AFTER_FORK.store(true, SeqCst);
    }
    FORK_GEN.fetch_add(1, SeqCst);
}

/// Whether a `_Fork()` is in progress in this process (a lookup then passes through).
pub fn forking() -> bool {
    FORK_GEN.load(SeqCst) % 2 == 1
}

/// `_Fork()` in the child: only atomic stores. The parent's cache is dropped at the next
/// call (see `cache`); the drain and trace threads are gone.
pub fn after_signal_safe_fork_child() {
    if RUNTIME.get().is_some_and(|r| r.cache.is_some()) {
        RENEW.store(1, SeqCst);
    }
    FLUSH_AFTER_FORK.store(false, Relaxed);
    FORK_GEN.fetch_add(1, SeqCst);
    DRAIN_RUNNING.store(false, Relaxed);
    trace::writer_gone();
    // Other threads' hooks may have been mid-push at the fork: they are gone.
    QUEUE.reset_after_fork(memory::open_here());
}

/// Idle entries a `_Fork()` asked to flush, before the next lookup.
fn flush_after_fork(cache: &Cache<Provider>) {
    if FLUSH_AFTER_FORK.load(Relaxed) && FLUSH_AFTER_FORK.swap(false, SeqCst) {
        FORK_FLUSHED.fetch_add(cache.flush_all() as u64, Relaxed);
    }
}

/// Whether /proc/self/pagemap gives real frame numbers here (it gives 0 without
/// CAP_SYS_ADMIN).
fn pagemap_shows_frames() -> bool {
    let probe = Box::new([1u8; 64]);
    let addr = probe.as_ptr() as usize;
    crate::provider::page_frames(addr & !4095, 1).is_some_and(|f| f[0] != 0)
}

/// The startup self-test, on this process's monitor.
fn run_selftest() -> Coverage {
    QUEUE.activate();
    let libc_handle = memory::LIBC.load(Relaxed);
    let patched = memory::PATCHED.load(Relaxed);
    // The allocator probes only mean something when the program's malloc is glibc's.
    // SAFETY: dlsym lookups of malloc in the global scope and in libc.
    let glibc_malloc = !libc_handle.is_null()
        && unsafe {
            libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr())
                == libc::dlsym(libc_handle, c"malloc".as_ptr())
        };
    selftest::run(libc_handle, glibc_malloc, patched & 4 != 0)
}

/// For `mrcache info`: the self-test's result as lines of text.
pub fn selftest_report() -> String {
    if cache().is_some() {
        return "the cache is running in this process; the self-test ran at its start\n".into();
    }
    let c = run_selftest();
    let mut out = String::new();
    for (path, status) in &c.results {
        let s = match status {
            crate::selftest::Status::Caught => "caught".to_string(),
            crate::selftest::Status::Missed => "MISSED".to_string(),
            crate::selftest::Status::NotRun(why) => why.to_string(),
        };
        out.push_str(&format!("{path}: {s}\n"));
    }
    out.push_str(&format!("(self-test took {} us)\n", c.nanos / 1000));
    let missed = c.missed();
    if !missed.is_empty() {
        let monitor = match memory::MONITOR.load(Relaxed) {
            1 => Monitor::Symbols,
            2 => Monitor::None,
            _ => Monitor::Patch,
        };
        if monitor != Monitor::None {
            out.push_str(&format!(
                "caching would be OFF in a verbs program here: {}\n",
                blind_spots(monitor, &missed)
            ));
        }
    }
    out
}

/// The cache and the fork decision, for the fork handlers.
pub fn fork_state() -> Option<(&'static Cache<Provider>, &'static fork::Decision)> {
    Some((cache()?, RUNTIME.get()?.fork.as_ref()?))
}

pub fn note_fork(flushed: usize, dontforked: usize) {
    FORKS.fetch_add(1, Relaxed);
    FORK_FLUSHED.fetch_add(flushed as u64, Relaxed);
    FORK_DONTFORKED.fetch_add(dontforked as u64, Relaxed);
    if let Some(d) = RUNTIME.get().and_then(|r| r.fork.as_ref()) {
        log(
            LogLevel::Info,
            format_args!(
                "fork: {}; {flushed} idle entries deregistered, {dontforked} ranges in use marked DONTFORK for the fork",
                d.why
            ),
        );
    }
}

/// In a fork child: the drain thread is gone (only the forking thread survives).
pub fn after_fork_child() {
    DRAIN_RUNNING.store(false, Relaxed);
    crate::window::after_fork_child();
    log(
        LogLevel::Info,
        format_args!("fork child: cache emptied (the parent's registrations are not usable here)"),
    );
}

/// Deregisters idle entries whose memory went away even when the program makes no more
/// verbs calls, so their pinned pages are given back. Started at the first registration
/// (and again in a fork child).
fn ensure_drain_thread() {
    if DRAIN_RUNNING.swap(true, Relaxed) {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("mrcache-drain".into())
        .spawn(|| {
            loop {
                std::thread::sleep(std::time::Duration::from_millis(20));
                if let Some(rt) = RUNTIME.get()
                    && let Some(cache) = cache()
                {
                    let _ = catch_unwind(AssertUnwindSafe(|| {
                        if rt.monitor == Monitor::Patch {
                            check_patches(cache);
                        }
                        flush_after_fork(cache);
                        cache.drain_pending()
                    }));
                }
            }
        });
}

thread_local! {
    /// Depth of verbs hooks on this thread: a registration the provider makes while we are
    /// inside one of ours is passed through, never processed twice.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

struct Guard;

impl Guard {
    fn enter() -> Option<Guard> {
        DEPTH
            .try_with(|d| {
                if d.get() > 0 {
                    None
                } else {
                    d.set(1);
                    Some(Guard)
                }
            })
            .ok()
            .flatten()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(0));
    }
}

/// Run `f` on the cache inside the re-entrancy guard and the panic shield; `passthrough`
/// when nested in another of our hooks, when there is no cache, or after a panic.
fn with_cache<T>(passthrough: impl Fn() -> T, f: impl FnOnce(&'static Cache<Provider>) -> T) -> T {
    let Some(_guard) = Guard::enter() else {
        return passthrough();
    };
    shielded(
        || match cache() {
            Some(cache) => f(cache),
            None => passthrough(),
        },
        &passthrough,
    )
}

/// Run `f`; a panic (a bug) falls back to `fallback` instead of unwinding into C.
fn shielded<T>(f: impl FnOnce() -> T, fallback: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| fallback())
}

/// Every registration entry point lands here.
pub fn register(
    call: Call,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut IbvMr {
    let t = if trace::enabled() { trace::now_ns() } else { 0 };
    let (mr, outcome) = register_inner(pd, addr, len, iova, access);
    if t != 0 {
        let mut args = [pd as u64, addr as u64, len as u64, iova, access as u64];
        if call == Call::RegMr {
            args = [pd as u64, addr as u64, len as u64, access as u64, 0];
        }
        trace::emit(call, outcome, args, mr as i64, t);
    }
    mr
}

fn register_inner(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> (*mut IbvMr, Outcome) {
    let passthrough = |why: usize| {
        BYPASSED[why].fetch_add(1, Relaxed);
        let mr = real::reg_mr_iova2(pd, addr, len, iova, access);
        note_foreign(mr, why == bypass_index(Bypass::Nested));
        (
            mr,
            if mr.is_null() {
                Outcome::Failed
            } else {
                Outcome::Bypass
            },
        )
    };
    let Some(_guard) = Guard::enter() else {
        return passthrough(bypass_index(Bypass::Nested));
    };
    shielded(
        || {
            let Some(rt) = runtime() else {
                return passthrough(9); // another thread is setting the library up
            };
            if rt.cache.is_none() {
                return passthrough(bypass_index(Bypass::Disabled));
            }
            let Some(cache) = cache() else {
                return passthrough(9); // another thread is replacing a fork child's cache
            };
            if forking() {
                return passthrough(9); // a _Fork() is in progress on another thread
            }
            flush_after_fork(cache);
            if rt.monitor == Monitor::Patch {
                check_patches(cache);
            }
            if pd.is_null() {
                return passthrough(6); // libibverbs' own behaviour for a NULL pd
            }
            // SAFETY: pd is the app's non-null PD.
            let context = unsafe { (*pd).context } as usize;
            let req = Request {
                pd: pd as usize,
                context,
                addr: addr as usize,
                len,
                iova,
                access,
            };
            let result = cache.acquire(&req);
            // After the registration: a new thread's start-up unmaps (arena set-up) would
            // otherwise race this very registration and leave it uncached.
            ensure_drain_thread();
            trace::ensure_writer();
            match result {
                Ok((handle, o)) => (
                    handle as *mut IbvMr,
                    match o {
                        mrcache::cache::Outcome::Hit => Outcome::Hit,
                        mrcache::cache::Outcome::HitContaining => Outcome::HitContaining,
                        mrcache::cache::Outcome::Miss => Outcome::Miss,
                        mrcache::cache::Outcome::Uncached => Outcome::Uncached,
                    },
                ),
                Err(AcquireError::Bypass(b)) => {
                    let (mr, o) = passthrough(bypass_index(b));
                    // libibverbs' MR may reuse the address of one the cache deregistered:
                    // its dereg must not look like a second one.
                    if !mr.is_null() {
                        cache.note_foreign(mr as usize);
                    }
                    (mr, o)
                }
                Err(AcquireError::Failed(e)) => {
                    real::set_errno(e);
                    (std::ptr::null_mut(), Outcome::Failed)
                }
            }
        },
        || passthrough(7),
    )
}

/// A registration passed through to libibverbs returned `mr`: if the cache remembers that
/// address as an MR it deregistered (a tombstone, to catch double deregistrations), it is a
/// live MR now, and its `ibv_dereg_mr` must reach libibverbs. A nested registration may
/// come from inside the cache (its lock held on this thread): tell it only when this thread
/// is not inside one of our calls.
fn note_foreign(mr: *mut IbvMr, nested: bool) {
    if mr.is_null() || nested {
        return;
    }
    if let Some(cache) = cache() {
        shielded(|| cache.note_foreign(mr as usize), || ());
    }
}

pub fn dereg_mr(mr: *mut IbvMr) -> i32 {
    let t = if trace::enabled() { trace::now_ns() } else { 0 };
    let (rc, outcome) = dereg_inner(mr);
    if t != 0 {
        trace::emit(
            Call::DeregMr,
            outcome,
            [mr as u64, 0, 0, 0, 0],
            rc as i64,
            t,
        );
    }
    rc
}

fn dereg_inner(mr: *mut IbvMr) -> (i32, Outcome) {
    if mr.is_null() {
        return (libc::EINVAL, Outcome::Failed);
    }
    let passthrough = || (real::dereg_mr(mr), Outcome::Passthrough);
    with_cache(passthrough, |cache| match cache.release(mr as usize) {
        Released::Kept => (0, Outcome::Kept),
        Released::Deregistered => (0, Outcome::Deregistered),
        Released::NotOurs => passthrough(),
        Released::DoubleRelease => {
            trace::write_line(&format!(
                "mrcache: ibv_dereg_mr({mr:p}): this registration was already deregistered (a second ibv_dereg_mr of the same MR); returning EINVAL"
            ));
            (libc::EINVAL, Outcome::DoubleDereg)
        }
        Released::Failed(e) => (e, Outcome::Failed),
    })
}

pub fn rereg_mr(
    mr: *mut IbvMr,
    flags: i32,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: i32,
) -> i32 {
    let t = if trace::enabled() { trace::now_ns() } else { 0 };
    let rc = rereg_inner(mr, flags, pd, addr, len, access);
    if t != 0 {
        let o = if rc == 0 {
            Outcome::Passthrough
        } else {
            Outcome::Failed
        };
        trace::emit(
            Call::ReregMr,
            o,
            [mr as u64, flags as u64, addr as u64, len as u64, 0],
            rc as i64,
            t,
        );
    }
    rc
}

fn rereg_inner(
    mr: *mut IbvMr,
    flags: i32,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: i32,
) -> i32 {
    let passthrough = || real::rereg_mr(mr, flags, pd, addr, len, access);
    if mr.is_null() {
        return passthrough();
    }
    with_cache(passthrough, |cache| {
        match cache.detach(mr as usize) {
            Detached::NotOurs => passthrough(),
            Detached::Shared => {
                log(
                    LogLevel::Error,
                    format_args!(
                        "ibv_rereg_mr({mr:p}): this registration is shared with other users through the cache and cannot be changed in place; deregister and register instead, or set MRCACHE_ENABLE=0"
                    ),
                );
                ffi::IBV_REREG_MR_ERR_INPUT
            }
            Detached::Sole(m) => {
                // Now the app's own, uncached registration; its dereg takes m's path.
                let rc = if m.via_wrapper {
                    passthrough()
                } else {
                    provider_rereg(mr, flags, pd, addr, len, access)
                };
                cache.adopt_uncached(m);
                rc
            }
        }
    })
}

/// `ibv_rereg_mr` for an MR made through the provider op: libibverbs' checks, then the
/// provider's rereg op, without the fork bookkeeping (the MR never had any).
fn provider_rereg(
    mr: *mut IbvMr,
    flags: i32,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: i32,
) -> i32 {
    if flags == 0 || flags & !ffi::IBV_REREG_MR_FLAGS_SUPPORTED != 0 {
        return ffi::IBV_REREG_MR_ERR_INPUT;
    }
    if flags & ffi::IBV_REREG_MR_CHANGE_TRANSLATION != 0 && (addr.is_null() || len == 0) {
        return ffi::IBV_REREG_MR_ERR_INPUT;
    }
    if access != 0 && flags & ffi::IBV_REREG_MR_CHANGE_ACCESS == 0 {
        return ffi::IBV_REREG_MR_ERR_INPUT;
    }
    // SAFETY: mr is a live provider-registered MR; the op has the provider rereg prototype.
    unsafe {
        let op = (*(*mr).context).ops._compat_rereg_mr;
        if op.is_null() {
            return ffi::IBV_REREG_MR_ERR_INPUT;
        }
        let f: ffi::ProviderReregMr = std::mem::transmute(op);
        if f(mr, flags, pd, addr, len, access) != 0 {
            return ffi::IBV_REREG_MR_ERR_CMD;
        }
        if flags & ffi::IBV_REREG_MR_CHANGE_PD != 0 {
            (*mr).pd = pd;
        }
        if flags & ffi::IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
            (*mr).addr = addr;
            (*mr).length = len;
        }
    }
    0
}

/// `ibv_dealloc_pd` / `ibv_close_device`: deregister the idle entries of that PD or context
/// first (libibverbs would refuse with EBUSY while any MR of it exists), then the real call.
fn flushed_then(
    call: Call,
    object: u64,
    flush: impl Fn(&Cache<Provider>) -> usize,
    real: impl FnOnce() -> i32,
) -> i32 {
    let t = if trace::enabled() { trace::now_ns() } else { 0 };
    let flushed = cache().map_or(0, |c| shielded(|| flush(c), || 0));
    let rc = real();
    if t != 0 {
        let o = if flushed > 0 {
            Outcome::Flush
        } else {
            Outcome::Passthrough
        };
        trace::emit(call, o, [object, 0, 0, 0, 0], rc as i64, t);
    }
    rc
}

pub fn dealloc_pd(pd: *mut IbvPd) -> i32 {
    flushed_then(
        Call::DeallocPd,
        pd as u64,
        |c| {
            let n = c.flush_pd(pd as usize);
            // Our windows, QP and CQ on it would keep the PD busy.
            crate::window::release_pd(pd as usize);
            n
        },
        || real::dealloc_pd(pd),
    )
}

pub fn close_device(ctx: *mut IbvContext) -> i32 {
    flushed_then(
        Call::CloseDevice,
        ctx as u64,
        |c| {
            let n = c.flush_context(ctx as usize);
            crate::window::release_context(ctx as usize);
            n
        },
        || real::close_device(ctx),
    )
}

pub fn fork_init() -> i32 {
    let t = if trace::enabled() { trace::now_ns() } else { 0 };
    crate::FORK_INIT_CALLED.store(true, Relaxed);
    let rc = real::fork_init();
    if t != 0 {
        trace::emit(Call::ForkInit, Outcome::Passthrough, [0; 5], rc as i64, t);
    }
    rc
}

pub fn reg_dmabuf_mr(
    pd: *mut IbvPd,
    offset: u64,
    len: usize,
    iova: u64,
    fd: i32,
    access: i32,
) -> *mut IbvMr {
    let t = if trace::enabled() { trace::now_ns() } else { 0 };
    let mr = real::reg_dmabuf_mr(pd, offset, len, iova, fd, access);
    if Guard::enter().is_some() {
        note_foreign(mr, false);
    }
    if t != 0 {
        trace::emit(
            Call::RegDmabufMr,
            Outcome::Passthrough,
            [pd as u64, offset, len as u64, fd as u64, 0],
            mr as i64,
            t,
        );
    }
    mr
}

/// This process's statistics.
pub fn report() -> Option<Report> {
    let rt = RUNTIME.get()?;
    let cache = cache()?;
    let s = cache.snapshot();
    let registrations = s.misses + s.uncached;
    let per_reg = s.reg_ns.checked_div(registrations).unwrap_or(0);
    let mut r = Report {
        version: mrcache::VERSION.into(),
        pid: std::process::id(),
        host: trace::host_name(),
        hits: s.hits,
        hits_containing: s.hits_containing,
        misses: s.misses,
        uncached: s.uncached,
        evictions: s.evictions,
        evictions_enomem: s.evictions_enomem,
        invalidated_entries: s.invalidated,
        unmaps_merged_on_overflow: QUEUE.overflows.load(Relaxed),
        double_deregs: s.double_releases,
        verify_mismatches: s.verify_mismatches,
        dereg_failures: s.dereg_failures,
        entries_at_exit: s.entries,
        bytes_at_exit: s.bytes,
        peak_entries: s.peak_entries,
        peak_bytes: s.peak_bytes,
        registration_ns: s.reg_ns,
        saved_ns_estimate: (s.hits + s.hits_containing) * per_reg,
        forks: FORKS.load(Relaxed),
        fork_decision: rt.fork.as_ref().map(|d| d.why.clone()).unwrap_or_default(),
        monitor: rt.monitor.as_str().into(),
        remote_keys: cache.remote().as_str().into(),
        remote_grants: s.grants,
        remote_revokes: s.revokes,
        selftest_us: rt.coverage.as_ref().map_or(0, |c| c.nanos / 1000),
        caching_off: cache.caching_stopped().unwrap_or_default().into(),
        trace_records_dropped: trace::dropped(),
        ..Report::default()
    };
    for (name, n) in BYPASS_NAMES.iter().zip(&BYPASSED) {
        let n = n.load(Relaxed);
        if n > 0 {
            r.bypassed.insert((*name).into(), n);
        }
    }
    for (name, n) in memory::SOURCES.iter().zip(&memory::REPORTED) {
        let n = n.load(Relaxed) as u64;
        if n > 0 {
            r.unmaps_by_source.insert((*name).into(), n);
        }
    }
    if let Some(c) = &rt.coverage {
        for (path, status) in &c.results {
            let v = match status {
                crate::selftest::Status::Caught => "caught".to_string(),
                crate::selftest::Status::Missed => "missed".to_string(),
                crate::selftest::Status::NotRun(why) => format!("not run: {why}"),
            };
            r.selftest.insert((*path).into(), v);
        }
    }
    Some(r)
}

extern "C" fn print_stats() {
    let Some(rt) = RUNTIME.get() else { return };
    let Some(r) = report() else { return };
    match rt.stats {
        StatsMode::Off => {}
        StatsMode::Json => {
            let line = r.to_json();
            match rt.stats_file.as_deref() {
                Some(pattern) => {
                    let path = mrcache::stats::expand_path(pattern, r.pid, &r.host);
                    let written = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                        .and_then(|mut f| {
                            std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes())
                        });
                    if let Err(e) = written {
                        eprintln!("mrcache: cannot write MRCACHE_STATS_FILE {path}: {e}");
                        eprintln!("{line}");
                    }
                }
                None => trace::write_line(&line),
            }
        }
        StatsMode::Summary => {
            let pid = r.pid;
            let bypassed: u64 = r.bypassed.values().sum();
            trace::write_line(&format!(
                "mrcache: pid {pid}: {} hits ({} containing), {} misses, {} uncached, {bypassed} bypassed, {} evictions ({} for ENOMEM), {} invalidated, {} double deregs, {} verify mismatches; {} entries / {} KiB cached now, peak {} / {} KiB; {:.3} ms spent registering (mean {:.1} us per registration, first touches included), so the hits avoided roughly {:.3} ms",
                r.hits_total(),
                r.hits_containing,
                r.misses,
                r.uncached,
                r.evictions + r.evictions_enomem,
                r.evictions_enomem,
                r.invalidated_entries,
                r.double_deregs,
                r.verify_mismatches,
                r.entries_at_exit,
                r.bytes_at_exit / 1024,
                r.peak_entries,
                r.peak_bytes / 1024,
                r.registration_ns as f64 / 1e6,
                r.registration_ns as f64 / 1e3 / (r.misses + r.uncached).max(1) as f64,
                r.saved_ns_estimate as f64 / 1e6,
            ));
            trace::write_line(&format!(
                "mrcache: pid {pid}: remote keys: MRCACHE_REMOTE={}; {} granted, {} revoked, {} registrations with remote access passed to libibverbs",
                r.remote_keys,
                r.remote_grants,
                r.remote_revokes,
                r.bypassed.get("remote-access").copied().unwrap_or(0)
            ));
            trace::write_line(&format!(
                "mrcache: pid {pid}: fork: {}; {} forks, {} idle entries deregistered at fork, {} ranges marked DONTFORK",
                r.fork_decision,
                r.forks,
                FORK_FLUSHED.load(Relaxed),
                FORK_DONTFORKED.load(Relaxed)
            ));
            if !r.caching_off.is_empty() {
                trace::write_line(&format!(
                    "mrcache: pid {pid}: caching was OFF: {}",
                    r.caching_off
                ));
            }
            if let Some(c) = &rt.coverage {
                let by_source: Vec<String> = r
                    .unmaps_by_source
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect();
                trace::write_line(&format!(
                    "mrcache: pid {pid}: monitor {}, unmaps reported: {} ({} merged on overflow); self-test {:.0} us: {}",
                    r.monitor,
                    if by_source.is_empty() {
                        "none".into()
                    } else {
                        by_source.join(", ")
                    },
                    r.unmaps_merged_on_overflow,
                    c.nanos as f64 / 1e3,
                    c.summary()
                ));
            }
        }
    }
}
