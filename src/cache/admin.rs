//! The cache's less frequent operations: flushes before a PD or device goes away, stopping
//! caching, `ibv_rereg_mr`'s detach, `fork()`, and the statistics snapshot.

use super::state::{Entry, Handle};
use super::*;

impl<R: Registrar> Cache<R> {
    /// Stop caching for good: the monitor can no longer be trusted to see memory go away
    /// (`reason` says why). Idle entries are deregistered now; entries in use leave the
    /// index (no new hit) and are deregistered at their last release; from now on every
    /// registration is made for its caller alone. Returns false when already stopped.
    pub fn stop_caching(&self, reason: &str) -> bool {
        if self.stopped.set(reason.to_string()).is_err() {
            return false;
        }
        self.refuse.fetch_or(REFUSE_ALL, SeqCst);
        let idle = {
            let mut st = self.lock();
            let mut idle = st.evict_idle(&self.fast, |_| true);
            for id in st.ids(&self.fast) {
                // Released on the hit path since evict_idle: gone now.
                let prev = st.unindex(&self.fast, id);
                if !slots::dead(prev) && slots::refs(prev) == 0 {
                    idle.extend(st.remove(&self.fast, id));
                }
            }
            idle
        };
        self.deregister_all(&idle);
        true
    }

    /// A registration failed for want of pinnable memory (ENOMEM or EAGAIN: RLIMIT_MEMLOCK,
    /// a device limit): deregister every idle entry so the caller can try once more, the
    /// cache's miss and a call passed through to libibverbs alike (a probe registers a
    /// range the cache still pins: without this the cache fails a registration that
    /// libibverbs alone makes). Deregistrations other threads have in flight (the
    /// background drain's of entries whose memory went away, an eviction's) are waited
    /// for, at most `FLUSH_WAIT`: their pages are not the app's either. Returns how many
    /// were given back or landed meanwhile (0: a retry would fail the same way).
    pub fn give_back_idle(&self) -> usize {
        let (idle, flying) = {
            let mut st = self.lock();
            // Before the eviction: its own MRs are deregistered here, not waited for.
            let flying: Vec<usize> = st.in_flight.keys().copied().collect();
            (st.evict_idle(&self.fast, |_| true), flying)
        };
        self.deregister_all(&idle);
        self.stats.add(Counter::EvictionsEnomem, idle.len() as u64);
        idle.len() + self.wait_landed(&flying)
    }

