//! The process-wide state behind the hooks: the runtime (set up by `init` at the first verbs
//! call, never in the constructor, so a process that never touches verbs reads no
//! configuration, prints nothing and starts nothing), the cache a fork child replaces,
//! the fork bookkeeping and the shell's counters. Beside it: the set-up (`init`, `once`,
//! `budget`), the background drain (`drain`), the fast hit path's gate (`fast`), the
//! re-entrancy guard and panic shield (`guard`), the fork handlers (`fork`) and the report
//! (`report`).
//!
//! Layer: below `calls`; uses `verbs`, `monitor`, `trace`, `sys` and `ffi`
//! (docs/design/overview.md).

pub mod budget;
pub mod closed;
pub mod drain;
pub mod fast;
pub mod fork;
pub mod guard;
pub mod init;
pub mod once;
pub mod report;

use crate::monitor::memory::{self, QUEUE};
use crate::monitor::selftest::Coverage;
use crate::trace;
use crate::verbs::provider::Provider;
use mrcache::cache::Cache;
use mrcache::config::{LogLevel, Monitor, StatsMode};
use mrcache::fork::FlushRequests;
use mrcache::stats::{Bypassed, Counter, Counters, Tally};
use once::InitOnce;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering::*,
};

pub struct Runtime {
    pub cache: Option<Cache<Provider>>,
    pub monitor: Monitor,
    pub coverage: Option<Coverage>,
    pub fork: Option<fork::Decision>,
    pub log: LogLevel,
    pub stats: StatsMode,
    pub stats_file: Option<String>,
}

/// Registrations passed to libibverbs untouched, by `Bypassed` reason.
pub static BYPASSED: Tally<{ Bypassed::COUNT }> = Tally::new();

/// Counts a registration passed through for `why`.
pub fn note_bypass(why: Bypassed) {
    BYPASSED.add(why as usize, 1);
}

/// The report counters the shell keeps itself (forks); the cache keeps its own.
pub static COUNTERS: Counters = Counters::new();

/// One line on stderr at or above the configured level (`MRCACHE_LOG`). Only ever called
/// from verbs calls and fork handlers, never from memory hooks.
pub fn log(level: LogLevel, msg: std::fmt::Arguments<'_>) {
    if RUNTIME.get().is_some_and(|r| r.log >= level) {
        trace::log_line(level, &format!("mrcache[{}]: {msg}", std::process::id()));
    }
}

static RUNTIME: InitOnce<Runtime> = InitOnce::new();

/// The device context of the registration that sets the runtime up (0: none known): where
/// the monitor is blind, whether that device pages on demand decides between caching only
/// on-demand entries and caching nothing (`init::set_up`).
pub static SETUP_CONTEXT: AtomicUsize = AtomicUsize::new(0);

/// The runtime, set up at the first call; None while another thread sets it up (the caller
/// passes through instead of waiting: see `once`).
pub fn runtime() -> Option<&'static Runtime> {
    RUNTIME.get_or_init(crate::runtime::init::set_up)
}

/// The runtime if it is set up (never sets it up).
pub fn get() -> Option<&'static Runtime> {
    RUNTIME.get()
}

/// A fork child still has the parent's cache, whose lock a parent thread may have held at
/// the fork (and holds forever in the child): the child's first call replaces the cache.
/// 0: current; 1: replace at the next call; 2: being replaced.
static RENEW: AtomicU8 = AtomicU8::new(0);
static RENEWED: AtomicPtr<Cache<Provider>> = AtomicPtr::new(std::ptr::null_mut());
/// The caches renewals replaced, newest first (in a fork child: the parent's; in a
/// grandchild: its parent's, then the first process's), asked without their locks whether a
/// handle the process deregisters is one of theirs: a grandchild has the first process's
/// handles in its memory too.
static INHERITED: AtomicPtr<Inherited> = AtomicPtr::new(std::ptr::null_mut());

