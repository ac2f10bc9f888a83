//! The registration cache: a small policy over `RangeIndex`, refcounted entries and an
//! approximate LRU (a clock) of idle entries. It knows nothing of LD_PRELOAD: registration
//! goes through a `Registrar` (the verbs provider in `libmrcache.so`, a fake in tests).
//!
//! Locking: one mutex guards the state, and it is never held across a `Registrar` call, so
//! a slow registration on one thread never stalls lookups on the others. An exact hit on
//! the provider's own pointer, and its release, take no lock at all: a probe of a
//! lock-free table and one compare-and-swap on the entry's state word (`state::Fast`),
//! and a hit only while no invalidation began since the last drain (`clean`); otherwise
//! they take the locked path, which drains first. So no lookup that starts after an unmap
//! hook began can hit an entry overlapping the unmapped range.

mod admin;
mod claim;
mod hash;
mod lane;
mod miss;
pub use hash::{WordMap, WordSet};
pub use lane::{Plan, Sample};
mod foreign;
mod lock_free;
pub use foreign::Passed;
mod recent;
mod release;
mod slots;
mod state;
mod steady;
mod table;
mod types;
mod uncached;

use hash::Striped;
pub use types::*;

use crate::access::{self, Bypass};
use crate::admission::{self, Access, Classes, Decision, Figures, Verdict};
use crate::config::{Admit, RemoteMode};
use crate::invalidation::InvalidationQueue;
use crate::stats::{Counter, Counters};
use lock_free::{REFUSE_ALL, refusal};
use state::{Claim, Fast, Handle, State, key_hash};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// The longest a flush waits for other threads' deregistrations of the same PD or context.
const FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// `clean` before any drain: never equal to the count of invalidations begun.
const NEVER_DRAINED: u64 = u64::MAX;

/// The registration cache: entries by range, the lock-free hit path, admission and eviction, over a `Registrar`.
pub struct Cache<R: Registrar> {
    registrar: R,
    limits: Limits,
    state: Mutex<State>,
    /// Where memory hooks report unmaps. Its counters of invalidations begun and finished
    /// decide whether a new registration may be cached: none may have been in flight when
    /// it started, and none may have begun before it is inserted (between an unmap hook and
    /// the unmap syscall itself, a new registration would still pin the old pages).
    queue: &'static InvalidationQueue,
    /// Set once by `stop_caching`: why the cache no longer caches.
    stopped: std::sync::OnceLock<String>,
    /// What `try_hit` refuses, in the one word it reads for it (`refusal`).
    refuse: AtomicU32,
    remote: RemoteMode,
    /// `MRCACHE_ADMIT`.
    admit: Admit,
    /// The caller times a remote round whole (hook entry to return) and reports it
    /// (`with_rounds_timed_by_caller`): the cache adds no shorter timing of its own.
    outer_rounds: bool,
    /// Time one call in about this many for the admission figures (1: every call).
    sample_every: u64,
    /// The admission figures of each size class and access kind (never taken on the
    /// lock-free path; never held across a registrar call).
    classes: steady::ClassLock,
    /// The lookup structures the hit path reads without the lock.
    fast: Fast,
    /// The count of invalidations begun as of the last drain that found none in flight
    /// (all of them drained): while the queue's count still equals it, nothing needs
    /// draining and a hit may skip the lock.
    clean: AtomicU64,
    /// The cache's counters, hits apart (`hits`; `snapshot` adds them together).
    pub(crate) stats: Counters,
    /// Hits, counted apart: those of the lock-free path in their slots' state words and
    /// flushed here in bulk, the others here, in stripes picked by the key's hash, so
    /// threads working on different buffers do not write one cache line (`snapshot` adds
    /// them all in).
    hits: Striped,
}

impl<R: Registrar> Cache<R> {
    /// A cache with a queue of its own (tests; the preload shares a static one with its
    /// memory hooks through `with_queue`).
    pub fn new(registrar: R, limits: Limits) -> Cache<R> {
        Self::with_queue(
            registrar,
            limits,
            Box::leak(Box::new(InvalidationQueue::new())),
        )
    }

