//! What each verbs hook does: registrations through the cache, deregistration, rereg,
//! and the calls that must first flush the cache's idle entries.
//!
//! Layer: below `abi`; uses `runtime`, `verbs`, `monitor`, `trace`, `sys` and `ffi`
//! (docs/design/overview.md).

use crate::ffi::{IbvContext, IbvMr, IbvPd};
use crate::runtime::guard::{Guard, shielded, with_cache};
use crate::runtime::{
    cache, drain::ensure_drain_thread, fast, flush_after_fork, forking, log, note_bypass, runtime,
};
use crate::trace;
use crate::verbs::provider::Provider;
use crate::verbs::real;
use mrcache::access::Bypass;
use mrcache::cache::{AcquireError, Cache, Detached, Passed, Plan, Released, Request, Sample};
use mrcache::config::{LogLevel, Monitor};
use mrcache::stats::Bypassed;
use mrcache::trace::{Call, Outcome};
use std::ffi::c_void;
use std::sync::atomic::Ordering::*;
use through::{Reg, Tell};

mod rereg;
mod through;

pub use rereg::rereg_mr;

/// Every registration entry point lands here: the fast hit, else the full path, each
/// traced apart. One frame for all of it, the fast hit inlined into it: `extern "C"` (it
/// cannot unwind: an unwind aborts here, and the full path catches panics itself), so the
/// hook's call is a jump, and `call` last, so that the hook moves no other argument.
#[inline(never)]
pub extern "C" fn register(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
    call: Call,
) -> *mut IbvMr {
    let mode = fast::mode();
    if mode & (fast::TRACED | fast::OFF) != 0 {
        return register_in_mode(mode, call, pd, addr, len, iova, access);
    }
    match fast::hit(mode, pd, addr, len, iova, access) {
        Some(mr) => mr,
        None => register_miss(pd, addr, len, iova, access).0,
    }
}

