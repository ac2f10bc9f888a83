//! The running mean of one admission figure.

use super::known;

/// A decaying mean (a new sample weighs 1/8: about the last 8 to 16 count, so a change
/// of cost is followed and the heavy tail of a loaded machine's timings counts for what it
/// costs); a sample counts at most 8 times the mean (a rare stall), and the first sample is
/// dropped when the second is under half of it (a first call's set-up: a device queue,
/// page faults). 0 until the first sample.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Mean {
    /// The mean, in nanoseconds (0 until the first sample).
    pub value: f64,
    /// How many samples were added.
    pub samples: u64,
}

impl Mean {
    /// Add one sample of `ns` nanoseconds.
    pub fn add(&mut self, ns: f64) {
        // A sample floors at 1 ns (a coarse clock reads 0): the 8x cap of a stall is
        // relative, so a mean at 0 would never rise again.
        let ns = if ns.is_nan() { 1.0 } else { ns.max(1.0) };
        self.value = if self.samples == 0
            || !known(self.value)
            || (self.samples == 1 && ns < self.value / 2.0)
        {
            ns
        } else {
            self.value + (ns.min(8.0 * self.value) - self.value) / 8.0
        };
        self.samples += 1;
    }
}
