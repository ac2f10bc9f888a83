//! The process-wide state behind the hooks and what each hook does. Created at the first
//! verbs call, never in the constructor, so a process that never touches verbs reads no
//! configuration, prints nothing and starts nothing.

use crate::ffi::{self, IbvContext, IbvMr, IbvPd};
use crate::fork;
use crate::memory::{self, QUEUE};
use crate::provider::Provider;
use crate::real;
use crate::selftest::{self, Coverage};
use mrcache::cache::{AcquireError, Cache, Detached, Limits, Released, Request};
use mrcache::config::{self, LogLevel, Monitor};
use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

pub struct Runtime {
    pub cache: Option<Cache<Provider>>,
    pub monitor: Monitor,
    pub coverage: Option<Coverage>,
    pub fork: Option<fork::Decision>,
    pub log: LogLevel,
}

static FORKS: AtomicU64 = AtomicU64::new(0);
static FORK_FLUSHED: AtomicU64 = AtomicU64::new(0);
static FORK_DONTFORKED: AtomicU64 = AtomicU64::new(0);
static DRAIN_RUNNING: AtomicBool = AtomicBool::new(false);

/// One line on stderr at or above the configured level (`MRCACHE_LOG`). Only ever called
/// from verbs calls and fork handlers, never from memory hooks.
pub fn log(level: LogLevel, msg: std::fmt::Arguments<'_>) {
    if RUNTIME.get().is_some_and(|r| r.log >= level) {
        eprintln!("mrcache[{}]: {msg}", std::process::id());
    }
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

fn runtime() -> &'static Runtime {
    RUNTIME.get_or_init(|| {
        let phys = physical_memory();
        let vars = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())));
        let (config, problems) = config::parse(vars, phys);
        for p in &problems {
            eprintln!("{p}");
        }
        if config.stats {
            // SAFETY: registering a plain extern "C" fn with atexit.
            unsafe { libc::atexit(print_stats) };
        }
        if config.enabled && config.monitor == Monitor::None {
            eprintln!(
                "mrcache: WARNING: MRCACHE_MONITOR=none: unmapped and freed memory is NOT tracked; cached registrations can go stale and remote writes can land in memory that no longer belongs to the buffer. For tests only."
            );
        }
        let mut coverage = None;
        let cache = config.enabled.then(|| {
            QUEUE.activate();
            let libc_handle = memory::LIBC.load(std::sync::atomic::Ordering::Relaxed);
            let patched = memory::PATCHED.load(std::sync::atomic::Ordering::Relaxed);
            // The allocator probes only mean something when the program's malloc is glibc's.
            // SAFETY: dlsym lookups of malloc in the global scope and in libc.
            let glibc_malloc = !libc_handle.is_null()
                && unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) == libc::dlsym(libc_handle, c"malloc".as_ptr()) };
            let c = selftest::run(libc_handle, glibc_malloc, patched & 4 != 0);
            let missed = c.missed();
            if config.monitor != Monitor::None && !missed.is_empty() {
                eprintln!(
                    "mrcache: monitor '{}' does not see: {}; registrations of memory released that way could go stale (MRCACHE_MONITOR=patch sees them)",
                    config.monitor.as_str(),
                    missed.join(", ")
                );
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
        });
        let fork = cache.as_ref().map(|_| {
            // SAFETY: registering plain extern "C" handlers.
            unsafe { libc::pthread_atfork(Some(fork::prepare), Some(fork::parent), Some(fork::child)) };
            fork::decide(config.fork)
        });
        Runtime { cache, monitor: config.monitor, coverage, fork, log: config.log }
    })
}

/// Whether /proc/self/pagemap gives real frame numbers here (it gives 0 without
/// CAP_SYS_ADMIN).
fn pagemap_shows_frames() -> bool {
    let probe = Box::new([1u8; 64]);
    let addr = probe.as_ptr() as usize;
    crate::provider::page_frames(addr & !4095, 1).is_some_and(|f| f[0] != 0)
}

/// The cache and the fork decision, for the fork handlers.
pub fn fork_state() -> Option<(&'static Cache<Provider>, &'static fork::Decision)> {
    let rt = RUNTIME.get()?;
    Some((rt.cache.as_ref()?, rt.fork.as_ref()?))
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
                if let Some(cache) = RUNTIME.get().and_then(|r| r.cache.as_ref()) {
                    let _ = catch_unwind(AssertUnwindSafe(|| cache.drain_pending()));
                }
            }
        });
}

fn physical_memory() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && size > 0 {
        pages as u64 * size as u64
    } else {
        0
    }
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

/// Run `f`; a panic (a bug) falls back to `fallback` instead of unwinding into C.
fn shielded<T>(f: impl FnOnce() -> T, fallback: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| fallback())
}