/// Traced; or caching off for good: nothing can be cached, so nothing needs a lookup
/// (libibverbs' registration, not counted: a process without a cache reports nothing).
#[cold]
#[inline(never)]
fn register_in_mode(
    mode: u64,
    call: Call,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut IbvMr {
    if mode & fast::TRACED != 0 {
        return register_traced(mode, call, pd, addr, len, iova, access);
    }
    let reg = Reg::new(pd, addr, len, iova, access);
    through::register(reg, Tell::Nothing, None).0
}

/// Not a fast hit: the pass-through lane, else the full path. Apart, as `register_inner`.
#[inline(never)]
fn register_miss(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> (*mut IbvMr, Outcome) {
    let reg = Reg::new(pd, addr, len, iova, access);
    match register_lane(reg) {
        Ok(done) => done,
        Err(plan) => register_inner(reg, plan),
    }
}

/// When the fast path is open: the cache's plan (`Cache::plan`), inside the re-entrancy
/// guard (a registration the provider makes meanwhile passes through, never served the
/// cache's own MR). A pass-through (the lane: a class admission passes through steadily,
/// or a remote call under `MRCACHE_REMOTE=bypass`) goes to libibverbs here, without the
/// lock; its sampled call's timing and a failure take the shield for the locked part
/// (`through`). Err: take the full path with the plan, if asked (nothing was changed).
#[inline(always)]
fn register_lane(reg: Reg) -> Result<(*mut IbvMr, Outcome), Option<Plan>> {
    let cache = crate::runtime::fast::cache_if_open().ok_or(None)?;
    let _guard = Guard::enter().ok_or(None)?;
    let req = reg.request(0); // `plan` reads no context
    match cache.plan(&req) {
        Plan::Pass { why, timed } => Ok(pass(cache, reg, &req, why, timed)),
        ask => Err(Some(ask)),
    }
}

/// A registration the cache passed through for `why` (`Plan::Pass`, `AcquireError::Bypass`):
/// libibverbs registers it, the cache told of its MR (`Tell::Cache`); `timed`: an
/// admission sample (`Sample::Registration`).
#[inline(always)]
fn pass(
    cache: &'static Cache<Provider>,
    reg: Reg,
    req: &Request,
    why: Bypass,
    timed: bool,
) -> (*mut IbvMr, Outcome) {
    note_bypass(Bypassed::from(why));
    through::register(reg, Tell::Cache(cache), timed.then_some(req))
}

#[inline(never)]
fn register_traced(
    mode: u64,
    call: Call,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut IbvMr {
    let t = trace::now_ns();
    let (mr, outcome) = match fast::hit(mode, pd, addr, len, iova, access) {
        Some(mr) => (mr, Outcome::Hit),
        None => register_miss(pd, addr, len, iova, access),
    };
    let mut args = [pd as u64, addr as u64, len as u64, iova, access as u64];
    if call == Call::RegMr {
        args = [pd as u64, addr as u64, len as u64, access as u64, 0];
    }
    trace::emit(call, outcome, args, mr as i64, t);
    mr
}

/// The full path (`plan`: the cache's, if the lane asked it). Apart (not inlined): its
/// frame would otherwise be set up on every fast hit too.
#[inline(never)]
fn register_inner(reg: Reg, plan: Option<Plan>) -> (*mut IbvMr, Outcome) {
    // A remote call's round is timed whole, from here to the return (what the app pays
    // for a hit: the hook's checks, the shadow copy, the window bind and its completion):
    // an admission figure (`Sample::Round`), on one call in about `SAMPLE_EVERY` (a clock
    // read is a system call in some guests: every call timed made even a pass-through pay
    // it). Local calls read no clock here.
    let t_hook = (reg.access & mrcache::access::REMOTE != 0
        && mrcache::admission::sampled(mrcache::admission::SAMPLE_EVERY))
    .then(std::time::Instant::now);
    // Before the checks: a disarm after this keeps the fast path shut (see `fast`).
    let seen = crate::runtime::fast::seen();
    let Some(_guard) = Guard::enter() else {
        return passed(reg, Bypassed::Nested);
    };
    shielded(
        || match ready(reg.pd) {
            Ok((patch, cache, context)) => {
                let at = Full {
                    cache,
                    patch,
                    seen,
                    t_hook,
                };
                at.serve(reg, context, plan)
            }
            Err(why) => passed(reg, why),
        },
        || passed(reg, Bypassed::Panic),
    )
}

/// A registration of the full path passed to libibverbs before the cache was asked, for
/// `why`.
fn passed(reg: Reg, why: Bypassed) -> (*mut IbvMr, Outcome) {
    note_bypass(why);
    let nested = why == Bypassed::Nested;
    through::register(reg, Tell::Passed { nested }, None)
}

/// The checks of the full path before the cache is asked: the library set up with a cache,
/// no fork in progress, the fork child's flush and the patch check done, a PD of this
/// process. Ok: whether the patch monitor runs, the cache, the PD's context. Err: why the
/// registration passes through.
#[inline(always)]
fn ready(pd: *mut IbvPd) -> Result<(bool, &'static Cache<Provider>, usize), Bypassed> {
    if crate::runtime::get().is_none() && !pd.is_null() {
        // SAFETY: pd is the app's non-null PD.
        let context = unsafe { (*pd).context } as usize;
        let _ = crate::runtime::SETUP_CONTEXT.compare_exchange(0, context, Relaxed, Relaxed);
    }
    // Another thread is setting the library up.
    let rt = runtime().ok_or(Bypassed::SettingUp)?;
    if rt.cache.is_none() {
        return Err(Bypassed::Disabled);
    }
    // Another thread is replacing a fork child's cache, or a _Fork() is in progress on
    // another thread.
    let cache = cache().ok_or(Bypassed::SettingUp)?;
    if forking() {
        return Err(Bypassed::SettingUp);
    }
    flush_after_fork(cache);
    crate::runtime::drain::cycle_here();
    let patch = rt.monitor == Monitor::Patch;
    if patch {
        crate::runtime::closed::check_patches_watched(cache);
    }
    if pd.is_null() {
        return Err(Bypassed::NullPd); // libibverbs' own behaviour for a NULL pd
    }
    // SAFETY: pd is the app's non-null PD.
    let context = unsafe { (*pd).context } as usize;
    if crate::runtime::parents_context(context as *mut IbvContext) {
        return Err(Bypassed::ParentsContext);
    }
    Ok((patch, cache, context))
}

/// A registration of the full path that passed `ready`.
struct Full {
    cache: &'static Cache<Provider>,
    /// The patch monitor runs.
    patch: bool,
    /// The fast path's word before the checks (`fast::seen`).
    seen: u64,
    /// When a sampled remote call entered the hook.
    t_hook: Option<std::time::Instant>,
}

impl Full {
    /// The cache's plan (the lane's, else asked now), then `Cache::acquire` if it says
    /// so, and act on the answer.
    #[inline(always)]
    fn serve(&self, reg: Reg, context: usize, plan: Option<Plan>) -> (*mut IbvMr, Outcome) {
        let cache = self.cache;
        let req = reg.request(context);
        let mut t_hook = self.t_hook;
        let result = match plan.unwrap_or_else(|| cache.plan(&req)) {
            Plan::Ask { timed } => {
                // A remote round the class needs figures of (its first ones, a
                // confirmation, a trial's hits): timed whole from here, like the sampled
                // ones.
                t_hook = t_hook.or_else(|| timed.then(std::time::Instant::now));
                cache.acquire(&req)
            }
            // The lane's answer, in the full path: passed as `acquire` would pass it.
            Plan::Pass { why, timed } => Err(AcquireError::Bypass { why, timed }),
        };
        // After the registration: a new thread's start-up unmaps (arena set-up) would
        // otherwise race this very registration and leave it uncached.
        ensure_drain_thread();
        trace::ensure_writer();
        match result {
            Ok((handle, o)) => {
                // A miss just cached an entry: the sites are read whatever the watch word
                // says (an overwrite no watched call announced, /proc/self/mem or a raw
                // mprotect, leaves it clean): caught here, `stop_caching` takes the entry
                // out of the index. Pass-throughs cache nothing and skip it; hits keep the
                // watched check.
                if o == mrcache::cache::Outcome::Miss && self.patch {
                    crate::runtime::closed::check_patches(cache);
                }
                crate::runtime::fast::arm(self.seen, cache, self.patch);
                let o = match o {
                    mrcache::cache::Outcome::Hit => Outcome::Hit,
                    mrcache::cache::Outcome::HitContaining => Outcome::HitContaining,
                    mrcache::cache::Outcome::Miss => Outcome::Miss,
                    mrcache::cache::Outcome::Uncached => Outcome::Uncached,
                };
                if let Some(t) = t_hook
                    && matches!(o, Outcome::Hit | Outcome::HitContaining)
                {
                    cache.report(Sample::Round(&req), t.elapsed().as_nanos() as u64);
                }
                (handle as *mut IbvMr, o)
            }
            Err(AcquireError::Bypass { why, timed }) => self.passed_by_cache(reg, &req, why, timed),
            Err(AcquireError::Failed(e)) => {
                real::set_errno(e);
                (std::ptr::null_mut(), Outcome::Failed)
            }
        }
    }

    /// The cache passed the registration through for `why` (`timed`: an admission
    /// sample).
    fn passed_by_cache(
        &self,
        reg: Reg,
        req: &Request,
        why: Bypass,
        timed: bool,
    ) -> (*mut IbvMr, Outcome) {
        // A remote call passed to libibverbs (under `bypass`; under `revoke` one no window
        // could be had for) passed every check above as a cached call would: open the
        // gate, so that the lane may take the next ones (`Plan::Pass`, under `bypass`
        // only; a program whose every call is remote would otherwise never open it, and
        // pay this path, its shield and its sampled clock reads on every call).
        if why == Bypass::Remote {
            crate::runtime::fast::arm(self.seen, self.cache, self.patch);
        }
        // Out of pinnable memory, as the miss path: the cache's idle entries given back,
        // libibverbs once more (a probe's range is still pinned by its cached entry;
        // libibverbs alone would have pinned it once).
        pass(self.cache, reg, req, why, timed)
    }
}

/// `extern "C"` and apart, as `register`: the hook jumps here, one frame for the fast
/// release and the full path.
#[inline(never)]
pub extern "C" fn dereg_mr(mr: *mut IbvMr) -> i32 {
    let mode = fast::mode();
    if mode & fast::TRACED != 0 {
        return dereg_traced(mode, mr);
    }
    dereg_inner(mode, mr).0
}

#[inline(never)]
fn dereg_traced(mode: u64, mr: *mut IbvMr) -> i32 {
    let t = trace::now_ns();
    let (rc, outcome) = dereg_inner(mode, mr);
    trace::emit(
        Call::DeregMr,
        outcome,
        [mr as u64, 0, 0, 0, 0],
        rc as i64,
        t,
    );
    rc
}

#[inline(always)]
fn dereg_inner(mode: u64, mr: *mut IbvMr) -> (i32, Outcome) {
    if mr.is_null() {
        return (libc::EINVAL, Outcome::Failed);
    }
    // Caching off for good: every MR is libibverbs' own (`register`).
    if mode & fast::OFF != 0 {
        return through::deregister(mr, None);
    }
    if fast::release(mode, mr) {
        return (0, Outcome::Kept);
    }
    match dereg_lane(mr) {
        Ok(done) => done,
        Err(asked) => dereg_full(mr, asked),
    }
}

/// A registration passed through (`Cache::take_passed`), when the fast path is open:
/// libibverbs' dereg inside the guard (as `register_lane`). Err(whether the registry was
/// asked).
#[inline(always)]
fn dereg_lane(mr: *mut IbvMr) -> Result<(i32, Outcome), bool> {
    let cache = crate::runtime::fast::cache_if_open().ok_or(false)?;
    let _guard = Guard::enter().ok_or(false)?;
    let passed = cache.take_passed(mr as usize).ok_or(true)?;
    Ok(through::deregister(mr, sample(cache, passed)))
}

/// The deregistration of a pass-through that was an admission sample is timed too.
#[inline(always)]
fn sample(
    cache: &'static Cache<Provider>,
    passed: Passed,
) -> Option<(&'static Cache<Provider>, usize)> {
    match passed {
        Passed::Timed(len) => Some((cache, len)),
        Passed::Untimed => None,
    }
}

/// `mr` a registration passed through to libibverbs (`Cache::take_passed`): libibverbs'
/// dereg, straight, without asking the cache whether it is one of its handles (its lock,
/// four hash lookups). Inside the guard and the shield, as on the full path (libibverbs'
/// dereg may reach our memory hooks). None: not one (or nested): the full path.
#[inline(never)]
fn dereg_passed(mr: *mut IbvMr) -> Option<(i32, Outcome)> {
    let _guard = Guard::enter()?;
    let (cache, passed) = shielded(
        || {
            let cache = cache()?;
            Some((cache, cache.take_passed(mr as usize)?))
        },
        || None,
    )?;
    // An admission sample: the other half of what a miss of its class costs.
    Some(through::deregister(mr, sample(cache, passed)))
}

/// The full path, apart for the same reason as `register_inner` (`asked`: the
/// registry was asked already, by `dereg_lane`).
#[inline(never)]
fn dereg_full(mr: *mut IbvMr, asked: bool) -> (i32, Outcome) {
    if !asked && let Some(done) = dereg_passed(mr) {
        return done;
    }
    // A remote release's admission figure is timed from here (`Cache::release_at`), on
    // one call in about `SAMPLE_EVERY`: most calls here are not remote releases (a
    // pass-through's, a miss's), and a clock read can be a system call.
    let t_hook =
        mrcache::admission::sampled(mrcache::admission::SAMPLE_EVERY).then(std::time::Instant::now);
    let passthrough = || through::deregister(mr, None);
    with_cache(passthrough, |cache| {
        match cache.release_at(mr as usize, t_hook) {
            Released::Kept => (0, Outcome::Kept),
            Released::Deregistered => (0, Outcome::Deregistered),
            // The parent's, in a fork child: not the child's to deregister.
            Released::NotOurs if crate::runtime::inherited_mr(mr) => (0, Outcome::Kept),
            Released::NotOurs => passthrough(),
            Released::DoubleRelease => {
                trace::write_line(&format!(
                    "mrcache: ibv_dereg_mr({mr:p}): this registration was already deregistered (a second ibv_dereg_mr of the same MR); returning EINVAL"
                ));
                (libc::EINVAL, Outcome::DoubleDereg)
            }
            Released::Failed(e) => (e, Outcome::Failed),
        }
    })
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
            crate::verbs::window::release_pd(pd as usize);
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
            crate::verbs::window::release_context(ctx as usize);
            c.registrar().odp.forget(ctx as usize);
            n
        },
        || real::close_device(ctx),
    )
}

pub fn fork_init() -> i32 {
    let t = if trace::enabled() { trace::now_ns() } else { 0 };
    crate::runtime::fork::FORK_INIT_CALLED.store(true, Relaxed);
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
        through::note_other(mr);
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
