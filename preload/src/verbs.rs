//! What each verbs hook does: registrations through the cache, deregistration, rereg,
//! and the calls that must first flush the cache's idle entries.

use crate::ffi::{self, IbvContext, IbvMr, IbvPd};
use crate::guard::{Guard, shielded, with_cache};
use crate::provider::Provider;
use crate::real;
use crate::runtime::{
    cache, ensure_drain_thread, flush_after_fork, forking, log, note_bypass, runtime,
};
use crate::trace;
use mrcache::cache::{AcquireError, Cache, Detached, Released, Request};
use mrcache::config::{LogLevel, Monitor};
use mrcache::stats::Bypassed;
use mrcache::trace::{Call, Outcome};
use std::ffi::c_void;
use std::sync::atomic::Ordering::*;

/// Every registration entry point lands here. Small enough to inline into each hook: the
/// fast hit, else the full path, each traced apart.
#[inline(always)]
pub fn register(
    call: Call,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut IbvMr {
    if trace::enabled() {
        return register_traced(call, pd, addr, len, iova, access);
    }
    match crate::fast::hit(pd, addr, len, iova, access) {
        Some(mr) => mr,
        None => register_inner(pd, addr, len, iova, access).0,
    }
}

#[inline(never)]
fn register_traced(
    call: Call,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut IbvMr {
    let t = trace::now_ns();
    let (mr, outcome) = match crate::fast::hit(pd, addr, len, iova, access) {
        Some(mr) => (mr, Outcome::Hit),
        None => register_inner(pd, addr, len, iova, access),
    };
    let mut args = [pd as u64, addr as u64, len as u64, iova, access as u64];
    if call == Call::RegMr {
        args = [pd as u64, addr as u64, len as u64, access as u64, 0];
    }
    trace::emit(call, outcome, args, mr as i64, t);
    mr
}

/// The full path. Apart (not inlined): its frame would otherwise be set up on every fast
/// hit too.
#[inline(never)]
fn register_inner(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> (*mut IbvMr, Outcome) {
    let passthrough = |why: Bypassed| {
        note_bypass(why);
        let mr = real::reg_mr_iova2(pd, addr, len, iova, access);
        note_foreign(mr, why == Bypassed::Nested);
        (
            mr,
            if mr.is_null() {
                Outcome::Failed
            } else {
                Outcome::Bypass
            },
        )
    };
    // A remote call's round is timed whole, from here to the return (what the app pays
    // for a hit: the hook's checks, the shadow copy, the window bind and its completion):
    // an admission figure (`Cache::note_remote_hit`), on one call in about
    // `SAMPLE_EVERY` (a clock read is a system call in some guests: every call timed made
    // even a pass-through pay it). Local calls read no clock here.
    let t_hook = (access & mrcache::access::REMOTE != 0
        && mrcache::admission::sampled(mrcache::admission::SAMPLE_EVERY))
    .then(std::time::Instant::now);
    // Before the checks: a disarm after this keeps the fast path shut (see `fast`).
    let seen = crate::fast::seen();
    let Some(_guard) = Guard::enter() else {
        return passthrough(Bypassed::Nested);
    };
    shielded(
        || {
            let Some(rt) = runtime() else {
                return passthrough(Bypassed::SettingUp); // another thread is setting the library up
            };
            if rt.cache.is_none() {
                return passthrough(Bypassed::Disabled);
            }
            let Some(cache) = cache() else {
                return passthrough(Bypassed::SettingUp); // another thread is replacing a fork child's cache
            };
            if forking() {
                return passthrough(Bypassed::SettingUp); // a _Fork() is in progress on another thread
            }
            flush_after_fork(cache);
            if rt.monitor == Monitor::Patch {
                crate::init::check_patches_watched(cache);
            }
            if pd.is_null() {
                return passthrough(Bypassed::NullPd); // libibverbs' own behaviour for a NULL pd
            }
            // SAFETY: pd is the app's non-null PD.
            let context = unsafe { (*pd).context } as usize;
            if crate::runtime::parents_context(context as *mut IbvContext) {
                return passthrough(Bypassed::ParentsContext);
            }
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
                Ok((handle, o)) => {
                    crate::fast::arm(seen, cache, rt.monitor == Monitor::Patch);
                    let o = match o {
                        mrcache::cache::Outcome::Hit => Outcome::Hit,
                        mrcache::cache::Outcome::HitContaining => Outcome::HitContaining,
                        mrcache::cache::Outcome::Miss => Outcome::Miss,
                        mrcache::cache::Outcome::Uncached => Outcome::Uncached,
                    };
                    if let Some(t) = t_hook
                        && matches!(o, Outcome::Hit | Outcome::HitContaining)
                    {
                        cache.note_remote_hit(&req, t.elapsed().as_nanos() as u64);
                    }
                    (handle as *mut IbvMr, o)
                }
                Err(AcquireError::Bypass(b)) => {
                    // Passed through by admission: libibverbs' registration is a sample of
                    // what a miss of its class costs.
                    // Sampled (`Cache::wants_passthrough_sample`); a probe always.
                    let timed = match b {
                        mrcache::access::Bypass::Probe => true,
                        mrcache::access::Bypass::NotWorthCaching
                        | mrcache::access::Bypass::Scan => cache.wants_passthrough_sample(&req),
                        _ => false,
                    };
                    let t = timed.then(std::time::Instant::now);
                    let (mr, o) = passthrough(Bypassed::from(b));
                    if let Some(t) = t
                        && !mr.is_null()
                    {
                        cache.note_passthrough(&req, mr as usize, t.elapsed().as_nanos() as u64);
                    }
                    // libibverbs' MR may reuse the address of one the cache deregistered:
                    // its dereg must not look like a second one (`passthrough` told the
                    // cache already: `note_foreign`).
                    (mr, o)
                }
                Err(AcquireError::Failed(e)) => {
                    real::set_errno(e);
                    (std::ptr::null_mut(), Outcome::Failed)
                }
            }
        },
        || passthrough(Bypassed::Panic),
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

/// As `register`: inlined into the hook, the trace apart.
#[inline(always)]
pub fn dereg_mr(mr: *mut IbvMr) -> i32 {
    if trace::enabled() {
        return dereg_traced(mr);
    }
    dereg_inner(mr).0
}

#[inline(never)]
fn dereg_traced(mr: *mut IbvMr) -> i32 {
    let t = trace::now_ns();
    let (rc, outcome) = dereg_inner(mr);
    trace::emit(
        Call::DeregMr,
        outcome,
        [mr as u64, 0, 0, 0, 0],
        rc as i64,
        t,
    );
    rc
}

fn dereg_inner(mr: *mut IbvMr) -> (i32, Outcome) {
    if mr.is_null() {
        return (libc::EINVAL, Outcome::Failed);
    }
    if crate::fast::release(mr) {
        return (0, Outcome::Kept);
    }
    dereg_full(mr)
}

/// The full path, apart for the same reason as `register_inner`.
#[inline(never)]
fn dereg_full(mr: *mut IbvMr) -> (i32, Outcome) {
    // A remote release's admission figure is timed from here (`Cache::release_at`), on
    // one call in about `SAMPLE_EVERY`: most calls here are not remote releases (a
    // pass-through's, a miss's), and a clock read can be a system call.
    let t_hook =
        mrcache::admission::sampled(mrcache::admission::SAMPLE_EVERY).then(std::time::Instant::now);
    let passthrough = || (real::dereg_mr(mr), Outcome::Passthrough);
    with_cache(passthrough, |cache| {
        match cache.release_at(mr as usize, t_hook) {
            Released::Kept => (0, Outcome::Kept),
            Released::Deregistered => (0, Outcome::Deregistered),
            // The parent's, in a fork child: not the child's to deregister.
            Released::NotOurs if crate::runtime::inherited_mr(mr) => (0, Outcome::Kept),
            // A registration admission passed through: libibverbs' whole dereg is the other
            // half of what a miss of its class costs the app.
            Released::NotOurs if cache.passed_through(mr as usize) => {
                let t = std::time::Instant::now();
                let rc = real::dereg_mr(mr);
                cache.note_passthrough_dereg(mr as usize, t.elapsed().as_nanos() as u64, rc == 0);
                (rc, Outcome::Passthrough)
            }
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
            Detached::NotOurs if crate::runtime::inherited_mr(mr) => {
                // A fork child's rereg of the parent's cached MR would move the parent's
                // registration (and its other users') onto the child's pages.
                refused(mr, flags, pd, addr, len, access, || {
                    trace::write_line(&format!(
                        "mrcache: ibv_rereg_mr({mr:p}): this registration belongs to the parent process's cache (inherited across fork) and cannot be changed here; returning IBV_REREG_MR_ERR_CMD, EOPNOTSUPP"
                    ))
                })
            }
            Detached::NotOurs => passthrough(),
            Detached::Released => {
                // A use after ibv_dereg_mr: libibverbs would change the cached MR in place
                // (or read a freed one). As libibverbs answers bad input.
                trace::write_line(&format!(
                    "mrcache: ibv_rereg_mr({mr:p}): this registration was already deregistered (ibv_rereg_mr after ibv_dereg_mr of the same MR); returning EINVAL"
                ));
                real::set_errno(libc::EINVAL);
                ffi::IBV_REREG_MR_ERR_INPUT
            }
            Detached::Shared
                if mrcache::access::rereg_args_valid(flags, addr as usize, len, access)
                    && has_rereg_op(mr)
                    && let Some(h) = reserve_sole(cache, mr) =>
            {
                sole_rereg(cache, mr, h, flags, pd, addr, len, access)
            }
            Detached::Shared => refused(mr, flags, pd, addr, len, access, || {
                log(
                    LogLevel::Error,
                    format_args!(
                        "ibv_rereg_mr({mr:p}): this registration is shared with other users through the cache (or its remote key is a memory window's) and cannot be changed in place; returning IBV_REREG_MR_ERR_CMD, EOPNOTSUPP; deregister and register instead, or set MRCACHE_ENABLE=0"
                    ),
                )
            }),
            Detached::Alias(m) => {
                // The app's handle is a copy of m (a shadow or window's handle taken over
                // by an earlier rereg): re-register m, then bring the copy level with it
                // (a refused rereg changed nothing: the copy is as it was).
                let rc = provider_rereg(m.ptr as *mut IbvMr, flags, pd, addr, len, access);
                copy_mr(mr, m);
                rc
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

/// `ibv_rereg_mr` of the app's only handle of a registration, a shadow or a revocable
/// registration's handle (its rkey a window's), reserved by `Cache::reserve_sole` (issue
/// 25). The provider is asked first, on the cached MR, with the handle's own rights (a
/// revocable MR had local rights and MW_BIND only, a shared one its first registrant's:
/// CHANGE_ACCESS with the rights the handle registered with, unless the app changes them
/// itself). Refused: the entry and the handle are as they were, window bound, the
/// provider's answer returned: a failed rereg changes nothing the program can see. Done:
/// the window is revoked, the entry leaves the cache, and the app's handle, a copy, takes
/// the MR's new fields and is the MR's own from then on.
#[allow(clippy::too_many_arguments)]
fn sole_rereg(
    cache: &Cache<Provider>,
    mr: *mut IbvMr,
    h: mrcache::cache::SoleHandle,
    flags: i32,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: i32,
) -> i32 {
    let change_access = mrcache::access::REREG_CHANGE_ACCESS;
    let (flags, access) = if flags & change_access != 0 || (!h.grant && h.access == h.entry_access)
    {
        (flags, access)
    } else {
        (flags | change_access, h.access as i32)
    };
    let rc = provider_rereg(h.mr.ptr as *mut IbvMr, flags, pd, addr, len, access);
    if rc != 0 {
        // The provider's errno, not our lock's.
        let e = crate::sys::errno();
        cache.abort_sole(mr as usize, h);
        crate::sys::set_errno(e);
        return rc;
    }
    // The window's key must reach nothing once the handle is the MR's own. Only the
    // window: the registrar's revoke would also hand the slot out again as a spare, and
    // the app keeps it (it goes back at the alias's dereg).
    if h.grant
        && let Err(e) = crate::window::revoke(mr as usize)
    {
        log(
            LogLevel::Error,
            format_args!(
                "ibv_rereg_mr({mr:p}): re-registered, but the old remote key's memory window could be neither unbound nor deallocated (errno {e}); it stays bound until this handle's ibv_dereg_mr"
            ),
        );
    }
    copy_mr(mr, h.mr);
    cache.commit_sole(mr as usize, h);
    0
}

/// The app's handle `mr`, a copy of the provider's MR `m`, takes m's fields (keys, kernel
/// handle, range, PD).
fn copy_mr(mr: *mut IbvMr, m: mrcache::cache::Mr) {
    // SAFETY: both are live MR objects at least VERBS_MR_SIZE long (the copy is a shadow
    // slot, made as such a copy of m), and distinct.
    unsafe {
        std::ptr::copy_nonoverlapping(m.ptr as *const u8, mr as *mut u8, crate::ffi::VERBS_MR_SIZE)
    };
}

/// `Cache::reserve_sole` for the app's handle `mr` over the range it shows.
fn reserve_sole(cache: &Cache<Provider>, mr: *mut IbvMr) -> Option<mrcache::cache::SoleHandle> {
    // SAFETY: a handle the cache handed out (a shadow slot), readable.
    let (addr, len) = unsafe { ((*mr).addr as usize, (*mr).length) };
    cache.reserve_sole(mr as usize, addr, len)
}

/// Whether the provider of `mr`'s context has a rereg op of its own (neither none nor
/// libibverbs' placeholder, which answers for it changing nothing).
fn has_rereg_op(mr: *mut IbvMr) -> bool {
    // SAFETY: a handle the cache handed out: its context is the app's live context.
    let op = unsafe { (*(*mr).context).ops._compat_rereg_mr };
    !op.is_null() && !libibverbs_placeholder(op)
}

/// A rereg the cache cannot hand to the provider for this handle (the registration is
/// shared, the handle's remote key is a window's, or it is the parent's in a fork child),
/// answered as libibverbs answers it (issue 25): its argument checks first
/// (`IBV_REREG_MR_ERR_INPUT`, EINVAL); then, when the provider has no rereg op of its own
/// (libibverbs' placeholder is in the op table: rxe, siw), that op's own answer, which
/// changes nothing (`IBV_REREG_MR_ERR_CMD`, EOPNOTSUPP); otherwise `why` is told and the
/// answer is the same `IBV_REREG_MR_ERR_CMD` with EOPNOTSUPP: this MR cannot be
/// re-registered here, a program falls back to deregister and register. Never a stale errno.
fn refused(
    mr: *mut IbvMr,
    flags: i32,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: i32,
    why: impl FnOnce(),
) -> i32 {
    if !mrcache::access::rereg_args_valid(flags, addr as usize, len, access) {
        real::set_errno(libc::EINVAL);
        return ffi::IBV_REREG_MR_ERR_INPUT;
    }
    // SAFETY: mr is a handle the cache handed out (or the parent's, copied at fork): its
    // context is the app's live context.
    let op = unsafe { (*(*mr).context).ops._compat_rereg_mr };
    if !op.is_null() && libibverbs_placeholder(op) {
        // SAFETY: libibverbs' placeholder rereg op (dummy_ops.c): it reads none of its
        // arguments, sets errno and fails.
        let rc = unsafe {
            let f: ffi::ProviderReregMr = std::mem::transmute(op);
            f(mr, flags, pd, addr, len, access)
        };
        if rc != 0 {
            return ffi::IBV_REREG_MR_ERR_CMD;
        }
    }
    why();
    real::set_errno(libc::EOPNOTSUPP);
    ffi::IBV_REREG_MR_ERR_CMD
}

/// Whether a context's rereg op is libibverbs' own placeholder (the provider has none): it
/// lives in the object `ibv_rereg_mr` itself lives in, a shared libibverbs, while a
/// provider's op lives in the provider's library. Where libibverbs and its providers are
/// linked into one object (static builds) nothing tells them apart: not a placeholder.
fn libibverbs_placeholder(op: *mut c_void) -> bool {
    let Some(wrapper) = real::REREG_MR.get() else {
        return false;
    };
    let object = |p: *const c_void| {
        // SAFETY: Dl_info is plain data, written by dladdr on success.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads the loader's tables.
        if unsafe { libc::dladdr(p, &mut info) } == 0 || info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: dli_fname is the loader's NUL-terminated name of the object.
        let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
        Some((
            info.dli_fbase as usize,
            name.to_bytes().windows(10).any(|w| w == b"libibverbs"),
        ))
    };
    match (object(op), object(wrapper as *const c_void)) {
        (Some((a, true)), Some((b, _))) => a == b,
        _ => false,
    }
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
    if !mrcache::access::rereg_args_valid(flags, addr as usize, len, access) {
        real::set_errno(libc::EINVAL);
        return ffi::IBV_REREG_MR_ERR_INPUT;
    }
    // SAFETY: mr is a live provider-registered MR; the op has the provider rereg prototype.
    unsafe {
        let op = (*(*mr).context).ops._compat_rereg_mr;
        if op.is_null() {
            real::set_errno(libc::EOPNOTSUPP);
            return ffi::IBV_REREG_MR_ERR_INPUT;
        }
        let f: ffi::ProviderReregMr = std::mem::transmute(op);
        if f(mr, flags, pd, addr, len, access) != 0 {
            return ffi::IBV_REREG_MR_ERR_CMD;
        }
        if flags & mrcache::access::REREG_CHANGE_PD != 0 {
            (*mr).pd = pd;
        }
        if flags & mrcache::access::REREG_CHANGE_TRANSLATION != 0 {
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