    /// A cache whose invalidations come through `queue` (the one the memory hooks report to).
    pub fn with_queue(registrar: R, limits: Limits, queue: &'static InvalidationQueue) -> Cache<R> {
        queue.activate();
        Cache {
            limits,
            state: Mutex::new(State::new()),
            queue,
            stopped: std::sync::OnceLock::new(),
            refuse: AtomicU32::new(refusal(RemoteMode::Keep, registrar.verifies())),
            remote: RemoteMode::Keep,
            admit: Admit::Always,
            outer_rounds: false,
            sample_every: 1,
            classes: steady::ClassLock::new(),
            fast: Fast::default(),
            clean: AtomicU64::new(NEVER_DRAINED),
            stats: Counters::new(),
            hits: Striped::default(),
            registrar,
        }
    }

    /// What happens to remote keys (`MRCACHE_REMOTE`); `Keep` unless set.
    pub fn with_remote(mut self, mode: RemoteMode) -> Cache<R> {
        self.remote = mode;
        let stopped = self.refuse.load(Relaxed) & REFUSE_ALL;
        self.refuse = AtomicU32::new(refusal(mode, self.registrar.verifies()) | stopped);
        self
    }

    /// `MRCACHE_REMOTE` as this cache applies it.
    pub fn remote(&self) -> RemoteMode {
        self.remote
    }

    /// Apply every pending invalidation (under the lock); returns the MRs to deregister.
    fn drain_locked(&self, st: &mut State) -> Vec<Mr> {
        let mut to_dereg = Vec::new();
        // Read before draining: when no invalidation is in flight, every one begun so far
        // has pushed its range, and this drain takes them all.
        let quiet = self.queue.quiet();
        if self.queue.has_pending() {
            let mut n = 0u64;
            let fast = &self.fast;
            self.queue.drain(|number, start, end| {
                if let Some(number) = number {
                    st.remember_invalidation(number, start, end);
                }
                let mut ids = Vec::new();
                st.index
                    .for_each_overlap(start, end, |id, _, _| ids.push(id));
                n += ids.len() as u64;
                for id in ids {
                    let prev = st.unindex(fast, id);
                    if !slots::dead(prev) && slots::refs(prev) == 0 {
                        to_dereg.extend(st.remove(fast, id));
                    }
                }
            });
            self.stats.add(Counter::Invalidated, n);
        }
        if let Some(started) = quiet {
            self.clean.store(started, SeqCst);
        }
        to_dereg
    }

    /// Apply pending invalidations now and deregister what they freed (the background
    /// drain, and verbs calls that do not look anything up).
    pub fn drain_pending(&self) -> usize {
        if self.clean() {
            return 0;
        }
        let freed = {
            let mut st = self.lock();
            self.drain_locked(&mut st)
        };
        self.deregister_all(&freed);
        freed.len()
    }

    /// The provider the cache registers through.
    pub fn registrar(&self) -> &R {
        &self.registrar
    }

    /// The limits it was made with.
    /// Public for the integration tests only.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic was caught mid-update at the FFI boundary; the
        // state is still structurally sound (every update is a few plain assignments).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serve a registration: a cached one if one fits, else a new one. Returns the pointer
    /// to hand to the app; or why it passes to libibverbs, and whether admission wants that
    /// registration timed (`report` it as `Sample::Registration`).
    #[inline]
    pub fn acquire(&self, req: &Request) -> Result<(usize, Outcome), AcquireError> {
        match self.serve(req) {
            Err(AcquireError::Bypass { why, .. }) => Err(AcquireError::Bypass {
                why,
                timed: self.times_pass(req, why),
            }),
            served => served,
        }
    }