/// One cache a renewal replaced, and the ones replaced before it (leaked, never freed).
struct Inherited {
    cache: &'static Cache<Provider>,
    older: *const Inherited,
}
/// Asked by a fork in the parent when idle entries must go at fork: every registration
/// deregisters them (or sees another thread's flush finished) before it looks anything up.
static FLUSHES: FlushRequests = FlushRequests::new();
/// Forks in progress in this process (`fork()` from its prepare handler to its parent
/// handler, `_Fork()` around the real call; forks on several threads may overlap): a
/// lookup meanwhile passes through uncached, so no registration made during one survives
/// it idle. A child inherits the count: its first call (or our child handler, whichever
/// comes first) sees it set in a process that is not `FORKER`, and resets.
static FORKING: AtomicU64 = AtomicU64::new(0);
/// The process whose forks `FORKING` counts.
static FORKER: AtomicI32 = AtomicI32::new(0);
/// The process the child reset was done for (once per child, whoever comes first: the
/// program's own child handlers run before ours and may make verbs calls).
static RESET_FOR: AtomicI32 = AtomicI32::new(0);
/// The ranges our prepare handler marked DONTFORK, in a `fork()` child: unmarked at the
/// child's first call (libibverbs' range lock may be held by a thread the child does not
/// have; a child that never calls verbs must not wait for it).
static CHILD_DOFORK: AtomicPtr<Vec<(usize, usize)>> = AtomicPtr::new(std::ptr::null_mut());
/// Process-wide registrations made once per address space (inherited by fork children).
pub static STATS_AT_EXIT: AtomicBool = AtomicBool::new(false);
pub static ATFORK_REGISTERED: AtomicBool = AtomicBool::new(false);

fn getpid() -> i32 {
    // SAFETY: no preconditions; async-signal-safe.
    unsafe { libc::getpid() }
}

