//! The registration cache: a small policy over `RangeIndex`, refcounted `Entry`s and an LRU
//! of idle entries. It knows nothing of LD_PRELOAD: registration goes through a `Registrar`
//! (the verbs provider in `libmrcache.so`, a fake in tests).
//!
//! Locking: one mutex guards the state, and it is never held across a `Registrar` call, so
//! a slow registration on one thread never stalls lookups on the others.

use crate::access::{self, Bypass};
use crate::config::RemoteMode;
use crate::index::RangeIndex;
use crate::invalidation::InvalidationQueue;
use crate::stats::{Counter, Counters, Counts};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

const ENOMEM: i32 = 12;
/// How many drained invalidations are remembered for the registration race check.
const RECENT: usize = 1024;
/// How many deregistered MR pointers are remembered to catch double deregistrations.
const TOMBSTONES: usize = 4096;
const EAGAIN: i32 = 11;
/// The longest a flush waits for other threads' deregistrations of the same PD or context.
const FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// What a `Registrar` answers when it cannot revoke remote access (EOPNOTSUPP).
pub const UNSUPPORTED: i32 = 95;

/// A provider registration: the `ibv_mr *` and the path that made it (the deregistration
/// must take the same path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mr {
    pub ptr: usize,
    pub via_wrapper: bool,
}

/// One registration request, as the app made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Request {
    pub pd: usize,
    pub context: usize,
    pub addr: usize,
    pub len: usize,
    pub iova: u64,
    pub access: u32,
}

impl Request {
    fn end(&self) -> usize {
        self.addr + self.len
    }
    fn natural_iova(&self) -> bool {
        self.iova == self.addr as u64
    }
}

