//! A class's verdict from its figures: when they are complete, the band, and the
//! confirmation a cached remote class needs before it passes through.

use super::*;

impl Figures {
    /// Whether the figures are complete enough to stop caching the class on: a miss
    /// measured whole (registration and deregistration) and at least `MIN_ROUNDS` cached
    /// rounds (remote: `MIN_MISSES` misses and `SETTLED_ROUNDS` rounds). A class's first rounds carry its set-up (the first window bind, page
    /// faults, a stall of a loaded machine); one such sample must not pass a class through
    /// that pays many times over (CI saw a 5x class flip on its first hit and release).
    pub(crate) fn complete(&self, access: Access) -> bool {
        let rounds = if access == Access::Local && self.round.samples > 0 {
            self.round.samples
        } else {
            self.hit.samples.min(self.release.samples)
        };
        if access == Access::Remote {
            return self.miss_reg().samples >= MIN_MISSES
                && self.miss_dereg().samples >= MIN_MISSES
                && rounds >= SETTLED_ROUNDS;
        }
        self.miss_reg().samples > 0 && self.miss_dereg().samples > 0 && rounds >= MIN_ROUNDS
    }

    /// The banded verdict from the held one; a cached class stays cached until its
    /// figures are `complete`.
    fn verdict_from_held(&self, access: Access) -> Verdict {
        let held = self.held.unwrap_or(Verdict::Cache);
        if held == Verdict::Cache && !self.complete(access) {
            return Verdict::Cache;
        }
        verdict_banded(&self.costs(access), held)
    }

    /// The class's verdict now, with the band: updated from the held one.
    pub(crate) fn verdict_now(&mut self, access: Access) -> Verdict {
        let v = self.verdict_from_held(access);
        let unconfirmed = self.unconfirmed(access, v);
        if v == Verdict::PassThrough && self.held != Some(Verdict::PassThrough) {
            self.pass_since.get_or_insert(self.samples());
        } else {
            self.pass_since = None;
        }
        let v = if unconfirmed { Verdict::Cache } else { v };
        if self.held.is_some_and(|h| h != v) {
            // A probe burst left over from the cached verdict would take a trial's hits.
            self.probe_burst = 0;
            self.probe_cold = false;
        }
        self.held = Some(v);
        v
    }

    /// The verdict as of the last update of the figures, without recomputing it (100-odd
    /// instructions, on every remote hit and every early pass-through): every update runs
    /// `verdict_now` (`Cache::figures`, `Cache::deregister_all`), which gives the same
    /// answer again until the next update (its band holds the verdict it made, and the
    /// confirmation counts samples).
    pub(crate) fn held_verdict(&self, access: Access) -> Verdict {
        let v = self.held.unwrap_or(Verdict::Cache);
        debug_assert_eq!(
            v,
            self.verdict_shown(access),
            "held verdict stale: {self:?}"
        );
        v
    }

    /// The verdict the reports show (the held one, or what the next update would hold).
    pub(crate) fn verdict_shown(&self, access: Access) -> Verdict {
        let v = self.verdict_from_held(access);
        if self.unconfirmed(access, v) {
            Verdict::Cache
        } else {
            v
        }
    }

    /// A cached remote class's turn to pass-through `v` that its figures have not yet
    /// held for `FLIP_SAMPLES` samples.
    fn unconfirmed(&self, access: Access, v: Verdict) -> bool {
        access == Access::Remote
            && v == Verdict::PassThrough
            && self.held != Some(Verdict::PassThrough)
            && self
                .pass_since
                .is_none_or(|since| self.samples() < since + FLIP_SAMPLES)
    }

    /// A cached remote class whose figures say pass-through, awaiting its `FLIP_SAMPLES`
    /// of confirmation: every round and pass-through of it is then timed, not one in
    /// `SAMPLE_EVERY`, so the confirmation takes 8 calls and not about 128 cached rounds
    /// (3x a miss each in the aarch64 guest: 5% of a 1 s process).
    pub(crate) fn confirming(&self, access: Access) -> bool {
        access == Access::Remote
            && self.held != Some(Verdict::PassThrough)
            && self.pass_since.is_some()
    }

    /// Samples of the figures the verdict is made of, in whole rounds and misses.
    fn samples(&self) -> u64 {
        self.hit.samples.min(self.release.samples)
            + self.miss_reg().samples.min(self.miss_dereg().samples)
    }
}

impl Classes {
    /// A miss of a passed-through class, before the cache looks anything up: true when
    /// `decide` would pass it through, with `decide`'s bookkeeping done (the call counted
    /// toward the next trial and as passed). False, with nothing changed, whenever the
    /// call needs the full path: caching on (`always`), a class that caches or is turning
    /// back to caching, a trial due, or trial hits left (a found entry may serve them).
    /// Without it every such call paid the state lock, the scan sketch and the range
    /// lookups, about 1,350 of the 2,700 instructions a default pass-through cost
    /// (callgrind, remote 64 KiB cycled over 64 buffers): in the TCG guest about 20 us a
    /// call, which held remote cyclic 2x at 0.8x of libibverbs alone.
    pub(crate) fn pass_early(&mut self, access: Access, len: usize, auto: bool) -> bool {
        if !auto {
            return false;
        }
        // Its counts only: `steady_pass` stays as it was.
        let f = self.get_mut_counts(access, len);
        if f.trial_hits > 0 || f.held != Some(Verdict::PassThrough) {
            return false;
        }
        let v = f.held_verdict(access);
        if v != Verdict::PassThrough || f.verdict != Some(v) {
            return false; // a change of verdict: `decide` resets the intervals
        }
        let every = if f.probe_every == 0 {
            PROBE_EVERY
        } else {
            f.probe_every
        };
        if f.misses + 1 >= every {
            return false; // a trial is due: `decide` makes it
        }
        // `decide`'s pass-through branch.
        f.probe_every = every;
        f.misses += 1;
        f.passed += 1;
        true
    }
}