    fn serve(&self, req: &Request) -> Result<(usize, Outcome), AcquireError> {
        if let Err(b) = access::classify(req.addr, req.len, req.access) {
            return Err(AcquireError::bypass(b));
        }
        if self.stopped.get().is_some() {
            return self.register_uncached(req, Access::Local);
        }
        let remote = req.access & access::REMOTE != 0;
        if remote && self.remote == RemoteMode::Bypass {
            return Err(self.bypass_remote());
        }
        let revocable = remote && self.remote == RemoteMode::Revoke;
        if !revocable
            && !self.registrar.verifies()
            && let Some(h) = self.hit_unlocked(req)
        {
            return Ok((h, Outcome::Hit));
        }
        let kind = if revocable {
            Access::Remote
        } else {
            Access::Local
        };
        let auto = self.admit == Admit::Auto;
        // A passed-through class's miss needs no lookup (its entries serve no hit), but
        // for its key's own entry, which the locked path evicts if idle (an unlocked hint).
        let early = || self.classes().pass_early(kind, req.len, auto);
        if auto && self.fast.exact(req).is_none() && early() {
            self.stats.add(Counter::AdmissionPassedCost, 1);
            return Err(AcquireError::bypass(Bypass::NotWorthCaching));
        }
        if let Some(hit) = self.serve_cached(req, kind, auto)? {
            return Ok(hit);
        }
        // Miss: make room first, register without the lock, then insert.
        let fits = self.make_room_for(req, kind, revocable, auto)?;
        let (started, quiet) = self.quiet_moment();
        let (mr, grant) = self.register_entry(req, kind, revocable)?;
        self.insert_or_release(req, kind, mr, grant, fits, (started, quiet))
    }

    /// Memory in `[start, end)` is going away: no entry overlapping it may be hit again.
    /// Idle entries are deregistered now, entries in use at their last release.
    pub fn invalidate(&self, start: usize, end: usize) {
        self.invalidate_begin(start, end);
        self.invalidate_end();
        self.drain_pending();
    }

    /// What a memory hook does before the memory changes: lock-free, allocation-free.
    /// Public for the integration tests only.
    pub fn invalidate_begin(&self, start: usize, end: usize) {
        self.queue.begin(start, end);
    }

    /// What a memory hook does after the memory changed.
    /// Public for the integration tests only.
    pub fn invalidate_end(&self) {
        self.queue.end();
    }

    /// Deregister MRs that `State::remove` took out of the cache.
    fn deregister_all(&self, mrs: &[Mr]) {
        /// Takes the MR off the in-flight list when the provider call returns or unwinds.
        /// With the deregistration's time when it succeeded: an admission figure.
        struct Landed<'a>(&'a Mutex<State>, usize, &'a steady::ClassLock, Option<f64>);
        impl Drop for Landed<'_> {
            fn drop(&mut self) {
                let mut st = self.0.lock().unwrap_or_else(|e| e.into_inner());
                let class = st.land(self.1);
                drop(st);
                if let (Some(ns), Some((len, revocable))) = (self.3, class) {
                    let kind = if revocable {
                        Access::Remote
                    } else {
                        Access::Local
                    };
                    let mut c = self.2.lock();
                    let f = c.get_mut(kind, len);
                    let before = f.costs(kind);
                    f.dereg.add(ns);
                    f.settle(kind, &before);
                    f.verdict_now(kind); // held current (`Figures::held_verdict`)
                }
            }
        }
        let mut panicked = None;
        for &mr in mrs {
            let mut landed = Landed(&self.state, mr.ptr, &self.classes, None);
            let t = Instant::now();
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.registrar.deregister(mr)
            })) {
                Ok(Ok(())) => landed.3 = Some(t.elapsed().as_nanos() as f64),
                Ok(Err(_)) => {
                    self.stats.add(Counter::DeregFailures, 1);
                }
                Err(p) => {
                    self.stats.add(Counter::DeregFailures, 1);
                    panicked.get_or_insert(p);
                }
            }
        }
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
    }
}

#[cfg(test)]
mod tests;