/// What the cache needs from the verbs provider.
pub trait Registrar: Sync {
    /// Register exactly the requested range; `Err(errno)` on failure.
    fn register(&self, req: &Request) -> Result<Mr, i32>;
    /// Deregister through the path that registered; `Err(errno)` leaves the MR valid.
    fn deregister(&self, mr: Mr) -> Result<(), i32>;
    /// Memory for one shadow `ibv_mr` (kept and reused by the cache, never freed).
    fn alloc_shadow(&self) -> Option<usize>;
    /// Make `slot` a copy of `mr` whose addr/length are `[addr, addr + len)`.
    fn fill_shadow(&self, slot: usize, mr: Mr, addr: usize, len: usize) -> bool;
    /// A diagnostic check before a hit is handed out (`MRCACHE_VERIFY`): whether `mr`
    /// still pins the pages that back its range now. False makes the hit a miss.
    fn verify(&self, _mr: Mr) -> bool {
        true
    }
    /// `MRCACHE_REMOTE=revoke`: register `req`'s range with its local rights only, so that
    /// its remote rights can be granted per handle (`grant`). `Err(UNSUPPORTED)` when the
    /// device cannot: the request is then passed through uncached.
    fn register_revocable(&self, _req: &Request) -> Result<Mr, i32> {
        Err(UNSUPPORTED)
    }
    /// A new handle for `req` over `mr` (from `register_revocable`) carrying a remote key
    /// of its own that reaches exactly `req`'s range with `req`'s remote rights, and that
    /// no earlier handle carried.
    fn grant(&self, _mr: Mr, _req: &Request) -> Result<usize, i32> {
        Err(UNSUPPORTED)
    }
    /// The app released `handle` (from `grant`): its key must reach nothing once this
    /// returns. `Err` when that cannot be done; the handle then stays valid.
    fn revoke(&self, _handle: usize) -> Result<(), i32> {
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_entries: usize,
    pub max_bytes: u64,
    /// Give concurrent users their own `ibv_mr` copy; allows containing-range hits.
    pub shadow: bool,
    pub remote_superset: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The same range was cached.
    Hit,
    /// A cached registration of a containing range (or wider local rights) served it.
    HitContaining,
    /// Registered now and cached.
    Miss,
    /// Registered now, not cached: limits reached with nothing idle to evict, or the range
    /// was invalidated while it was being registered.
    Uncached,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireError {
    /// Not for the cache: pass the call to libibverbs unchanged.
    Bypass(Bypass),
    /// The provider refused the registration (errno), even after evicting idle entries.
    Failed(i32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The app's reference is gone; the registration stays cached (idle or still in use).
    Kept,
    /// The registration was deregistered (uncached, or invalidated while in use).
    Deregistered,
    /// The pointer is not one the cache handed out: pass it to libibverbs.
    NotOurs,
    /// The pointer was already released: the app's second `ibv_dereg_mr`.
    DoubleRelease,
    /// Deregistration failed with this errno; the handle stays valid.
    Failed(i32),
}

/// Result of taking a registration back from the cache for `ibv_rereg_mr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detached {
    /// The app's handle is the sole user: it is now uncached, the caller owns `Mr`.
    Sole(Mr),
    /// Other users share the provider object; it cannot be changed in place.
    Shared,
    NotOurs,
}

/// A copy of the cache's counters and its size, for reporting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub counts: Counts,
    pub entries: u64,
    pub bytes: u64,
    pub idle: u64,
}

struct Entry {
    req: Request,
    mr: Mr,
    refs: u32,
    /// Invalidated while in use: out of the index, deregistered at the last release.
    dead: bool,
    /// The provider's own pointer is currently held by the app.
    primary_out: bool,
    /// Registered without its remote rights (`register_revocable`): every holder gets a
    /// grant, never the provider's pointer.
    revocable: bool,
    lru: Option<u64>,
}

enum Handle {
    Primary {
        id: u32,
        holders: u32,
    },
    Shadow {
        id: u32,
    },
    /// A handle with its own remote key (`Registrar::grant`), revoked at release.
    Granted {
        id: u32,
    },
    Uncached {
        mr: Mr,
    },
}

type Key = (usize, usize, usize, u32, u64);

fn key(r: &Request) -> Key {
    (r.pd, r.addr, r.len, r.access, r.iova)
}

#[derive(Default)]
struct State {
    entries: Vec<Option<Entry>>,
    free_ids: Vec<u32>,
    index: RangeIndex,
    exact: HashMap<Key, u32>,
    lru: BTreeMap<u64, u32>,
    tick: u64,
    handles: HashMap<usize, Handle>,
    by_mr: HashMap<usize, u32>,
    spare_shadows: HashSet<usize>,
    /// Granted handles the app released (the registrar reuses them): a second release of
    /// one is a double deregistration.
    released_grants: HashSet<usize>,
    count: usize,
    bytes: u64,
    /// Pointers of MRs the cache deregistered after the app had released them, newest last
    /// (bounded): a later `ibv_dereg_mr` of one is a double deregistration, and must not
    /// reach libibverbs with freed memory.
    tombstones: std::collections::VecDeque<usize>,
    tombstone_set: HashSet<usize>,
    /// Recently drained invalidations (number, start, end), newest last: a registration
    /// checks the ones that began while it was pinning pages.
    recent: std::collections::VecDeque<(u64, usize, usize)>,
    /// MRs taken out of the cache and not yet deregistered, with their (pd, context): a
    /// flush before `ibv_dealloc_pd` waits for those of that PD, or the PD would still be
    /// busy. An entry leaves when its deregistration returns or unwinds.
    in_flight: HashMap<usize, Vec<(usize, usize)>>,
}

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
    pub stats: Counters,
}

/// The cache lock, held from `fork()`'s prepare handler to its parent or child handler.
pub struct ForkGuard<'a> {
    guard: MutexGuard<'a, State>,
    queue: &'static InvalidationQueue,
}

impl ForkGuard<'_> {
    /// In the parent: carry on.
    pub fn parent(self) {}

    /// In the child: forget every entry without deregistering (the child cannot use the
    /// parent's verbs objects) and start afresh for the child's own registrations.
    /// `open_here`: memory hooks the forking thread has open (see
    /// `InvalidationQueue::reset_after_fork`).
    pub fn child(mut self, open_here: u64) {
        *self.guard = State {
            index: RangeIndex::new(),
            ..State::default()
        };
        // Other threads' hooks may have been mid-push at the fork: they are gone.
        self.queue.reset_after_fork(open_here);
    }
}

enum Claim {
    Ready(usize),
    NeedShadow { id: u32, mr: Mr },
    NeedGrant { id: u32, mr: Mr },
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
            state: Mutex::new(State {
                index: RangeIndex::new(),
                ..State::default()
            }),
            queue,
            stopped: std::sync::OnceLock::new(),
            remote: RemoteMode::Keep,
            stats: Counters::new(),
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

