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
mod hash;
mod lock_free;
mod slots;
mod state;
mod table;
mod types;

use hash::Striped;
pub use slots::MAX_SLOTS;
pub use types::*;

use crate::access::{self, Bypass};
use crate::admission::{self, Access, Classes, Decision, Figures, Verdict};
use crate::config::{Admit, RemoteMode};
use crate::invalidation::InvalidationQueue;
use crate::stats::{Counter, Counters};
use state::{Claim, Fast, Handle, State, key_hash};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

const ENOMEM: i32 = 12;
const EAGAIN: i32 = 11;
/// The longest a flush waits for other threads' deregistrations of the same PD or context.
const FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// `clean` before any drain: never equal to the count of invalidations begun.
const NEVER_DRAINED: u64 = u64::MAX;

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
    remote: RemoteMode,
    /// `MRCACHE_ADMIT`.
    admit: Admit,
    /// The caller times a remote round whole (from its hook's entry to its return) and
    /// reports it (`note_remote_hit`, `release_at`): the cache does not add its own,
    /// shorter, timing of a remote hit (`with_rounds_timed_by_caller`).
    outer_rounds: bool,
    /// Time one call in about this many for the admission figures (`sampled`); 1 (every
    /// call) unless the caller says (`with_sampling`).
    sample_every: u64,
    /// Registrations admission passed through to libibverbs (remote), by the MR libibverbs
    /// returned: their `ibv_dereg_mr` is timed as the other half of what a miss costs.
    passed_mrs: Mutex<HashMap<usize, usize>>,
    /// The admission figures of each size class and access kind (never taken on the
    /// lock-free path; never held across a registrar call).
    classes: Mutex<Classes>,
    /// The lookup structures the hit path reads without the lock.
    fast: Fast,
    /// The count of invalidations begun as of the last drain that found none in flight
    /// (all of them drained): while the queue's count still equals it, nothing needs
    /// draining and a hit may skip the lock.
    clean: AtomicU64,
    /// A dead entry lost its last reference on the lock-free path (`unclaim`): the next
    /// drain removes it.
    stranded: AtomicBool,
    pub stats: Counters,
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

    pub fn with_queue(registrar: R, limits: Limits, queue: &'static InvalidationQueue) -> Cache<R> {
        queue.activate();
        Cache {
            registrar,
            limits,
            state: Mutex::new(State::new()),
            queue,
            stopped: std::sync::OnceLock::new(),
            remote: RemoteMode::Keep,
            admit: Admit::Always,
            outer_rounds: false,
            sample_every: 1,
            passed_mrs: Mutex::new(HashMap::new()),
            classes: Mutex::new(Classes::default()),
            fast: Fast::default(),
            clean: AtomicU64::new(NEVER_DRAINED),
            stranded: AtomicBool::new(false),
            stats: Counters::new(),
            hits: Striped::default(),
        }
    }

    /// What happens to remote keys (`MRCACHE_REMOTE`); `Keep` unless set.
    pub fn with_remote(mut self, mode: RemoteMode) -> Cache<R> {
        self.remote = mode;
        self
    }

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
        // After `clean`: an entry stranded after this swap leaves `clean` unset.
        if self.stranded.swap(false, SeqCst) {
            let f = &self.fast;
            for id in st.ids(f) {
                let s = f.slots.get(id).map_or(0, |s| s.load());
                if slots::dead(s) && slots::refs(s) == 0 {
                    to_dereg.extend(st.remove(f, id));
                }
            }
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

    pub fn registrar(&self) -> &R {
        &self.registrar
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic was caught mid-update at the FFI boundary; the
        // state is still structurally sound (every update is a few plain assignments).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serve a registration: a cached one if one fits, else a new one. Returns the pointer
    /// to hand to the app.
    pub fn acquire(&self, req: &Request) -> Result<(usize, Outcome), AcquireError> {
        if let Err(b) = access::classify(req.addr, req.len, req.access) {
            return Err(AcquireError::Bypass(b));
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
        // The locked path: timed, a hit's round for the admission figures (the lock-free
        // hits above are not: timing them would cost every hit).
        // Sampled (`admission::sampled`): a clock read is dear in some places, and this
        // path also takes every miss and pass-through, which do not use it.
        let t_start =
            (!(self.outer_rounds && kind == Access::Remote) && self.sampled()).then(Instant::now);
        let mut st = self.lock();
        let stale = self.drain_locked(&mut st);
        if !stale.is_empty() {
            drop(st);
            self.deregister_all(&stale);
            st = self.lock();
        }
        if auto {
            st.see(req, self.limits);
        }
        let exact = self.fast.exact(req);
        let found = exact.map(|id| (id, Outcome::Hit)).or_else(|| {
            st.find_containing(&self.fast, req, self.limits)
                .map(|id| (id, Outcome::HitContaining))
        });
        // A passed-through class's entry (cached before its costs changed, or a trial's
        // whose hits are spent): evicted if idle, and the call takes the miss path.
        let found = match found {
            Some((id, _)) if auto && !self.classes().allow_hit(kind, req.len, auto) => {
                let idle = self.fast.slots.get(id).is_some_and(|s| s.kill_if_idle());
                if idle {
                    let gone: Vec<Mr> = st.remove(&self.fast, id).into_iter().collect();
                    drop(st);
                    self.stats.add(Counter::Evictions, gone.len() as u64);
                    self.deregister_all(&gone);
                    st = self.lock();
                    None
                } else {
                    found
                }
            }
            _ => found,
        };
        if found.is_some()
            && kind == Access::Remote
            && self.classes().probe_hit(kind, req.len, auto)
        {
            // Re-measure what a miss of this class costs: libibverbs registers this one
            // (the preload times it: `note_passthrough`).
            return Err(AcquireError::Bypass(Bypass::Probe));
        }
        // A hit the sampling did not time, of a class whose round needs figures (a trial's
        // hits, the first few): timed from here (the claim, the shadow copy, the bind).
        let t_start = t_start.or_else(|| {
            (found.is_some() && self.needs_round_sample(kind, req.len)).then(Instant::now)
        });
        if let Some((id, outcome)) = found
            && let Some(claim) = st.claim(&self.fast, id, req, self.limits.shadow)
        {
            drop(st);
            if let Some(h) = self.finish_claim(claim, req) {
                if self.verified(id, h) {
                    match outcome {
                        Outcome::Hit => self.hits.add(0, 1),
                        _ => self.stats.add(Counter::HitsContaining, 1),
                    }
                    if let Some(t) = t_start {
                        let ns = t.elapsed().as_nanos() as f64;
                        self.figures(kind, req.len, |f| f.hit.add(ns));
                    }
                    return Ok((h, outcome));
                }
            }
            st = self.lock();
        }
        // Miss: make room first, register without the lock, then insert.
        drop(st);
        // Admission first: a call passed through is registered as without the cache, so
        // it needs no device-memory probe (two system calls, dear in a guest).
        let decision = self.classes().decide(kind, req.len, auto);
        if decision != Decision::PassThrough
            && let Some(b) = self.registrar.uncacheable(req)
        {
            return Err(AcquireError::Bypass(b));
        }
        match decision {
            Decision::PassThrough => {
                self.stats.add(Counter::AdmissionPassedCost, 1);
                // Local or remote, libibverbs registers it (as without the cache: its
                // fork bookkeeping, MADV_DONTFORK under RDMAV_FORK_SAFE, applies).
                return Err(AcquireError::Bypass(Bypass::NotWorthCaching));
            }
            Decision::Trial => self.stats.add(Counter::AdmissionTrials, 1),
            Decision::Cache => {}
        }
        // Timed on a sample of the calls (`sampled`): this runs on every miss, and on every
        // call the scan rule passes through.
        let time_room = self.sampled();
        let mut st = self.lock();
        let t_room = time_room.then(Instant::now);
        let room = st.make_room(
            &self.fast,
            req.len as u64,
            self.limits,
            auto.then(|| key_hash(req)),
        );
        let room_ns = t_room.map(|t| t.elapsed().as_nanos() as f64);
        drop(st);
        let (evicted, fits) = (room.evicted, room.fits);
        if !evicted.is_empty()
            && let Some(ns) = room_ns
        {
            let per = ns / evicted.len() as f64;
            self.figures(kind, req.len, |f| f.evict.add(per));
        }
        self.deregister_all(&evicted);
        self.stats.add(Counter::Evictions, evicted.len() as u64);
        if room.refused {
            // Scan resistance: the cache is full of entries used more often than this one
            // was seen; as without the cache.
            self.stats.add(Counter::AdmissionPassedScan, 1);
            return Err(AcquireError::Bypass(Bypass::Scan));
        }
        if revocable && !fits {
            // It could not be cached: a revocable registration and its grant would only be
            // given back (an uncached handle needs the registration's own remote rights).
            return Err(self.bypass_remote());
        }
        let (started, quiet) = self.quiet_moment();

        let t0 = Instant::now();
        let register = || {
            if revocable {
                self.registrar.register_revocable(req)
            } else {
                self.registrar.register(req)
            }
        };
        let mut result = register();
        if let Err(e @ (ENOMEM | EAGAIN)) = result {
            // Out of pinnable memory (RLIMIT_MEMLOCK, device limits): give back every idle
            // registration and try once more.
            let idle = self.lock().evict_idle(&self.fast, |_| true);
            if !idle.is_empty() {
                self.deregister_all(&idle);
                self.stats.add(Counter::EvictionsEnomem, idle.len() as u64);
                result = register();
            } else {
                result = Err(e);
            }
        }
        let reg_ns = t0.elapsed().as_nanos();
        self.stats.add(Counter::RegistrationNs, reg_ns as u64);
        if revocable && result == Err(UNSUPPORTED) {
            return Err(self.bypass_remote());
        }
        let mr = result.map_err(AcquireError::Failed)?;
        self.figures(kind, req.len, |f| f.reg.add(reg_ns as f64));
        let grant = if revocable {
            match self.registrar.grant(mr, req) {
                Ok(h) => Some(h),
                Err(_) => {
                    // No window for it: libibverbs registers it with its own keys instead.
                    if self.registrar.deregister(mr).is_err() {
                        self.stats.add(Counter::DeregFailures, 1);
                    }
                    return Err(self.bypass_remote());
                }
            }
        } else {
            None
        };

        let mut st = self.lock();
        let stale = self.drain_locked(&mut st);
        let raced =
            !quiet || st.raced(req, started, self.queue.started()) || self.stopped.get().is_some();
        // Another thread may have missed on the same key and inserted meanwhile: one
        // cached registration per key (this one is released uncached).
        let duplicate = self.fast.exact(req).is_some();
        if fits
            && !raced
            && !duplicate
            && st.fits(req.len as u64, self.limits)
            && st.insert(&self.fast, *req, mr, grant)
        {
            self.note_peak(&st);
            let round = (kind == Access::Local).then(|| self.time_round(req, mr.ptr));
            drop(st);
            if let Some(Some(ns)) = round {
                self.figures(kind, req.len, |f| f.round.add(ns));
            }
            self.deregister_all(&stale);
            self.stats.add(Counter::Misses, 1);
            if grant.is_some() {
                self.stats.add(Counter::RemoteGrants, 1);
            }
            Ok((grant.unwrap_or(mr.ptr), Outcome::Miss))
        } else if let Some(h) = grant {
            // Not cacheable now; an uncached handle needs the registration's own remote
            // rights, which ours lacks: give both back and let libibverbs register it.
            drop(st);
            self.deregister_all(&stale);
            if self.registrar.revoke(h).is_err() || self.registrar.deregister(mr).is_err() {
                self.stats.add(Counter::DeregFailures, 1);
            }
            Err(self.bypass_remote())
        } else {
            st.unbury(mr.ptr);
            st.handles.insert(mr.ptr, Handle::uncached(mr, req));
            drop(st);
            self.deregister_all(&stale);
            self.stats.add(Counter::Uncached, 1);
            Ok((mr.ptr, Outcome::Uncached))
        }
    }

    /// A registration the app owns, released by its `ibv_dereg_mr` (after `stop_caching`,
    /// and a miss passed through by admission).
    fn register_uncached(
        &self,
        req: &Request,
        kind: Access,
    ) -> Result<(usize, Outcome), AcquireError> {
        let t0 = Instant::now();
        let result = self.registrar.register(req);
        let ns = t0.elapsed().as_nanos();
        self.stats.add(Counter::RegistrationNs, ns as u64);
        let mr = result.map_err(AcquireError::Failed)?;
        if self.stopped.get().is_none() {
            self.figures(kind, req.len, |f| f.reg.add(ns as f64));
        }
        let mut st = self.lock();
        st.unbury(mr.ptr);
        st.handles.insert(mr.ptr, Handle::uncached(mr, req));
        drop(st);
        self.stats.add(Counter::Uncached, 1);
        Ok((mr.ptr, Outcome::Uncached))
    }

    /// What a local cached round costs, timed on the entry just inserted for `req` (cache
    /// lock held, so nothing can drain it, and the app's coming reference keeps ours from
    /// being the last): the lock-free hit's probe and claim, and the lock-free release's
    /// probe and release, of one extra reference. The best of a few; `None` when the class
    /// has enough samples (one new one in `ROUND_EVERY` misses then).
    fn time_round(&self, req: &Request, ptr: usize) -> Option<f64> {
        const ROUND_EVERY: u64 = 64;
        let n = self.classes().get(Access::Local, req.len).round.samples;
        let misses = self.stats.get(Counter::Misses);
        if n >= 4 && misses % ROUND_EVERY != 0 {
            return None;
        }
        let hash = key_hash(req);
        let mut best = f64::INFINITY;
        for _ in 0..4 {
            let t = Instant::now();
            let claimed = self.fast.exact_candidates(hash, |id, slot| {
                (slot.has_key(req) && slot.claim_other()).then_some(id)
            })?;
            let released = self.fast.mr_candidates(ptr, |id, slot| {
                (id == claimed && slot.mr_ptr() == ptr).then(|| slot.release_other())
            });
            let ns = t.elapsed().as_nanos() as f64;
            if released.is_none() {
                // Not found by its pointer (cannot happen under the lock): give it back.
                self.fast.slots.get(claimed)?.release_other();
                return None;
            }
            best = best.min(ns.max(1.0));
        }
        Some(best)
    }

    fn kind_of(&self, req: &Request) -> Access {
        if req.access & access::REMOTE != 0 && self.remote == RemoteMode::Revoke {
            Access::Remote
        } else {
            Access::Local
        }
    }

    /// The preload passed `req` through to libibverbs for admission (`NotWorthCaching`,
    /// `Scan`, `Probe`), libibverbs' whole `ibv_reg_mr` took `ns` and returned `mr`: a
    /// sample of what the class's miss costs the app (`Figures::pass_reg`). `mr`'s
    /// `ibv_dereg_mr` is the other half (`note_passthrough_dereg`).
    /// Whether the preload should time this pass-through of `req` (`note_passthrough`):
    /// while its class has fewer than 4 such samples or its last one moved the figure by
    /// more than a quarter (`Figures::pass_moving`: a change of cost is followed at every
    /// call), else one call in about `admission::SAMPLE_EVERY` (each timing costs two
    /// clock reads, and one more at its deregistration for a remote class).
    pub fn wants_passthrough_sample(&self, req: &Request) -> bool {
        let kind = self.kind_of(req);
        let f = *self.classes().get(kind, req.len);
        f.pass_reg.samples < 4 || f.pass_moving || self.sampled()
    }

    pub fn note_passthrough(&self, req: &Request, mr: usize, ns: u64) {
        let kind = self.kind_of(req);
        self.figures(kind, req.len, |f| {
            let before = f.pass_reg.value;
            f.pass_reg.add(ns as f64);
            let after = f.pass_reg.value;
            f.pass_moving = before > 0.0 && (after - before).abs() > 0.25 * before.min(after);
        });
        if kind == Access::Remote && mr != 0 {
            self.passed_mrs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(mr, req.len);
        }
    }

    /// Whether `mr` is a registration admission passed through (its `ibv_dereg_mr` is to be
    /// timed and reported with `note_passthrough_dereg`).
    pub fn passed_through(&self, mr: usize) -> bool {
        self.passed_mrs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&mr)
    }

    /// libibverbs' whole `ibv_dereg_mr` of `mr`, a registration admission passed through,
    /// took `ns` (`ok`: it succeeded): a sample of the class's miss (`Figures::pass_dereg`).
    pub fn note_passthrough_dereg(&self, mr: usize, ns: u64, ok: bool) {
        let len = self
            .passed_mrs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&mr);
        if let (Some(len), true) = (len, ok) {
            self.figures(Access::Remote, len, |f| f.pass_dereg.add(ns as f64));
        }
    }

    /// The caller (the preload) times remote rounds whole, from its hook's entry to its
    /// return, and reports them (`note_remote_hit`, `release_at`).
    pub fn with_rounds_timed_by_caller(mut self) -> Cache<R> {
        self.outer_rounds = true;
        self
    }

    /// Time one admission figure's call (a locked round, a pass-through, a release) in about
    /// `every` (`admission::SAMPLE_EVERY` in the preload, where a clock read can cost a
    /// system call); the first samples of a pass-through class are always taken.
    pub fn with_sampling(mut self, every: u64) -> Cache<R> {
        self.sample_every = every.max(1);
        self
    }

    /// Whether a cached round of this class is to be timed whatever the sampling: while
    /// it has fewer than 4 hit or release figures, and while the class is passed through
    /// (its hits are a trial's, the figures that can bring it back).
    fn needs_round_sample(&self, kind: Access, len: usize) -> bool {
        if self.sample_every <= 1 {
            return false; // every call is timed already
        }
        let c = self.classes();
        let f = c.get(kind, len);
        f.hit.samples < 4 || f.release.samples < 4 || f.verdict_shown(kind) == Verdict::PassThrough
    }

    /// Whether this call is to be timed for the admission figures (`with_sampling`).
    pub fn sampled(&self) -> bool {
        admission::sampled(self.sample_every)
    }

    /// A remote hit of `req` cost the app `ns`, hook entry to return (the bind and its
    /// completion, the shadow copy, the hook's own checks): a sample of the cached round.
    pub fn note_remote_hit(&self, req: &Request, ns: u64) {
        if self.kind_of(req) == Access::Remote {
            self.figures(Access::Remote, req.len, |f| f.hit.add(ns as f64));
        }
    }

    fn classes(&self) -> MutexGuard<'_, Classes> {
        self.classes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Update one class's admission figures (never with the state lock held). When that
    /// turns the class to pass-through, its idle entries go (local hits take the lock-free
    /// path, which does not look at the verdict).
    fn figures(&self, kind: Access, len: usize, f: impl FnOnce(&mut Figures)) {
        let flipped = {
            let mut c = self.classes();
            let fig = c.get_mut(kind, len);
            let costs = fig.costs(kind);
            let before = fig.verdict_shown(kind);
            f(fig);
            fig.settle(kind, &costs);
            let after = fig.verdict_now(kind);
            before == Verdict::Cache && after == Verdict::PassThrough
        };
        // A remote class's entries go lazily (every remote hit takes the locked path, which
        // evicts an idle entry of a passed-through class); a local one's now, in one pass.
        if flipped && kind == Access::Local && self.admit == Admit::Auto {
            let class = admission::size_class(len);
            let remote = self.remote;
            let pred = |e: &state::Entry| {
                let revocable = e.req.access & access::REMOTE != 0 && remote == RemoteMode::Revoke;
                admission::size_class(e.req.len) == class && revocable == (kind == Access::Remote)
            };
            // The class's own entries only (its list), not every entry's: a local class
            // is those without remote rights, and those with them unless under revoke.
            let mut st = self.lock();
            let mut idle = st.evict_idle_class(&self.fast, class, false, pred);
            if remote != RemoteMode::Revoke {
                idle.extend(st.evict_idle_class(&self.fast, class, true, pred));
            }
            drop(st);
            self.stats.add(Counter::Evictions, idle.len() as u64);
            self.deregister_all(&idle);
        }
    }

    /// `MRCACHE_ADMIT` (`Always` unless set: every registration caches).
    pub fn with_admit(mut self, admit: Admit) -> Cache<R> {
        self.admit = admit;
        self
    }

    pub fn admit(&self) -> Admit {
        self.admit
    }

    /// The admission figures and decisions of every measured class.
    pub fn admission(&self) -> Classes {
        self.classes().clone()
    }

    fn bypass_remote(&self) -> AcquireError {
        AcquireError::Bypass(Bypass::Remote)
    }

    /// A moment with no invalidation in flight, from which on those begun can be checked
    /// one by one. Unmap hooks are a system call long: wait for a few of them rather than
    /// give up caching this registration because another thread happened to be unmapping.
    fn quiet_moment(&self) -> (u64, bool) {
        for _ in 0..256 {
            if let Some(started) = self.queue.quiet() {
                return (started, true);
            }
            std::thread::yield_now();
        }
        (self.queue.started(), false)
    }

    /// `MRCACHE_VERIFY`: check the entry behind a hit; on a mismatch the entry leaves the
    /// index, the app's new handle is released (deregistering it if it was the last) and
    /// the caller registers afresh.
    fn verified(&self, id: u32, handle: usize) -> bool {
        if !self.registrar.verifies() {
            return true;
        }
        let mr = match self.lock().entry(&self.fast, id) {
            Some(e) => e.mr,
            None => return true,
        };
        if self.registrar.verify(mr) {
            return true;
        }
        self.stats.add(Counter::VerifyMismatches, 1);
        self.lock().unindex(&self.fast, id);
        self.release(handle);
        false
    }

    fn finish_claim(&self, claim: Claim, req: &Request) -> Option<usize> {
        match claim {
            Claim::Ready(h) => Some(h),
            Claim::NeedGrant { id, mr } => {
                let granted = self.registrar.grant(mr, req);
                let mut st = self.lock();
                match granted {
                    Ok(h) => {
                        st.released_grants.remove(&h);
                        st.handles.insert(
                            h,
                            Handle::Granted {
                                id,
                                access: req.access,
                            },
                        );
                        self.stats.add(Counter::RemoteGrants, 1);
                        Some(h)
                    }
                    Err(_) => {
                        // Give the reference back; the caller registers afresh instead.
                        if let Some(mr) = st.unref(&self.fast, id) {
                            drop(st);
                            self.deregister_all(&[mr]);
                        }
                        None
                    }
                }
            }
            Claim::NeedShadow { id, mr } => {
                let spare = {
                    let mut st = self.lock();
                    let s = st.spare_shadows.iter().next().copied();
                    if let Some(s) = s {
                        st.spare_shadows.remove(&s);
                        // Neither spare nor handed out while it is filled without the
                        // lock: a release or rereg of the app's old handle meanwhile is
                        // still a double release (review-3 W4).
                        st.refilling.insert(s);
                    }
                    s
                };
                let slot = spare.or_else(|| self.registrar.alloc_shadow());
                let filled = slot.filter(|&s| self.registrar.fill_shadow(s, mr, req.addr, req.len));
                let mut st = self.lock();
                if let Some(s) = spare {
                    st.refilling.remove(&s);
                }
                match filled {
                    Some(s) => {
                        st.handles.insert(
                            s,
                            Handle::Shadow {
                                id,
                                access: req.access,
                            },
                        );
                        Some(s)
                    }
                    None => {
                        if let Some(s) = slot {
                            st.spare_shadows.insert(s);
                        }
                        // Give the reference back; the caller registers afresh instead.
                        if let Some(mr) = st.unref(&self.fast, id) {
                            drop(st);
                            self.deregister_all(&[mr]);
                        }
                        None
                    }
                }
            }
        }
    }

    /// The app's `ibv_dereg_mr(ptr)`.
    pub fn release(&self, ptr: usize) -> Released {
        self.release_at(ptr, self.sampled().then(Instant::now))
    }

    /// `release`, for a hook entered at `t_start`: a remote release's admission figure is
    /// timed from there (what the app's `ibv_dereg_mr` costs, not only the cache's part).
    /// `None`: not a sampled call (`admission::sampled`), no figure.
    pub fn release_at(&self, ptr: usize, t_start: Option<Instant>) -> Released {
        self.drain_pending();
        // The provider's own pointer, not the last reference of a dead entry: no lock.
        if let Some(released) = self.try_release(ptr) {
            return released;
        }
        let mut st = self.lock();
        let Some(handle) = st.handles.remove(&ptr) else {
            return match st.release_primary(&self.fast, ptr) {
                Ok(None) => Released::Kept,
                Ok(Some(mr)) => {
                    drop(st);
                    // Invalidated while in use, now released: gone.
                    self.deregister_all(&[mr]);
                    Released::Deregistered
                }
                Err(()) => {
                    let double = st.released(ptr) || self.fast.by_mr(ptr).is_some();
                    if double {
                        self.stats.add(Counter::DoubleDeregs, 1);
                        Released::DoubleRelease
                    } else {
                        Released::NotOurs
                    }
                }
            };
        };
        let to_dereg = match handle {
            Handle::Uncached { mr, len, .. } => {
                // Tombstoned before the provider can free it (and so reuse the address): a
                // second ibv_dereg_mr of it is then a double release, never handed to
                // libibverbs with freed memory.
                st.bury(ptr);
                drop(st);
                let t = Instant::now();
                return match self.registrar.deregister(mr) {
                    Ok(()) => {
                        if len > 0 {
                            let ns = t.elapsed().as_nanos() as f64;
                            self.figures(Access::Local, len, |f| f.dereg.add(ns));
                        }
                        Released::Deregistered
                    }
                    Err(e) => {
                        let mut st = self.lock();
                        st.unbury(ptr);
                        st.handles
                            .insert(ptr, Handle::Uncached { mr, len, addr: 0 });
                        Released::Failed(e)
                    }
                };
            }
            Handle::Alias { mr, grant } => {
                // Marked released first: a second ibv_dereg_mr of it is a double release.
                st.released_grants.insert(ptr);
                drop(st);
                if let Err(e) = self.registrar.deregister(mr) {
                    let mut st = self.lock();
                    st.released_grants.remove(&ptr);
                    st.handles.insert(ptr, Handle::Alias { mr, grant });
                    return Released::Failed(e);
                }
                if grant {
                    self.registrar.recycle_grant(ptr);
                } else {
                    let mut st = self.lock();
                    st.released_grants.remove(&ptr);
                    st.spare_shadows.insert(ptr);
                }
                return Released::Deregistered;
            }
            Handle::Shadow { id, .. } => {
                st.spare_shadows.insert(ptr);
                st.unref(&self.fast, id)
            }
            Handle::Granted { id, access } => {
                // The key must be dead before ibv_dereg_mr returns; without the lock. Marked
                // released first, so a racing second ibv_dereg_mr of it is a double release,
                // never passed to libibverbs.
                st.released_grants.insert(ptr);
                let len0 = st.entry(&self.fast, id).map_or(0, |e| e.req.len);
                drop(st);
                // Not a sampled call, but the class's round needs figures (a trial's
                // release, the first few): timed from here (the unbind and its completion).
                let t_start = t_start.or_else(|| {
                    (len0 > 0 && self.needs_round_sample(Access::Remote, len0)).then(Instant::now)
                });
                if let Err(e) = self.registrar.revoke(ptr) {
                    let mut st = self.lock();
                    st.released_grants.remove(&ptr);
                    st.handles.insert(ptr, Handle::Granted { id, access });
                    return Released::Failed(e);
                }
                self.stats.add(Counter::RemoteRevokes, 1);
                st = self.lock();
                let len = st.entry(&self.fast, id).map_or(0, |e| e.req.len);
                let gone = st.unref(&self.fast, id);
                drop(st);
                if len > 0
                    && let Some(t) = t_start
                {
                    let ns = t.elapsed().as_nanos() as f64;
                    self.figures(Access::Remote, len, |f| f.release.add(ns));
                }
                st = self.lock();
                gone
            }
        };
        drop(st);
        match to_dereg {
            None => Released::Kept,
            Some(mr) => {
                // Invalidated while in use, now released: gone. A failure is counted (the
                // app released it; nothing can hand it out again).
                self.deregister_all(&[mr]);
                Released::Deregistered
            }
        }
    }

    /// Memory in `[start, end)` is going away: no entry overlapping it may be hit again.
    /// Idle entries are deregistered now, entries in use at their last release.
    pub fn invalidate(&self, start: usize, end: usize) {
        self.invalidate_begin(start, end);
        self.invalidate_end();
        self.drain_pending();
    }

    /// What a memory hook does before the memory changes: lock-free, allocation-free.
    pub fn invalidate_begin(&self, start: usize, end: usize) {
        self.queue.begin(start, end);
    }

    /// What a memory hook does after the memory changed.
    pub fn invalidate_end(&self) {
        self.queue.end();
    }

    /// Deregister MRs that `State::remove` took out of the cache.
    fn deregister_all(&self, mrs: &[Mr]) {
        /// Takes the MR off the in-flight list when the provider call returns or unwinds.
        /// With the deregistration's time when it succeeded: an admission figure.
        struct Landed<'a>(&'a Mutex<State>, usize, &'a Mutex<Classes>, Option<f64>);
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
                    let mut c = self.2.lock().unwrap_or_else(|e| e.into_inner());
                    let f = c.get_mut(kind, len);
                    let before = f.costs(kind);
                    f.dereg.add(ns);
                    f.settle(kind, &before);
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
mod class_flip;
#[cfg(test)]
mod stale_words;
