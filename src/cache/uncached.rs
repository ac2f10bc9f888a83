//! What the cache does not keep: registrations passed through uncached (admission, a
//! stopped cache) and their releases, the rounds it times, the per-class figures admission
//! decides on, and the remote access checks (`bypass_remote`, `verified`).

use super::*;

impl<R: Registrar> Cache<R> {
    /// A registration the app owns, released by its `ibv_dereg_mr` (after `stop_caching`,
    /// and a miss passed through by admission).
    pub(super) fn register_uncached(
        &self,
        req: &Request,
        kind: Access,
    ) -> Result<(usize, Outcome), AcquireError> {
        let t0 = Instant::now();
        let result = self.registrar.register(req);
        let ns = t0.elapsed().as_nanos();
        self.stats.add(Counter::RegistrationNs, ns as u64);
        let mr = result.map_err(AcquireError::Failed)?;
        self.fast.foreign.forget(mr.ptr);
        if self.stopped.get().is_none() {
            self.figures(kind, req.len, |f| f.reg.add(ns as f64));
        }
        let mut st = self.lock();
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
    pub(super) fn time_round(&self, req: &Request, ptr: usize) -> Option<f64> {
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

    pub(super) fn kind_of(&self, req: &Request) -> Access {
        if req.access & access::REMOTE != 0 && self.remote == RemoteMode::Revoke {
            Access::Remote
        } else {
            Access::Local
        }
    }

    /// Whether a registration `acquire` passes through for `why` is an admission sample:
    /// a probe always, a pass-through for cost as `wants_passthrough_sample` says.
    pub(super) fn times_pass(&self, req: &Request, why: Bypass) -> bool {
        match why {
            Bypass::Probe => true,
            Bypass::NotWorthCaching | Bypass::Scan => self.wants_passthrough_sample(req),
            _ => false,
        }
    }

    /// Whether the caller should time this pass-through of `req` (`Sample::Registration`):
    /// while its class has fewer than 4 such samples or its last one was more than half
    /// off the figure (`Figures::pass_moving`: a change of cost is followed at every
    /// call) or a flip to pass-through awaits confirmation (`Figures::confirming`), else
    /// one call in about `admission::SAMPLE_EVERY` (each timing costs two clock reads,
    /// and one more at its deregistration for a remote class).
    fn wants_passthrough_sample(&self, req: &Request) -> bool {
        let kind = self.kind_of(req);
        // A class passing through steadily: the sampling alone, without the lock.
        if self.classes.steady(kind, req.len) {
            return self.sampled();
        }
        let needs = {
            let c = self.classes();
            let f = c.get(kind, req.len);
            f.pass_reg.samples < 4 || f.pass_moving || f.confirming(kind)
        };
        needs || self.sampled()
    }

    /// The preload passed `req` through to libibverbs for admission (`NotWorthCaching`,
    /// `Scan`, `Probe`), libibverbs' whole `ibv_reg_mr` took `ns` and returned `mr`: a
    /// sample of what the class's miss costs the app (`Figures::pass_reg`). `mr`'s
    /// `ibv_dereg_mr` is the other half (`Sample::Deregistration`).
    pub(super) fn note_passthrough(&self, req: &Request, mr: usize, ns: u64) {
        let kind = self.kind_of(req);
        let mut cold = false;
        self.figures(kind, req.len, |f| {
            // A probe burst's first call: not a sample, nor is its deregistration.
            if kind == Access::Remote && std::mem::take(&mut f.probe_cold) {
                cold = true;
                return;
            }
            let before = f.pass_reg.value;
            f.pass_reg.add(ns as f64);
            // The sample against the figure, not the figure's own 1/8 step: a doubled
            // cost is followed at every call until the figure is within half of it.
            let x = ns as f64;
            f.pass_moving = before > 0.0 && (x > 1.5 * before || 1.5 * x < before);
        });
        if kind == Access::Remote && mr != 0 && !cold {
            // Its deregistration is timed too: marked so in the registry (recorded untimed
            // by `note_foreign` a moment ago; the app does not have `mr` yet).
            self.fast.foreign.note(mr, Some(req.len));
        }
    }

    /// libibverbs' whole `ibv_dereg_mr` of a registration of `len` bytes admission passed
    /// through (`Passed::Timed`) took `ns` (`ok`: it succeeded): a sample of the class's
    /// miss (`Figures::pass_dereg`).
    pub(super) fn note_passthrough_dereg(&self, len: usize, ns: u64, ok: bool) {
        if ok {
            self.figures(Access::Remote, len, |f| f.pass_dereg.add(ns as f64));
        }
    }

    /// The caller (the preload) times remote rounds whole, from its hook's entry to its
    /// return, and reports them (`Sample::Round`, `release_at`).
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
    /// it has fewer than 4 hit or release figures (remote: `SETTLED_ROUNDS`, the figures a
    /// flip to pass-through waits for), while a flip awaits its confirmation
    /// (`Figures::confirming`), and while the class is passed through (its hits are a
    /// trial's, the figures that can bring it back).
    pub(super) fn needs_round_sample(&self, kind: Access, len: usize) -> bool {
        if self.sample_every <= 1 {
            return false; // every call is timed already
        }
        steady::needs_round(self.classes().get(kind, len), kind)
    }

    /// For a caller that times remote rounds whole (`with_rounds_timed_by_caller`), at its
    /// entry: whether a hit of `req` would be a round the class needs figures of whatever the
    /// sampling (`needs_round_sample`), so that the caller times it from its entry, as it
    /// times its sampled ones. A class passed through hits only on a trial's hits; its
    /// other calls pass through, which must not pay a clock read for nothing (in the TCG
    /// guest a read is a system call). Timed from the cache's lookup, a shorter span than
    /// the hook's, confirmation samples 10% short would keep a class that costs 1.3x a miss
    /// from ever passing through (simulated). Without the lock (`ClassLock::round_wanted`).
    #[inline]
    pub(super) fn wants_hit_sample(&self, req: &Request) -> bool {
        let kind = self.kind_of(req);
        kind == Access::Remote && self.sample_every > 1 && self.classes.round_wanted(kind, req.len)
    }

    /// Whether this call is to be timed for the admission figures (`with_sampling`).
    pub(crate) fn sampled(&self) -> bool {
        admission::sampled(self.sample_every)
    }

    /// A remote hit of `req` cost the app `ns`, hook entry to return (the bind and its
    /// completion, the shadow copy, the hook's own checks): a sample of the cached round.
    pub(super) fn note_remote_hit(&self, req: &Request, ns: u64) {
        if self.kind_of(req) == Access::Remote {
            self.figures(Access::Remote, req.len, |f| f.add_hit(ns as f64));
        }
    }

    pub(super) fn classes(&self) -> steady::ClassesGuard<'_> {
        self.classes.lock()
    }

    /// Update one class's admission figures (never with the state lock held). When that
    /// turns the class to pass-through, its idle entries go (local hits take the lock-free
    /// path, which does not look at the verdict).
    pub(super) fn figures(&self, kind: Access, len: usize, f: impl FnOnce(&mut Figures)) {
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

    /// `MRCACHE_ADMIT` as this cache applies it.
    pub fn admit(&self) -> Admit {
        self.admit
    }

    /// The admission figures and decisions of every measured class.
    pub fn admission(&self) -> Classes {
        self.classes().clone()
    }

    pub(super) fn bypass_remote(&self) -> AcquireError {
        AcquireError::bypass(Bypass::Remote)
    }

    /// A moment with no invalidation in flight, from which on those begun can be checked
    /// one by one. Unmap hooks are a system call long: wait for a few of them rather than
    /// give up caching this registration because another thread happened to be unmapping.
    pub(super) fn quiet_moment(&self) -> (u64, bool) {
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
    pub(super) fn verified(&self, id: u32, handle: usize) -> bool {
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
}