    pub fn queue(&self) -> &'static InvalidationQueue {
        self.queue
    }

    /// Apply every pending invalidation (under the lock); returns the MRs to deregister.
    fn drain_locked(&self, st: &mut State) -> Vec<Mr> {
        let mut to_dereg = Vec::new();
        if !self.queue.has_pending() {
            return to_dereg;
        }
        let mut n = 0u64;
        self.queue.drain(|number, start, end| {
            if let Some(number) = number {
                if st.recent.len() == RECENT {
                    st.recent.pop_front();
                }
                st.recent.push_back((number, start, end));
            }
            let mut ids = Vec::new();
            st.index
                .for_each_overlap(start, end, |id, _, _| ids.push(id));
            n += ids.len() as u64;
            for id in ids {
                st.unindex(id);
                if st.entry(id).is_some_and(|e| e.refs == 0) {
                    to_dereg.extend(st.remove(id));
                }
            }
        });
        self.stats.add(Counter::Invalidated, n);
        to_dereg
    }

    /// Apply pending invalidations now and deregister what they freed (the background
    /// drain, and verbs calls that do not look anything up).
    pub fn drain_pending(&self) -> usize {
        if !self.queue.has_pending() {
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
            return self.register_uncached(req);
        }
        let remote = req.access & access::REMOTE != 0;
        if remote && self.remote == RemoteMode::Bypass {
            return Err(self.bypass_remote());
        }
        let revocable = remote && self.remote == RemoteMode::Revoke;
        let mut st = self.lock();
        let stale = self.drain_locked(&mut st);
        if !stale.is_empty() {
            drop(st);
            self.deregister_all(&stale);
            st = self.lock();
        }
        let exact = st.exact.get(&key(req)).copied();
        let found = exact.map(|id| (id, Outcome::Hit)).or_else(|| {
            st.find_containing(req, self.limits)
                .map(|id| (id, Outcome::HitContaining))
        });
        if let Some((id, outcome)) = found {
            let claim = st.claim(id, req, self.limits.shadow);
            drop(st);
            if let Some(h) = self.finish_claim(claim, req) {
                if self.verified(id, h) {
                    let counter = if outcome == Outcome::Hit {
                        Counter::Hits
                    } else {
                        Counter::HitsContaining
                    };
                    self.stats.add(counter, 1);
                    return Ok((h, outcome));
                }
            }
            st = self.lock();
        }
        // Miss: make room first, register without the lock, then insert.
        let (evicted, fits) = st.make_room(req.len as u64, self.limits);
        drop(st);
        self.deregister_all(&evicted);
        let (started, quiet) = self.quiet_moment();
        self.stats.add(Counter::Evictions, evicted.len() as u64);

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
            let idle = self.lock().evict_idle(|_| true);
            if !idle.is_empty() {
                self.deregister_all(&idle);
                self.stats.add(Counter::EvictionsEnomem, idle.len() as u64);
                result = register();
            } else {
                result = Err(e);
            }
        }
        self.stats
            .add(Counter::RegistrationNs, t0.elapsed().as_nanos() as u64);
        if revocable && result == Err(UNSUPPORTED) {
            return Err(self.bypass_remote());
        }
        let mr = result.map_err(AcquireError::Failed)?;
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
        let duplicate = st.exact.contains_key(&key(req));
        if fits && !raced && !duplicate && st.fits(req.len as u64, self.limits) {
            st.insert(*req, mr, grant);
            self.note_peak(&st);
            drop(st);
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
            st.handles.insert(mr.ptr, Handle::Uncached { mr });
            drop(st);
            self.deregister_all(&stale);
            self.stats.add(Counter::Uncached, 1);
            Ok((mr.ptr, Outcome::Uncached))
        }
    }

    /// A registration the app owns, released by its `ibv_dereg_mr` (after `stop_caching`).
    fn register_uncached(&self, req: &Request) -> Result<(usize, Outcome), AcquireError> {
        let t0 = Instant::now();
        let result = self.registrar.register(req);
        self.stats
            .add(Counter::RegistrationNs, t0.elapsed().as_nanos() as u64);
        let mr = result.map_err(AcquireError::Failed)?;
        let mut st = self.lock();
        st.unbury(mr.ptr);
        st.handles.insert(mr.ptr, Handle::Uncached { mr });
        drop(st);
        self.stats.add(Counter::Uncached, 1);
        Ok((mr.ptr, Outcome::Uncached))
    }

    /// Stop caching for good: the monitor can no longer be trusted to see memory go away
    /// (`reason` says why). Idle entries are deregistered now; entries in use leave the
    /// index (no new hit) and are deregistered at their last release; from now on every
    /// registration is made for its caller alone. Returns false when already stopped.
    pub fn stop_caching(&self, reason: &str) -> bool {
        if self.stopped.set(reason.to_string()).is_err() {
            return false;
        }
        let idle = {
            let mut st = self.lock();
            let idle = st.evict_idle(|_| true);
            let ids: Vec<u32> = st
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.is_some())
                .map(|(id, _)| id as u32)
                .collect();
            for id in ids {
                st.unindex(id);
            }
            idle
        };
        self.deregister_all(&idle);
        true
    }

    /// Why caching was stopped, if it was.
    pub fn caching_stopped(&self) -> Option<&str> {
        self.stopped.get().map(String::as_str)
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
        let mr = match self.lock().entry(id) {
            Some(e) => e.mr,
            None => return true,
        };
        if self.registrar.verify(mr) {
            return true;
        }
        self.stats.add(Counter::VerifyMismatches, 1);
        self.lock().unindex(id);
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
                        st.handles.insert(h, Handle::Granted { id });
                        self.stats.add(Counter::RemoteGrants, 1);
                        Some(h)
                    }
                    Err(_) => {
                        // Give the reference back; the caller registers afresh instead.
                        if let Some(mr) = st.unref(id) {
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
                    }
                    s
                };
                let slot = spare.or_else(|| self.registrar.alloc_shadow());
                let filled = slot.filter(|&s| self.registrar.fill_shadow(s, mr, req.addr, req.len));
                let mut st = self.lock();
                match filled {
                    Some(s) => {
                        st.handles.insert(s, Handle::Shadow { id });
                        Some(s)
                    }
                    None => {
                        if let Some(s) = slot {
                            st.spare_shadows.insert(s);
                        }
                        // Give the reference back; the caller registers afresh instead.
                        if let Some(mr) = st.unref(id) {
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
        self.drain_pending();
        let mut st = self.lock();
        let Some(handle) = st.handles.remove(&ptr) else {
            let double = st.spare_shadows.contains(&ptr)
                || st.released_grants.contains(&ptr)
                || st.tombstone_set.contains(&ptr)
                || st
                    .by_mr
                    .get(&ptr)
                    .and_then(|&id| st.entry(id))
                    .is_some_and(|e| !e.primary_out);
            if double {
                self.stats.add(Counter::DoubleDeregs, 1);
                return Released::DoubleRelease;
            }
            return Released::NotOurs;
        };
        let to_dereg = match handle {
            Handle::Uncached { mr } => {
                // Tombstoned before the provider can free it (and so reuse the address): a
                // second ibv_dereg_mr of it is then a double release, never handed to
                // libibverbs with freed memory.
                st.bury(ptr);
                drop(st);
                return match self.registrar.deregister(mr) {
                    Ok(()) => Released::Deregistered,
                    Err(e) => {
                        let mut st = self.lock();
                        st.unbury(ptr);
                        st.handles.insert(ptr, Handle::Uncached { mr });
                        Released::Failed(e)
                    }
                };
            }
            Handle::Primary { id, holders } => {
                if holders > 1 {
                    st.handles.insert(
                        ptr,
                        Handle::Primary {
                            id,
                            holders: holders - 1,
                        },
                    );
                } else if let Some(e) = st.entry_mut(id) {
                    e.primary_out = false;
                }
                st.unref(id)
            }
            Handle::Shadow { id } => {
                st.spare_shadows.insert(ptr);
                st.unref(id)
            }
            Handle::Granted { id } => {
                // The key must be dead before ibv_dereg_mr returns; without the lock. Marked
                // released first, so a racing second ibv_dereg_mr of it is a double release,
                // never passed to libibverbs.
                st.released_grants.insert(ptr);
                drop(st);
                if let Err(e) = self.registrar.revoke(ptr) {
                    let mut st = self.lock();
                    st.released_grants.remove(&ptr);
                    st.handles.insert(ptr, Handle::Granted { id });
                    return Released::Failed(e);
                }
                self.stats.add(Counter::RemoteRevokes, 1);
                st = self.lock();
                st.unref(id)
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

    /// Deregister every idle entry of this PD (before `ibv_dealloc_pd`, which would fail
    /// with EBUSY while any MR of the PD exists).
    pub fn flush_pd(&self, pd: usize) -> usize {
        self.flush(|e| e.req.pd == pd, |p, _| p == pd)
    }

    /// Deregister every idle entry of this device context (before `ibv_close_device`).
    pub fn flush_context(&self, context: usize) -> usize {
        self.flush(|e| e.req.context == context, |_, c| c == context)
    }

    /// Deregister every idle entry.
    pub fn flush_all(&self) -> usize {
        self.flush(|_| true, |_, _| true)
    }

    fn flush(&self, pred: impl Fn(&Entry) -> bool, owned: impl Fn(usize, usize) -> bool) -> usize {
        let idle = self.lock().evict_idle(pred);
        self.deregister_all(&idle);
        // Other threads (the background drain) may be deregistering entries of the same PD
        // or context they took out just before: wait for those, a handful of provider calls
        // normally, and never longer than FLUSH_WAIT (a stuck provider call elsewhere must
        // not hang this one; the caller then gets the provider's own EBUSY).
        let deadline = Instant::now() + FLUSH_WAIT;
        while self
            .lock()
            .in_flight
            .values()
            .flatten()
            .any(|&(pd, ctx)| owned(pd, ctx))
            && Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        idle.len()
    }

    /// Take the registration behind `ptr` out of the cache so that `ibv_rereg_mr` can change
    /// it in place.
    pub fn detach(&self, ptr: usize) -> Detached {
        let mut st = self.lock();
        match st.handles.get(&ptr) {
            None => Detached::NotOurs,
            Some(Handle::Uncached { mr }) => {
                let mr = *mr;
                st.handles.remove(&ptr);
                Detached::Sole(mr)
            }
            // A granted handle is not the provider's object: it cannot change in place.
            Some(Handle::Shadow { .. } | Handle::Granted { .. }) => Detached::Shared,
            Some(&Handle::Primary { id, holders }) => {
                let sole = holders == 1 && st.entry(id).is_some_and(|e| e.refs == 1);
                if !sole {
                    return Detached::Shared;
                }
                st.handles.remove(&ptr);
                st.unindex(id);
                match st.remove(id) {
                    Some(mr) => {
                        // Handed to the app, not to a deregistration.
                        st.unbury(mr.ptr);
                        st.land(mr.ptr);
                        Detached::Sole(mr)
                    }
                    None => Detached::NotOurs,
                }
            }
        }
    }

    /// Track an app-owned registration (after `detach`) so its `ibv_dereg_mr` takes the
    /// path that made it.
    pub fn adopt_uncached(&self, mr: Mr) {
        self.lock().handles.insert(mr.ptr, Handle::Uncached { mr });
    }

    /// A registration made outside the cache (passed through to libibverbs) has this
    /// address: it is live, not a tombstone.
    pub fn note_foreign(&self, ptr: usize) {
        self.lock().unbury(ptr);
    }

    /// Whether `ptr` is a handle the app currently holds from the cache.
    pub fn is_handle(&self, ptr: usize) -> bool {
        self.lock().handles.contains_key(&ptr)
    }

    /// `fork()` prepare: hold the cache lock across the fork, so the child never inherits it
    /// mid-update. Returns the guard and the ranges of entries in use that this library
    /// registered through the provider (no MADV_DONTFORK from libibverbs on them).
    pub fn fork_prepare(&self) -> (ForkGuard<'_>, Vec<(usize, usize)>) {
        let st = self.lock();
        let ranges = st
            .entries
            .iter()
            .flatten()
            // Not dead ones: their memory went away, the range may hold other memory now.
            .filter(|e| e.refs > 0 && !e.dead && !e.mr.via_wrapper)
            .map(|e| (e.req.addr, e.req.len))
            .collect();
        (
            ForkGuard {
                guard: st,
                queue: self.queue,
            },
            ranges,
        )
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let (entries, bytes, idle) = {
            let st = self.lock();
            (st.count as u64, st.bytes, st.lru.len() as u64)
        };
        StatsSnapshot {
            counts: self.stats.counts(),
            entries,
            bytes,
            idle,
        }
    }

    fn note_peak(&self, st: &State) {
        self.stats.max(Counter::PeakEntries, st.count as u64);
        self.stats.max(Counter::PeakBytes, st.bytes);
    }

    /// Deregister MRs that `State::remove` took out of the cache.
    fn deregister_all(&self, mrs: &[Mr]) {
        /// Takes the MR off the in-flight list when the provider call returns or unwinds.
        struct Landed<'a>(&'a Mutex<State>, usize);
        impl Drop for Landed<'_> {
            fn drop(&mut self) {
                let mut st = self.0.lock().unwrap_or_else(|e| e.into_inner());
                st.land(self.1);
            }
        }
        let mut panicked = None;
        for &mr in mrs {
            let _landed = Landed(&self.state, mr.ptr);
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.registrar.deregister(mr)
            })) {
                Ok(Ok(())) => {}
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

impl State {
    /// One deregistration of `ptr` returned (or the MR went back to the app).
    fn land(&mut self, ptr: usize) {
        if let Some(v) = self.in_flight.get_mut(&ptr) {
            v.remove(0);
            if v.is_empty() {
                self.in_flight.remove(&ptr);
            }
        }
    }

    fn bury(&mut self, ptr: usize) {
        if self.tombstone_set.insert(ptr) {
            self.tombstones.push_back(ptr);
            if self.tombstones.len() > TOMBSTONES
                && let Some(old) = self.tombstones.pop_front()
            {
                self.tombstone_set.remove(&old);
            }
        }
    }

    /// A live MR now has this address (the allocator reused it).
    fn unbury(&mut self, ptr: usize) {
        if self.tombstone_set.remove(&ptr) {
            self.tombstones.retain(|&p| p != ptr);
        }
    }

    /// Whether a registration that started when `started` invalidations had begun (none
    /// in flight) may have pinned pages that an invalidation begun since is taking away.
    /// Every invalidation numbered in `started..now` must have been drained (else we
    /// cannot tell: raced) and none may overlap the request.
    fn raced(&self, req: &Request, started: u64, now: u64) -> bool {
        if now == started {
            return false;
        }
        let mut seen = 0u64;
        for &(n, s, e) in self.recent.iter().rev() {
            if n >= started && n < now {
                seen += 1;
                if s < req.end() && req.addr < e {
                    return true;
                }
            }
        }
        seen != now - started
    }

    fn entry(&self, id: u32) -> Option<&Entry> {
        self.entries.get(id as usize).and_then(Option::as_ref)
    }

    fn entry_mut(&mut self, id: u32) -> Option<&mut Entry> {
        self.entries.get_mut(id as usize).and_then(Option::as_mut)
    }

    fn find_containing(&self, req: &Request, limits: Limits) -> Option<u32> {
        let mut best: Option<(usize, u32)> = None;
        self.index
            .for_each_overlap(req.addr, req.end(), |id, s, e| {
                let Some(ent) = self.entry(id) else { return };
                let same_range = (s, e) == (req.addr, req.end());
                let usable = ent.req.pd == req.pd
                    && ent.req.natural_iova()
                    && req.natural_iova()
                    && (same_range || limits.shadow)
                    && access::can_serve(
                        ent.req.access,
                        (s, e),
                        req.access,
                        (req.addr, req.end()),
                        limits.remote_superset,
                    );
                if usable && best.is_none_or(|(len, _)| e - s < len) {
                    best = Some((e - s, id));
                }
            });
        best.map(|(_, id)| id)
    }

    /// Take a reference on entry `id` for `req` and decide which pointer the app gets.
    fn claim(&mut self, id: u32, req: &Request, shadow: bool) -> Claim {
        let tick = {
            let e = self.entry_mut(id).expect("indexed entry exists");
            e.refs += 1;
            e.lru.take()
        };
        if let Some(t) = tick {
            self.lru.remove(&t);
        }
        let e = self.entry_mut(id).expect("indexed entry exists");
        let same_range = (e.req.addr, e.req.len) == (req.addr, req.len);
        let mr = e.mr;
        if e.revocable {
            Claim::NeedGrant { id, mr }
        } else if same_range && !e.primary_out {
            e.primary_out = true;
            self.handles
                .insert(mr.ptr, Handle::Primary { id, holders: 1 });
            Claim::Ready(mr.ptr)
        } else if shadow {
            Claim::NeedShadow { id, mr }
        } else {
            // Shadows off: concurrent users share the provider's pointer.
            if let Some(Handle::Primary { holders, .. }) = self.handles.get_mut(&mr.ptr) {
                *holders += 1;
            }
            Claim::Ready(mr.ptr)
        }
    }

    /// Drop one reference; returns the MR to deregister when the entry is gone.
    fn unref(&mut self, id: u32) -> Option<Mr> {
        self.tick += 1;
        let tick = self.tick;
        let e = self.entry_mut(id)?;
        e.refs -= 1;
        if e.refs > 0 {
            return None;
        }
        if e.dead {
            return self.remove(id);
        }
        e.lru = Some(tick);
        self.lru.insert(tick, id);
        None
    }

    fn fits(&self, len: u64, limits: Limits) -> bool {
        self.count < limits.max_entries && self.bytes.saturating_add(len) <= limits.max_bytes
    }

    /// Evict idle entries, least recently used first, until one more entry of `len` bytes
    /// fits. Returns the evicted MRs and whether it now fits.
    fn make_room(&mut self, len: u64, limits: Limits) -> (Vec<Mr>, bool) {
        let mut evicted = Vec::new();
        if len > limits.max_bytes {
            return (evicted, false);
        }
        while !self.fits(len, limits) {
            let Some((_, id)) = self.lru.pop_first() else {
                return (evicted, false);
            };
            if let Some(e) = self.entry_mut(id) {
                e.lru = None;
            }
            self.unindex(id);
            evicted.extend(self.remove(id));
        }
        (evicted, true)
    }

    fn evict_idle(&mut self, pred: impl Fn(&Entry) -> bool) -> Vec<Mr> {
        let ids: Vec<u32> = self
            .lru
            .values()
            .copied()
            .filter(|&id| self.entry(id).is_some_and(&pred))
            .collect();
        ids.iter()
            .filter_map(|&id| {
                self.unindex(id);
                self.remove(id)
            })
            .collect()
    }

    /// A new entry held by the app: through the provider's pointer, or through `grant`.
    fn insert(&mut self, req: Request, mr: Mr, grant: Option<usize>) {
        let e = Entry {
            req,
            mr,
            refs: 1,
            dead: false,
            primary_out: grant.is_none(),
            revocable: grant.is_some(),
            lru: None,
        };
        let id = match self.free_ids.pop() {
            Some(id) => {
                self.entries[id as usize] = Some(e);
                id
            }
            None => {
                self.entries.push(Some(e));
                (self.entries.len() - 1) as u32
            }
        };
        self.unbury(mr.ptr);
        self.index.insert(req.addr, req.end(), id);
        self.exact.insert(key(&req), id);
        self.by_mr.insert(mr.ptr, id);
        match grant {
            Some(h) => {
                self.released_grants.remove(&h);
                self.handles.insert(h, Handle::Granted { id });
            }
            None => {
                self.handles
                    .insert(mr.ptr, Handle::Primary { id, holders: 1 });
            }
        }
        self.count += 1;
        self.bytes += req.len as u64;
    }

    /// Take the entry out of the lookup structures (it can no longer be hit).
    fn unindex(&mut self, id: u32) {
        let Some(e) = self.entry(id) else { return };
        let (req, dead) = (e.req, e.dead);
        if !dead {
            self.index.remove(req.addr, req.end(), id);
        }
        if self.exact.get(&key(&req)) == Some(&id) {
            self.exact.remove(&key(&req));
        }
        if let Some(e) = self.entry_mut(id) {
            e.dead = true;
        }
    }

    /// Forget the entry entirely; returns its MR for deregistration.
    fn remove(&mut self, id: u32) -> Option<Mr> {
        self.unindex(id);
        let e = self.entries.get_mut(id as usize)?.take()?;
        if let Some(t) = e.lru {
            self.lru.remove(&t);
        }
        self.by_mr.remove(&e.mr.ptr);
        self.bury(e.mr.ptr);
        self.in_flight
            .entry(e.mr.ptr)
            .or_default()
            .push((e.req.pd, e.req.context));
        self.free_ids.push(id);
        self.count -= 1;
        self.bytes -= e.req.len as u64;
        Some(e.mr)
    }
}