/// Every registration entry point lands here.
pub fn register(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut IbvMr {
    let passthrough = || real::reg_mr_iova2(pd, addr, len, iova, access);
    let Some(_guard) = Guard::enter() else {
        return passthrough();
    };
    shielded(
        || {
            let Some(cache) = runtime().cache.as_ref() else {
                return passthrough();
            };
            ensure_drain_thread();
            if pd.is_null() {
                return passthrough(); // libibverbs' own behaviour for a NULL pd
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
            match cache.acquire(&req) {
                Ok((handle, _)) => handle as *mut IbvMr,
                Err(AcquireError::Bypass(_)) => passthrough(),
                Err(AcquireError::Failed(e)) => {
                    real::set_errno(e);
                    std::ptr::null_mut()
                }
            }
        },
        passthrough,
    )
}

pub fn dereg_mr(mr: *mut IbvMr) -> i32 {
    if mr.is_null() {
        return libc::EINVAL;
    }
    let passthrough = || real::dereg_mr(mr);
    let Some(_guard) = Guard::enter() else {
        return passthrough();
    };
    shielded(
        || {
            let Some(cache) = RUNTIME.get().and_then(|r| r.cache.as_ref()) else {
                return passthrough();
            };
            match cache.release(mr as usize) {
                Released::Kept | Released::Deregistered => 0,
                Released::NotOurs => passthrough(),
                Released::DoubleRelease => {
                    eprintln!(
                        "mrcache: ibv_dereg_mr({mr:p}): this registration was already deregistered (a second ibv_dereg_mr of the same MR); returning EINVAL"
                    );
                    libc::EINVAL
                }
                Released::Failed(e) => e,
            }
        },
        passthrough,
    )
}

pub fn rereg_mr(
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
    let Some(_guard) = Guard::enter() else {
        return passthrough();
    };
    shielded(
        || {
            let Some(cache) = RUNTIME.get().and_then(|r| r.cache.as_ref()) else {
                return passthrough();
            };
            match cache.detach(mr as usize) {
                Detached::NotOurs => passthrough(),
                Detached::Shared => {
                    eprintln!(
                        "mrcache: ibv_rereg_mr({mr:p}): this registration is shared with other users through the cache and cannot be changed in place; deregister and register instead, or set MRCACHE_SHADOW=0/MRCACHE_ENABLE=0"
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
        },
        passthrough,
    )
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

pub fn dealloc_pd(pd: *mut IbvPd) -> i32 {
    if let Some(cache) = RUNTIME.get().and_then(|r| r.cache.as_ref()) {
        shielded(|| cache.flush_pd(pd as usize), || 0);
    }
    real::dealloc_pd(pd)
}

pub fn close_device(ctx: *mut IbvContext) -> i32 {
    if let Some(cache) = RUNTIME.get().and_then(|r| r.cache.as_ref()) {
        shielded(|| cache.flush_context(ctx as usize), || 0);
    }
    real::close_device(ctx)
}

pub fn fork_init() -> i32 {
    crate::FORK_INIT_CALLED.store(true, std::sync::atomic::Ordering::Relaxed);
    real::fork_init()
}

extern "C" fn print_stats() {
    let Some(rt) = RUNTIME.get() else { return };
    let Some(cache) = rt.cache.as_ref() else {
        return;
    };
    let s = cache.snapshot();
    let misses = s.misses + s.uncached;
    let per_reg = s.reg_ns.checked_div(misses).unwrap_or(0);
    let hits = s.hits + s.hits_containing;
    eprintln!(
        "mrcache: pid {}: {} hits ({} containing), {} misses, {} uncached, {} bypassed, {} evictions ({} for ENOMEM), {} invalidated, {} double deregs, {} verify mismatches; {} entries / {} KiB cached now, peak {} / {} KiB; registration time {:.3} ms spent, ~{:.3} ms saved",
        std::process::id(),
        hits,
        s.hits_containing,
        s.misses,
        s.uncached,
        s.bypassed,
        s.evictions + s.evictions_enomem,
        s.evictions_enomem,
        s.invalidated,
        s.double_releases,
        s.verify_mismatches,
        s.entries,
        s.bytes / 1024,
        s.peak_entries,
        s.peak_bytes / 1024,
        s.reg_ns as f64 / 1e6,
        (hits * per_reg) as f64 / 1e6,
    );
    if let Some(d) = &rt.fork {
        eprintln!(
            "mrcache: pid {}: fork: {}; {} forks, {} idle entries deregistered at fork, {} ranges marked DONTFORK",
            std::process::id(),
            d.why,
            FORKS.load(Relaxed),
            FORK_FLUSHED.load(Relaxed),
            FORK_DONTFORKED.load(Relaxed)
        );
    }
    if let Some(c) = &rt.coverage {
        eprintln!(
            "mrcache: pid {}: monitor {}, {} unmaps reported ({} merged on overflow); self-test {:.0} us: {}",
            std::process::id(),
            rt.monitor.as_str(),
            QUEUE.pushed.load(std::sync::atomic::Ordering::Relaxed),
            QUEUE.overflows.load(std::sync::atomic::Ordering::Relaxed),
            c.nanos as f64 / 1e3,
            c.summary()
        );
    }
}
