//! What the cache's lock-free steady-pass bit is made of (`cache/steady.rs`): which
//! classes a guard handed out for a change, and whether a class passes through steadily.

use super::*;

impl Figures {
    /// A class passed through whose calls need no timing beyond the sampled one: held at
    /// pass-through, no trial hits left, its pass-through figure settled (4 samples, not
    /// moving). For such a class no hit is a round to time and a pass-through is timed on
    /// the sampling alone, both answered without the classes' lock (`Cache::plan`). Only these four fields decide it (`Classes::get_mut_counts`).
    pub(crate) fn steady_pass(&self) -> bool {
        self.held == Some(Verdict::PassThrough)
            && self.trial_hits == 0
            && self.pass_reg.samples >= 4
            && !self.pass_moving
    }
}

impl Classes {
    /// `get_mut` for a change that leaves `Figures::steady_pass` as it was (`pass_early`:
    /// its counts only), not marked touched.
    pub(super) fn get_mut_counts(&mut self, access: Access, len: usize) -> &mut Figures {
        &mut self.figures[slot(access, size_class(len))]
    }

    /// The classes `get_mut` handed out since the last call, a bit per class per access
    /// kind (`Access as usize`); forgets them.
    pub(crate) fn take_touched(&mut self) -> [u64; 2] {
        std::mem::take(&mut self.touched)
    }

    /// How many calls in a row of `access`'s class `class` `pass_early` would pass through
    /// now, each one's bookkeeping the same (`fold_lane`): 0 unless the class passes
    /// through steadily (`Figures::steady_pass`: no call of it is timed beyond the
    /// sampling) with no change of verdict pending; and never the call its trial is due at
    /// (`misses + 1` reaching the interval), which is `decide`'s. The cache's lock-free
    /// lane (`cache/lane.rs`) passes that many without the lock.
    pub(crate) fn lane_grant(&self, access: Access, class: u32) -> u32 {
        let f = self.of_class(access, class);
        // `steady_pass` checks the held verdict: read as it is, not through
        // `held_verdict`, whose check would fire in a drop while a panic unwinds from a
        // half-done update.
        if !f.steady_pass() || f.verdict != Some(Verdict::PassThrough) {
            return 0;
        }
        let every = if f.probe_every == 0 {
            PROBE_EVERY
        } else {
            f.probe_every
        };
        every.saturating_sub(f.misses + 1).min(u32::MAX as u64) as u32
    }

    /// `taken` calls of the class passed through by the lane (`lane_grant`): for each,
    /// `pass_early`'s bookkeeping (toward the next trial, and passed). Its counts only:
    /// `Figures::steady_pass` stays as it was.
    pub(crate) fn fold_lane(&mut self, access: Access, class: u32, taken: u32) {
        let f = &mut self.figures[slot(access, class)];
        if f.probe_every == 0 {
            f.probe_every = PROBE_EVERY;
        }
        f.misses += taken as u64;
        f.passed += taken as u64;
    }

    /// The figures of `access`'s size class `class`.
    pub(crate) fn of_class(&self, access: Access, class: u32) -> &Figures {
        &self.figures[slot(access, class)]
    }
}
