//! What the cache's lock-free steady-pass bit is made of (`cache/steady.rs`): which
//! classes a guard handed out for a change, and whether a class passes through steadily.

use super::*;

impl Figures {
    /// A class passed through whose calls need no timing beyond the sampled one: held at
    /// pass-through, no trial hits left, its pass-through figure settled (4 samples, not
    /// moving). For such a class `Cache::wants_hit_sample` is false and
    /// `Cache::wants_passthrough_sample` is the sampling alone, both answered without the
    /// classes' lock. Only these four fields decide it (`Classes::get_mut_counts`).
    pub fn steady_pass(&self) -> bool {
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

    /// The classes `get_mut` handed out since the last call, as (access, class); forgets
    /// them.
    pub fn take_touched(&mut self) -> impl Iterator<Item = (Access, u32)> + use<> {
        let mut touched = std::mem::take(&mut self.touched);
        let mut a = 0;
        std::iter::from_fn(move || {
            while a < 2 {
                let bits = touched[a];
                if bits != 0 {
                    touched[a] = bits & (bits - 1);
                    return Some((Access::ALL[a], bits.trailing_zeros()));
                }
                a += 1;
            }
            None
        })
    }

    /// The figures of `access`'s size class `class`.
    pub fn of_class(&self, access: Access, class: u32) -> &Figures {
        &self.figures[slot(access, class)]
    }
}
