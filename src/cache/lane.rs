//! The lock-free lane of a class that passes through steadily.
//!
//! A registration of a class admission passes through (`Classes::pass_early`) still took
//! the hook's guard and shield, the runtime's and the cache's lookups, the classes' lock and
//! the sampling questions before libibverbs registered it: about 1,300 instructions a
//! remote pair beside libibverbs' own, 8-10 us a pair in the TCG guest where libibverbs
//! alone takes about 62 us (remote cyclic 2x at 0.86x). The lane answers the same
//! question from an atomic credit per class (`ClassLock::take_lane`): granted under the
//! classes' lock as the count of calls `pass_early` would pass in a row, taken back and
//! counted into the figures by the next holder of the lock. It decides only that a call is
//! passed through to libibverbs, which is always safe (the app gets libibverbs' own MR);
//! the trial a class is due, a change of verdict, a cached entry of the call's own key and
//! every call of a class still being measured take the locked path as before.

use super::*;

/// The cache's one question before a registration, answered without a lock
/// (`Cache::plan`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Ask `acquire` (nothing was changed).
    Ask {
        /// A remote round admission needs a figure of, whatever the sampling: time the
        /// call whole from here and, if it hits, `report` it (`Sample::Round`).
        timed: bool,
    },
    /// Passed through, the lane's: libibverbs registers it.
    Pass {
        /// A class admission passes through steadily (`NotWorthCaching`), or a remote call
        /// under `MRCACHE_REMOTE=bypass` (`Remote`, counted as `acquire` would:
        /// `bypass_remote`).
        why: Bypass,
        /// One of the sampled calls: time libibverbs' registration and `report` it
        /// (`Sample::Registration`).
        timed: bool,
    },
}

