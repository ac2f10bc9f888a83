//! The one way a registration reaches libibverbs and the one way a deregistration does,
//! each with what the cache learns of it: every route that does not serve the cache's own
//! MR ends here (caching off, the pass-through lane, the full path's pass-throughs).

use crate::ffi::{IbvMr, IbvPd};
use crate::runtime::cache;
use crate::runtime::guard::shielded;
use crate::verbs::provider::Provider;
use crate::verbs::real;
use mrcache::cache::{Cache, Request, Sample};
use mrcache::trace::Outcome;
use std::ffi::c_void;

/// What the cache is told of a registration passed to libibverbs.
#[derive(Clone, Copy)]
pub enum Tell {
    /// Nothing: caching is off for good.
    Nothing,
    /// A pass-through the cache decided on (the lane's, admission's on the full path):
    /// recorded in its registry; out of pinnable memory, the cache's idle entries are
    /// given back and libibverbs asked once more.
    Cache(&'static Cache<Provider>),
    /// Any other pass-through of the full path (`nested`: made inside another of our calls
    /// on this thread, whose cache lock may be held).
    Passed { nested: bool },
}

/// The registration the app asked for.
#[derive(Clone, Copy)]
pub struct Reg {
    pub pd: *mut IbvPd,
    pub addr: *mut c_void,
    pub len: usize,
    pub iova: u64,
    pub access: u32,
}

impl Reg {
    /// The registration as the hook received it.
    #[inline(always)]
    pub fn new(pd: *mut IbvPd, addr: *mut c_void, len: usize, iova: u64, access: u32) -> Reg {
        Reg {
            pd,
            addr,
            len,
            iova,
            access,
        }
    }

    /// The cache's request for it, on the PD's `context` (0: for `Cache::plan`, which
    /// reads none).
    #[inline(always)]
    pub fn request(&self, context: usize) -> Request {
        Request {
            pd: self.pd as usize,
            context,
            addr: self.addr as usize,
            len: self.len,
            iova: self.iova,
            access: self.access,
        }
    }

    fn real(&self) -> *mut IbvMr {
        real::reg_mr_iova2(self.pd, self.addr, self.len, self.iova, self.access)
    }
}

/// libibverbs' registration of `reg`, and the cache told of it (`tell`). `sample`: timed
/// as an admission figure of what a miss of its class costs (`Sample::Registration`),
/// unless it had to be retried (its time then holds the deregistrations).
#[inline(always)]
pub fn register(reg: Reg, tell: Tell, sample: Option<&Request>) -> (*mut IbvMr, Outcome) {
    if let Some(req) = sample {
        return register_sampled(reg, tell, req);
    }
    let mut mr = reg.real();
    if mr.is_null() {
        mr = retry(reg, tell);
    } else {
        told(mr, tell);
    }
    (mr, outcome(mr))
}

#[cold]
#[inline(never)]
fn register_sampled(reg: Reg, tell: Tell, req: &Request) -> (*mut IbvMr, Outcome) {
    let t = std::time::Instant::now();
    let mr = reg.real();
    if mr.is_null() {
        let mr = retry(reg, tell);
        return (mr, outcome(mr));
    }
    let ns = t.elapsed().as_nanos() as u64;
    told(mr, tell);
    if let Tell::Cache(cache) = tell {
        shielded(
            || cache.report(Sample::Registration(req, mr as usize), ns),
            || (),
        );
    }
    (mr, Outcome::Bypass)
}

fn outcome(mr: *mut IbvMr) -> Outcome {
    if mr.is_null() {
        Outcome::Failed
    } else {
        Outcome::Bypass
    }
}

/// libibverbs refused `reg`: out of pinnable memory (ENOMEM, EAGAIN) with a cache that
/// gave idle entries back, libibverbs once more (told as an ordinary pass-through); else
/// null with libibverbs' errno in place (the cache lock's futex wait may have changed it).
#[cold]
#[inline(never)]
fn retry(reg: Reg, tell: Tell) -> *mut IbvMr {
    let Tell::Cache(cache) = tell else {
        return std::ptr::null_mut();
    };
    let e = crate::sys::errno();
    let gave_back = matches!(e, libc::ENOMEM | libc::EAGAIN)
        && shielded(|| cache.give_back_idle() > 0, || false);
    if !gave_back {
        real::set_errno(e);
        return std::ptr::null_mut();
    }
    let mr = reg.real();
    if !mr.is_null() {
        told(mr, Tell::Cache(cache));
    }
    mr
}

/// Tell the cache of `mr`, libibverbs' MR (not null), in its registry of MRs that are not
/// its own (lock-free): its `ibv_dereg_mr` goes straight back to libibverbs, and where it
/// reuses the address of one the cache deregistered (a tombstone, kept to catch double
/// deregistrations) it is not refused as a second one.
#[inline(always)]
fn told(mr: *mut IbvMr, tell: Tell) {
    match tell {
        Tell::Nothing => {}
        Tell::Cache(cache) => cache.note_foreign(mr as usize),
        Tell::Passed { nested } => note_passed(mr, nested),
    }
}

/// A pass-through of the full path. A nested one may come from inside the cache (its lock
/// held on this thread, a fork child's cache not renewed yet): the cache the gate was last
/// armed for, which needs nothing built (`cache()` may renew a fork child's). A full group
/// of the registry leaves it to the locked path. (A fork child renews its cache before any
/// call of the child gets it, so `cache()` is the cache the call used.)
fn note_passed(mr: *mut IbvMr, nested: bool) {
    if mr.is_null() {
        return;
    }
    let cache = if nested {
        crate::runtime::fast::last_armed_cache()
    } else {
        cache()
    };
    if let Some(cache) = cache {
        cache.note_foreign(mr as usize);
    }
}

/// Tell the cache of libibverbs' MR `mr` made by another call than a registration
/// (`ibv_reg_dmabuf_mr`, inside the guard).
pub fn note_other(mr: *mut IbvMr) {
    note_passed(mr, false);
}

/// libibverbs' deregistration of `mr`, an MR that is not the cache's. `sample`: the cache
/// that passed its registration of that many bytes through as an admission sample
/// (`Passed::Timed`: the other half of what a miss of its class costs the app).
#[inline(always)]
pub fn deregister(
    mr: *mut IbvMr,
    sample: Option<(&'static Cache<Provider>, usize)>,
) -> (i32, Outcome) {
    match sample {
        None => (real::dereg_mr(mr), Outcome::Passthrough),
        Some((cache, len)) => deregister_sampled(mr, cache, len),
    }
}

#[cold]
#[inline(never)]
fn deregister_sampled(
    mr: *mut IbvMr,
    cache: &'static Cache<Provider>,
    len: usize,
) -> (i32, Outcome) {
    let t = std::time::Instant::now();
    let rc = real::dereg_mr(mr);
    let ns = t.elapsed().as_nanos() as u64;
    shielded(
        || cache.report(Sample::Deregistration { len, ok: rc == 0 }, ns),
        || (),
    );
    (rc, Outcome::Passthrough)
}
