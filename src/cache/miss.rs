//! The locked path of `Cache::acquire`: a cached entry served under the lock, and a miss
//! (admission and room, the registration without the lock, the insertion).

use super::*;

impl<R: Registrar> Cache<R> {
    /// Look `req` up under the lock and serve a cached entry that may serve it: Some(the
    /// handle and how it was served); None: a miss; Err: pass it through (a probe, a key
    /// whose entry holds all the references it can).
    pub(super) fn serve_cached(
        &self,
        req: &Request,
        kind: Access,
        auto: bool,
    ) -> Result<Option<(usize, Outcome)>, AcquireError> {
        // The locked path: timed, a hit's round for the admission figures (the lock-free
        // hits above are not). Sampled: a clock read is dear in some places.
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
            st.find_containing(&self.fast, req, self.limits, || {
                !self.registrar.pins_charged()
            })
            .map(|id| (id, Outcome::HitContaining))
        });
        // A found entry: may it serve the hit, and is a remote class's hit a probe instead
        // (one classes visit). With `always` both are answered without asking.
        let remote_auto = auto && kind == Access::Remote;
        let (allowed, probe) = match found {
            Some(_) if auto => {
                let mut c = self.classes();
                let allowed = c.allow_hit(kind, req.len, auto);
                (
                    allowed,
                    allowed && remote_auto && c.probe_hit(kind, req.len, auto),
                )
            }
            _ => (true, false),
        };
        // A passed-through class's entry (cached before its costs changed, or a trial's
        // whose hits are spent): evicted if idle, and the call takes the miss path.
        let found = match found {
            Some((id, _)) if !allowed => {
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
        // One refused but busy is still asked whether it is a probe, as every found one was.
        let probe = probe
            || (!allowed
                && remote_auto
                && found.is_some()
                && self.classes().probe_hit(kind, req.len, auto));
        if found.is_some() && probe {
            // Re-measure what a miss of this class costs: libibverbs registers this one
            // (the preload times it: `Sample::Registration`).
            return Err(AcquireError::bypass(Bypass::Probe));
        }
        // An untimed hit of a class whose round needs figures, timed here; not one a caller
        // times whole (`Plan::Ask`'s `timed`: a shorter span, and counted twice).
        let own = !(self.outer_rounds && kind == Access::Remote);
        let t_start = t_start.or_else(|| {
            (found.is_some() && own && self.needs_round_sample(kind, req.len)).then(Instant::now)
        });
        let claim = found.map(|(id, _)| st.claim(&self.fast, id, req, self.limits.shadow));
        if let Some((id, Outcome::Hit)) = found
            && let Some(None) = claim
            && self.fast.slots.get(id).is_some_and(slots::Slot::saturated)
        {
            // Its key's entry holds all the references it can: as without the cache, with
            // no eviction and no registration made only to be handed out uncached. (A dead
            // entry still indexed, a rereg's reserved one, takes the miss path as before.)
            return Err(AcquireError::bypass(Bypass::Saturated));
        }
        if let Some((id, outcome)) = found
            && let Some(Some(claim)) = claim
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
                        self.figures(kind, req.len, |f| f.add_hit(ns));
                    }
                    return Ok(Some((h, outcome)));
                }
            }
            // Its claim was refused or its frames no longer match: a miss.
            return Ok(None);
        }
        Ok(None)
    }

    /// Before a miss registers: whether it is to be cached at all (the registrar's
    /// refusal, admission, scan resistance, the device-memory probe), and room made for it.
    /// Ok(whether it fits the limits); Err: pass it through.
    pub(super) fn make_room_for(
        &self,
        req: &Request,
        kind: Access,
        revocable: bool,
        auto: bool,
    ) -> Result<bool, AcquireError> {
        // Not to be cached whatever the figures say: no admission, and no entry evicted
        // for it.
        if let Some(b) = self.registrar.refuses(req) {
            return Err(AcquireError::bypass(b));
        }
        // Admission first: a call passed through is registered as without the cache, so
        // it needs no device-memory probe (three system calls, dear in a guest).
        let decision = self.classes().decide(kind, req.len, auto);
        match decision {
            Decision::PassThrough => {
                self.stats.add(Counter::AdmissionPassedCost, 1);
                // Local or remote, libibverbs registers it (as without the cache: its
                // fork bookkeeping, MADV_DONTFORK under RDMAV_FORK_SAFE, applies).
                return Err(AcquireError::bypass(Bypass::NotWorthCaching));
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
            return Err(AcquireError::bypass(Bypass::Scan));
        }
        if revocable && !fits {
            // It could not be cached: a revocable registration and its grant would only be
            // given back (an uncached handle needs the registration's own remote rights).
            return Err(self.bypass_remote());
        }
        // The device-memory probe only now, for a registration the cache is to make: a
        // call the scan rule or the limits pass through is as without the cache and must
        // not pay it (a cyclic set 4x the cache passes most calls through the scan rule).
        if let Some(b) = self.registrar.uncacheable(req) {
            return Err(AcquireError::bypass(b));
        }
        Ok(fits)
    }

    /// Register a miss without the lock (once more after giving idle entries back when out
    /// of pinnable memory), and for a revocable one grant its first handle.
    pub(super) fn register_entry(
        &self,
        req: &Request,
        kind: Access,
        revocable: bool,
    ) -> Result<(Mr, Option<usize>), AcquireError> {
        let t0 = Instant::now();
        let register = || {
            if revocable {
                self.registrar.register_revocable(req)
            } else {
                self.registrar.register(req)
            }
        };
        let mut result = register();
        if let Err(libc::ENOMEM | libc::EAGAIN) = result
            && self.give_back_idle() > 0
        {
            result = register(); // out of pinnable memory: once more, the idle ones given back
        }
        let reg_ns = t0.elapsed().as_nanos();
        self.stats.add(Counter::RegistrationNs, reg_ns as u64);
        if revocable && result == Err(UNSUPPORTED) {
            return Err(self.bypass_remote());
        }
        let mr = match result {
            Ok(mr) => mr,
            // Refused only now that the registrar tried (a device that would not register
            // on demand what its capabilities promised): passed through, as a refusal asked
            // before admission would have been.
            Err(e) => {
                return Err(self
                    .registrar
                    .refuses(req)
                    .map_or(AcquireError::Failed(e), AcquireError::bypass));
            }
        };
        self.fast.foreign.forget(mr.ptr);
        self.figures(kind, req.len, |f| f.reg.add(reg_ns as f64));
        let grant = if revocable {
            match self.registrar.grant(mr, req) {
                Ok(h) => Some(self.mine(h)),
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
        Ok((mr, grant))
    }

    /// Cache the registered miss if nothing raced it and it fits; else hand it out
    /// uncached (a revocable one goes back to libibverbs). `moment`: `quiet_moment` from
    /// before the registration.
    pub(super) fn insert_or_release(
        &self,
        req: &Request,
        kind: Access,
        mr: Mr,
        grant: Option<usize>,
        fits: bool,
        (started, quiet): (u64, bool),
    ) -> Result<(usize, Outcome), AcquireError> {
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
            self.fast.foreign.forget(mr.ptr);
            st.handles.insert(mr.ptr, Handle::uncached(mr, req));
            drop(st);
            self.deregister_all(&stale);
            self.stats.add(Counter::Uncached, 1);
            Ok((mr.ptr, Outcome::Uncached))
        }
    }
}