/// A figure the caller measured for admission (`Cache::report`).
#[derive(Clone, Copy, Debug)]
pub enum Sample<'a> {
    /// A remote hit of this request, hook entry to return (the bind and its completion,
    /// the shadow copy, the hook's own checks): a cached round (`Plan::Ask { timed }`, or
    /// one the caller sampled).
    Round(&'a Request),
    /// libibverbs' whole `ibv_reg_mr` of a registration passed through for admission
    /// (`Plan::Pass` or `AcquireError::Bypass` with `timed`), which returned MR `mr`.
    Registration(&'a Request, usize),
    /// libibverbs' whole `ibv_dereg_mr` of a timed pass-through (`Passed::Timed`).
    Deregistration {
        /// The registration's length, as `Passed::Timed` gave it.
        len: usize,
        /// libibverbs' deregistration succeeded.
        ok: bool,
    },
}

impl<R: Registrar> Cache<R> {
    /// The plan for `req` (`req.context` is not read), its lock-free part of admission: the
    /// lane of a class that passes through steadily, or of a remote call under `bypass`;
    /// else ask `acquire`, timed if admission needs the round. No lock, no allocation, no
    /// registrar call, no panic: the preload's hook calls it before its shield.
    #[inline(always)]
    pub fn plan(&self, req: &Request) -> Plan {
        // As `acquire`, in its order: a stopped cache and a call it cannot cache are asked;
        // a remote call under `bypass` is libibverbs' whatever admission says (no remote
        // key is ever cached then, so no entry of its key can exist).
        if self.stopped.get().is_some() || access::classify(req.addr, req.len, req.access).is_err()
        {
            return Plan::Ask { timed: false };
        }
        if req.access & access::REMOTE != 0 && self.remote == RemoteMode::Bypass {
            return Plan::Pass {
                why: Bypass::Remote,
                timed: false,
            };
        }
        // As `acquire`: the key's own entry takes the locked path (evicted there if idle).
        if self.admit == Admit::Auto
            && self.fast.exact(req).is_none()
            && self.classes.take_lane(self.kind_of(req), req.len)
        {
            self.stats.add(Counter::AdmissionPassedCost, 1);
            // A steady class is timed on the sampling alone (`wants_passthrough_sample`).
            return Plan::Pass {
                why: Bypass::NotWorthCaching,
                timed: self.sampled(),
            };
        }
        Plan::Ask {
            timed: self.outer_rounds && self.wants_hit_sample(req),
        }
    }

    /// A figure the caller measured (`ns`) for admission.
    pub fn report(&self, sample: Sample, ns: u64) {
        match sample {
            Sample::Round(req) => self.note_remote_hit(req, ns),
            Sample::Registration(req, mr) => self.note_passthrough(req, mr, ns),
            Sample::Deregistration { len, ok } => self.note_passthrough_dereg(len, ns, ok),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{Mean, Verdict};
    use crate::cache::tests::fake::{Fake, LIMITS, req};

    /// `req(addr)`'s class (local 4 KiB) settled at pass-through.
    fn steady(cache: &Cache<&Fake>) {
        let mut c = cache.classes();
        let f = c.get_mut(Access::Local, 0x1000);
        let m = |v: f64| Mean {
            value: v,
            samples: 100,
        };
        (f.pass_reg, f.pass_dereg) = (m(1_000.0), m(1_000.0));
        (f.round, f.hit, f.release) = (m(50_000.0), m(50_000.0), m(50_000.0));
        f.held = Some(Verdict::PassThrough);
        f.verdict = Some(Verdict::PassThrough);
    }

    fn auto(fake: &Fake) -> Cache<&Fake> {
        Cache::new(fake, LIMITS)
            .with_admit(Admit::Auto)
            .with_sampling(u64::MAX)
    }

    /// The lane takes a steady class's calls and nothing else: not a class still
    /// measured, not a call whose key has an entry (the locked path evicts it if idle),
    /// not under `MRCACHE_ADMIT=always`, not once caching stopped, not a remote call
    /// under `bypass`. (Seen failing without the key's-entry check: "a cached key's
    /// call taken by the lane".)
    #[test]
    fn the_lane_takes_a_steady_class_and_nothing_else() {
        let fake = Fake::default();
        let cache = auto(&fake);
        assert_eq!(
            cache.plan(&req(0x10_0000)),
            Plan::Ask { timed: false },
            "not steady"
        );
        let (h, o) = cache.acquire(&req(0x20_0000)).unwrap();
        assert_eq!(o, Outcome::Miss);
        assert_eq!(cache.release(h), Released::Kept);
        steady(&cache);
        assert_eq!(
            cache.plan(&req(0x10_0000)),
            Plan::Pass {
                why: Bypass::NotWorthCaching,
                timed: false
            }
        );
        assert_eq!(
            cache.plan(&req(0x20_0000)),
            Plan::Ask { timed: false },
            "a cached key's call taken by the lane"
        );
        let mut remote = req(0x10_0000);
        remote.access |= access::REMOTE_WRITE;
        let bypass = auto(&fake).with_remote(RemoteMode::Bypass);
        steady(&bypass);
        assert_eq!(
            bypass.plan(&req(0x10_0000)),
            Plan::Pass {
                why: Bypass::NotWorthCaching,
                timed: false
            }
        );
        assert_eq!(
            bypass.plan(&remote),
            Plan::Pass {
                why: Bypass::Remote,
                timed: false
            },
            "bypass: a remote call"
        );
        let always = Cache::new(&fake, LIMITS).with_sampling(u64::MAX);
        steady(&always);
        assert_eq!(
            always.plan(&req(0x10_0000)),
            Plan::Ask { timed: false },
            "admit=always"
        );
        cache.stop_caching("test");
        assert_eq!(
            cache.plan(&req(0x10_0000)),
            Plan::Ask { timed: false },
            "caching stopped"
        );
    }

    /// Under `MRCACHE_REMOTE=bypass` every remote call is the lane's (libibverbs' own MR,
    /// counted as a remote bypass by the caller), steady class or not and whatever
    /// `MRCACHE_ADMIT` says; not once caching stopped (`acquire` registers uncached
    /// then), not a call the cache could not take anyway (`classify`), and no admission
    /// figure moves.
    #[test]
    fn the_lane_takes_every_remote_call_under_bypass() {
        let fake = Fake::default();
        let mut remote = req(0x10_0000);
        remote.access |= access::REMOTE_WRITE;
        for admit in [Admit::Auto, Admit::Always] {
            let cache = Cache::new(&fake, LIMITS)
                .with_admit(admit)
                .with_remote(RemoteMode::Bypass);
            assert_eq!(
                cache.plan(&remote),
                Plan::Pass {
                    why: Bypass::Remote,
                    timed: false
                },
                "{admit:?}"
            );
            assert_eq!(cache.stats.get(Counter::AdmissionPassedCost), 0);
            let mut empty = remote;
            empty.len = 0;
            assert_eq!(
                cache.plan(&empty),
                Plan::Ask { timed: false },
                "{admit:?}: length 0"
            );
            cache.stop_caching("test");
            assert_eq!(
                cache.plan(&remote),
                Plan::Ask { timed: false },
                "{admit:?}: stopped"
            );
        }
        let revoke = Cache::new(&fake, LIMITS).with_admit(Admit::Auto);
        assert_eq!(
            revoke.plan(&remote),
            Plan::Ask { timed: false },
            "revoke: not steady"
        );
    }

    /// A sampled call is passed and timed (`Sample::Registration`); the lane's calls are
    /// counted as the locked path counts its early passes.
    #[test]
    fn a_sampled_lane_call_is_timed_and_every_one_counted() {
        let fake = Fake::default();
        let cache = Cache::new(&fake, LIMITS)
            .with_admit(Admit::Auto)
            .with_sampling(1);
        steady(&cache);
        assert_eq!(
            cache.plan(&req(0x10_0000)),
            Plan::Pass {
                why: Bypass::NotWorthCaching,
                timed: true
            }
        );
        assert_eq!(
            cache.plan(&req(0x10_0000)),
            Plan::Pass {
                why: Bypass::NotWorthCaching,
                timed: true
            }
        );
        assert_eq!(cache.stats.get(Counter::AdmissionPassedCost), 2);
        assert_eq!(cache.classes().get(Access::Local, 0x1000).passed, 2);
    }
}