    /// Wait (at most `FLUSH_WAIT`) until none of the MRs `flying` is still being
    /// deregistered; returns how many landed.
    fn wait_landed(&self, flying: &[usize]) -> usize {
        if flying.is_empty() {
            return 0;
        }
        let deadline = Instant::now() + FLUSH_WAIT;
        loop {
            let left = {
                let st = self.lock();
                flying
                    .iter()
                    .filter(|p| st.in_flight.contains_key(p))
                    .count()
            };
            if left == 0 || Instant::now() >= deadline {
                return flying.len() - left;
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    /// Why caching was stopped, if it was.
    pub fn caching_stopped(&self) -> Option<&str> {
        self.stopped.get().map(String::as_str)
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
        let idle = self.lock().evict_idle(&self.fast, pred);
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
    /// it in place. The provider's pointer held by its caller alone is handed over, also
    /// when the entry is dead (its memory was unmapped and the unmap drained: moving it
    /// with CHANGE_TRANSLATION is what rereg is for). A handle the app released (an idle
    /// entry's MR, a spare shadow, also one being refilled, a released grant, a
    /// deregistered MR) is `Released`: libibverbs would change or read what the cache
    /// holds.
    pub fn detach(&self, ptr: usize) -> Detached {
        let mut st = self.lock();
        match st.handles.get(&ptr) {
            Some(Handle::Uncached { mr, .. }) => {
                let mr = *mr;
                st.handles.remove(&ptr);
                Detached::Sole(mr)
            }
            Some(&Handle::Alias { mr, .. }) => Detached::Alias(mr),
            // A granted handle is not the provider's object: it cannot change in place.
            Some(Handle::Shadow { .. } | Handle::Granted { .. }) => Detached::Shared,
            None => {
                let Some((id, slot)) = self
                    .fast
                    .by_mr(ptr)
                    .and_then(|id| Some((id, self.fast.slots.get(id)?)))
                else {
                    return if st.released(&self.fast, ptr) {
                        Detached::Released
                    } else {
                        Detached::NotOurs
                    };
                };
                if !slot.kill_if_sole() {
                    // Held by others too; or by nobody: the app released it (the entry
                    // idle, or dead and on its way out) and the MR is the cache's.
                    return if slots::holders(slot.load()) > 0 {
                        Detached::Shared
                    } else {
                        Detached::Released
                    };
                }
                match st.remove(&self.fast, id) {
                    Some(mr) => {
                        // Handed to the app, not to a deregistration.
                        self.fast.foreign.forget(mr.ptr);
                        st.land(mr.ptr);
                        Detached::Sole(mr)
                    }
                    None => Detached::NotOurs,
                }
            }
        }
    }

    /// `ibv_rereg_mr` of a shadow or granted handle (a granted one's remote key is a
    /// window's) that is its entry's only reference, over the entry's whole range: reserve
    /// the entry for the provider's rereg of its MR. The entry is marked dead (no
    /// hit, grant or shadow can take it meanwhile) and stays in the cache; the caller asks
    /// the provider, then `commit_sole`s (the entry leaves the cache, the handle becomes an
    /// alias of the MR) or `abort_sole`s (the entry and the handle as they were). None: not
    /// such a handle, others share the registration, or it covers more than the handle's
    /// range `[addr, addr + len)` (re-registered with the app's rights, the wider range
    /// would be the app's, reachable remotely).
    pub fn reserve_sole(&self, ptr: usize, addr: usize, len: usize) -> Option<SoleHandle> {
        let mut st = self.lock();
        let (id, access, grant) = match st.handles.get(&ptr) {
            Some(&Handle::Granted { id, access }) => (id, access, true),
            Some(&Handle::Shadow { id, access }) => (id, access, false),
            _ => return None,
        };
        let e = st.entry(&self.fast, id)?;
        if (e.req.addr, e.req.len) != (addr, len) {
            return None;
        }
        let prev = self.fast.slots.get(id)?.kill_if_sole_other()?;
        st.handles.remove(&ptr);
        Some(SoleHandle {
            mr: e.mr,
            access,
            entry_access: e.req.access,
            grant,
            id,
            was_dead: slots::dead(prev),
        })
    }

    /// The provider re-registered `h.mr` (and a granted handle's window is revoked): the
    /// entry leaves the cache, the app's handle `ptr` (a copy of the MR) is its alias.
    pub fn commit_sole(&self, ptr: usize, h: SoleHandle) {
        let mut st = self.lock();
        if let Some(mr) = st.remove(&self.fast, h.id) {
            // Handed to the app, not to a deregistration.
            self.fast.foreign.forget(mr.ptr);
            st.land(mr.ptr);
        }
        st.handles.insert(
            ptr,
            Handle::Alias {
                mr: h.mr,
                grant: h.grant,
            },
        );
        if h.grant {
            self.stats.add(Counter::RemoteRevokes, 1);
        }
    }

    /// The provider refused the rereg: the entry is live again (unless it was dead before
    /// or its memory was invalidated meanwhile) and `ptr` is the handle it was.
    pub fn abort_sole(&self, ptr: usize, h: SoleHandle) {
        let mut st = self.lock();
        if let Some(slot) = self.fast.slots.get(h.id)
            && !h.was_dead
            && slot.present()
            && slot.indexed()
        {
            slot.revive();
        }
        let (id, access) = (h.id, h.access);
        let handle = if h.grant {
            Handle::Granted { id, access }
        } else {
            Handle::Shadow { id, access }
        };
        st.handles.insert(ptr, handle);
    }

    /// Track an app-owned registration (after `detach`) so its `ibv_dereg_mr` takes the
    /// path that made it.
    pub fn adopt_uncached(&self, mr: Mr) {
        self.fast.foreign.forget(mr.ptr);
        self.lock().handles.insert(
            mr.ptr,
            Handle::Uncached {
                mr,
                len: 0,
                addr: 0,
            },
        );
    }

    /// `fork()` prepare: the ranges of entries in use that this library registered through
    /// the provider (no MADV_DONTFORK from libibverbs on them). The lock is taken only to
    /// read them: nothing is held across the fork (another library's atfork handler may
    /// need the cache, or wait for a thread that does).
    pub fn fork_ranges(&self) -> Vec<(usize, usize)> {
        let st = self.lock();
        st.states(&self.fast)
            // Not dead ones: their memory went away, the range may hold other memory now.
            .filter(|&(e, s)| slots::refs(s) > 0 && !slots::dead(s) && !e.mr.via_wrapper)
            .map(|(e, _)| (e.req.addr, e.req.len))
            .chain(uncached_ranges(&st))
            .collect()
    }

    /// A fork child's cache: empty, with this one's limits, remote-key mode, invalidation
    /// queue and stopped state (a parent that stopped caching has a child that does not
    /// cache either). The inherited cache is never touched again (its lock may be held by
    /// a thread that does not exist in the child), so nothing of it is deregistered: the
    /// child cannot use the parent's verbs objects.
    pub fn renewed(&self, registrar: R) -> Cache<R> {
        let fresh = Cache::with_queue(registrar, self.limits, self.queue)
            .with_remote(self.remote)
            .with_admit(self.admit)
            .with_sampling(self.sample_every);
        let fresh = if self.outer_rounds {
            fresh.with_rounds_timed_by_caller()
        } else {
            fresh
        };
        if let Some(why) = self.caching_stopped() {
            fresh.stop_caching(why);
        }
        fresh
    }

    /// Of a fork child's inherited cache: whether `ptr` is a handle it handed out (the
    /// provider's MR or a shadow or granted copy), which the child must not pass to the
    /// provider (it would deregister the parent's registration). Never waits: its lock may
    /// be held by a thread the child does not have; then None (cannot tell).
    pub fn handed_out(&self, ptr: usize) -> Option<bool> {
        if self.fast.by_mr(ptr).is_some() {
            return Some(true);
        }
        let st = match self.state.try_lock() {
            Ok(st) => st,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(st.handles.contains_key(&ptr))
    }

    /// The counters, hits included, and the entries, bytes and idle entries cached now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let (entries, bytes, idle) = {
            let st = self.lock();
            let idle = st
                .states(&self.fast)
                .filter(|&(_, s)| slots::refs(s) == 0 && !slots::dead(s))
                .count();
            (st.count as u64, st.bytes, idle as u64)
        };
        let mut counts = self.stats.counts();
        counts[Counter::Hits] += self.hits.load().wrapping_add(self.fast.slots.hits());
        StatsSnapshot {
            counts,
            entries,
            bytes,
            idle,
        }
    }

    /// Bytes of lookup metadata the cache holds (for the per-entry figure in benchmarks).
    /// Public for the integration tests only.
    pub fn metadata_bytes(&self) -> usize {
        self.lock().metadata_bytes(&self.fast)
    }

    pub(super) fn note_peak(&self, st: &State) {
        self.stats.max(Counter::PeakEntries, st.count as u64);
        self.stats.max(Counter::PeakBytes, st.bytes);
    }
}

/// The app's uncached registrations this library made through the provider (after
/// `stop_caching`, or a miss that could not be inserted): in use until their
/// `ibv_dereg_mr`, and libibverbs' fork bookkeeping never saw them.
fn uncached_ranges(st: &State) -> impl Iterator<Item = (usize, usize)> + '_ {
    st.handles.values().filter_map(|h| match h {
        Handle::Uncached { mr, len, addr } if *len > 0 && !mr.via_wrapper => Some((*addr, *len)),
        _ => None,
    })
}