/// The cache, once set up (and not off); None also while a fork child's first call on
/// another thread is replacing it.
pub fn cache() -> Option<&'static Cache<Provider>> {
    let first = RUNTIME.get()?.cache.as_ref()?;
    if FORKING.load(SeqCst) != 0 && FORKER.load(SeqCst) != getpid() {
        // A fork child before our child handler ran (in one of the program's own).
        fork_child();
    }
    if RENEW.load(Acquire) != 0 {
        match RENEW.compare_exchange(1, 2, AcqRel, Acquire) {
            Ok(_) => {
                let p = RENEWED.load(Acquire);
                // SAFETY: a non-null RENEWED is a leaked Box, never freed.
                let current = if p.is_null() { first } else { unsafe { &*p } };
                let fresh = current.renewed(Provider::new(
                    current.registrar().verify,
                    current.registrar().odp.renewed(),
                    log,
                ));
                let older = INHERITED.load(Acquire);
                let node = Box::leak(Box::new(Inherited {
                    cache: current,
                    older,
                }));
                INHERITED.store(node, Release);
                RENEWED.store(Box::leak(Box::new(fresh)), Release);
                crate::verbs::window::after_fork_child();
                let dofork = CHILD_DOFORK.swap(std::ptr::null_mut(), AcqRel);
                if !dofork.is_null() {
                    // SAFETY: made by Box::into_raw in `fork_child_ranges`, taken once.
                    let ranges = unsafe { Box::from_raw(dofork) };
                    // The child has no mapping there; libibverbs ignores the DOFORK error
                    // but its reference counts (inherited) come back into balance.
                    fork::for_ranges(&crate::verbs::real::DOFORK_RANGE, &ranges);
                }
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

/// In a fork child: whether `mr`, which the child's own cache does not know, is a handle
/// the parent's cache (or, in a grandchild, any ancestor's) handed out. Its `ibv_dereg_mr` then succeeds without the provider:
/// the child discards the parent's registrations without deregistering them (in the
/// kernel they are the parent's, and shared with the parent's other users).
/// Whether `mr` is a handle a cache this process inherited handed out, by its records or,
/// where those cannot be read without waiting (a parent thread held their lock at the fork),
/// by being a shadow: no kernel object has a shadow's handle.
pub fn inherited_mr(mr: *mut crate::ffi::IbvMr) -> bool {
    if INHERITED.load(Acquire).is_null() {
        return false;
    }
    // SAFETY: the app's MR pointer, which libibverbs would read the same way.
    inherited_handle(mr as usize) || unsafe { (*mr).handle } == u32::MAX
}

/// In a fork child: whether `ctx` is a verbs context the parent opened, that is whether the
/// child's command fd is the very file the parent has open under that number (`kcmp`). What
/// the child registers there is an object of the parent's kernel context: an idle entry
/// kept of it would outlive the child (pinning its pages, keeping the parent's PD busy).
/// Where it cannot be told (no kcmp, not permitted) it counts as the parent's. errno is
/// left as it was.
pub fn parents_context(ctx: *mut crate::ffi::IbvContext) -> bool {
    if INHERITED.load(Acquire).is_null() {
        return false;
    }
    let saved = crate::sys::errno();
    // SAFETY: the app's live context (its PD's).
    let fd = unsafe { (*ctx).cmd_fd };
    // SAFETY: kcmp(2) only compares; KCMP_FILE = 0.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            getpid() as libc::c_long,
            libc::getppid() as libc::c_long,
            0 as libc::c_long,
            fd as libc::c_long,
            fd as libc::c_long,
        )
    };
    // 0: the same file; 1, 2: two files; EBADF: the parent has no such fd.
    let ours = r == 1 || r == 2 || (r == -1 && crate::sys::errno() == libc::EBADF);
    crate::sys::set_errno(saved);
    !ours
}

pub fn inherited_handle(mr: usize) -> bool {
    let mut p: *const Inherited = INHERITED.load(Acquire);
    // SAFETY: a non-null INHERITED, and each `older`, is a leaked node, never freed.
    while let Some(node) = unsafe { p.as_ref() } {
        if node.cache.handed_out(mr) == Some(true) {
            return true;
        }
        p = node.older;
    }
    false
}

/// A fork begins (`fork()`'s prepare handler, `_Fork()` before the real call): only atomic
/// stores (`_Fork` may run in a signal handler that interrupted a thread holding the cache
/// lock or the allocator's).
pub fn begin_fork() {
    FORKER.store(getpid(), SeqCst);
    FORKING.fetch_add(1, SeqCst);
    crate::runtime::fast::disarm();
}

/// `_Fork()`, before the real call.
pub fn before_signal_safe_fork() {
    begin_fork();
    COUNTERS.add(Counter::Forks, 1);
}

/// A fork returned in the parent (`fork()`'s parent handler, `_Fork()`): idle entries (the
/// ones cached before it and during it) are flushed before the next lookup, when the policy
/// says so. Only atomic stores.
pub fn after_fork_parent() {
    if let Some(d) = RUNTIME.get().and_then(|r| r.fork.as_ref())
        && d.flush_idle
    {
        FLUSHES.ask();
    }
    FORKING.fetch_sub(1, SeqCst);
    // Calls that saw the fork in progress did not arm; any that armed before it began was
    // disarmed then. Again, after the flag: the flush comes before the next hit.
    crate::runtime::fast::disarm();
}

/// Whether a fork is in progress in this process (a lookup then passes through).
pub fn forking() -> bool {
    FORKING.load(SeqCst) != 0
}

/// In a fork child, once (whoever comes first): only atomic stores, so `_Fork()` may call
/// it in a signal handler. The parent's cache is replaced at the next call (see `cache`);
/// the drain and trace threads are gone. Returns whether it reset now.
pub fn after_signal_safe_fork_child() -> bool {
    let me = getpid();
    if RESET_FOR.swap(me, SeqCst) == me {
        return false;
    }
    if RUNTIME.get().is_some_and(|r| r.cache.is_some()) {
        RENEW.store(1, SeqCst);
    }
    FLUSHES.forget();
    FORKER.store(me, SeqCst);
    FORKING.store(0, SeqCst);
    crate::runtime::fast::disarm();
    crate::runtime::guard::after_fork_child();
    crate::monitor::patch::after_fork_child();
    drain::after_fork_child();
    trace::writer_gone();
    // Other threads' hooks may have been mid-push at the fork: they are gone.
    QUEUE.reset_after_fork(memory::open_here());
    true
}

/// Idle entries a fork asked to flush, before the next lookup.
pub fn flush_after_fork(cache: &Cache<Provider>) {
    // Done only once the flush finished: a caller meanwhile flushes too, rather than look
    // up an idle entry this flush has not reached yet.
    if let Some(ticket) = FLUSHES.outstanding() {
        COUNTERS.add(Counter::ForkIdleDeregistered, cache.flush_all() as u64);
        FLUSHES.done(ticket);
    }
}

/// The cache and the fork decision, for the fork handlers.
pub fn fork_state() -> Option<(&'static Cache<Provider>, &'static fork::Decision)> {
    Some((cache()?, RUNTIME.get()?.fork.as_ref()?))
}

pub fn note_fork(flushed: usize, dontforked: usize) {
    COUNTERS.add(Counter::Forks, 1);
    COUNTERS.add(Counter::ForkIdleDeregistered, flushed as u64);
    COUNTERS.add(Counter::ForkRangesDontfork, dontforked as u64);
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

/// The ranges a `fork()` child inherited marked DONTFORK: unmarked at its first call.
pub fn fork_child_ranges(ranges: Vec<(usize, usize)>) {
    if ranges.is_empty() {
        return;
    }
    let old = CHILD_DOFORK.swap(Box::into_raw(Box::new(ranges)), AcqRel);
    if !old.is_null() {
        // SAFETY: made by Box::into_raw above; swapped out, so ours alone.
        drop(unsafe { Box::from_raw(old) });
    }
}

/// In a `fork()` child (our child handler, or the child's first call if one of the
/// program's child handlers makes it first): the reset, and what may allocate (the
/// child's own log file, a trace writer).
pub fn fork_child() {
    if RUNTIME.get().is_none() || !after_signal_safe_fork_child() {
        return;
    }
    trace::after_fork_child();
    log(
        LogLevel::Info,
        format_args!("fork child: cache emptied (the parent's registrations are not usable here)"),
    );
}
