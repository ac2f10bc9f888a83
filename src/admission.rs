//! Cost-aware admission: whether caching a registration pays, from measured figures.
//!
//! The pure model, per size class (the power of two at or above the registration length)
//! and access kind (local-only, or remote under `MRCACHE_REMOTE=revoke`):
//!
//! - `miss_ns`: what a registration costs without the cache, the provider's reg + dereg.
//! - `cached_ns`: what a cached round costs, a hit and its release; for `Remote` also the
//!   window bind at the hit and its unbind at the release (the remote key's guarantee).
//! - `evict_ns`: the bookkeeping of one eviction beyond the deregistration it performs
//!   (which `miss_ns` already counts).
//!
//! [`verdict`] caches a class only where a cached round is cheaper than a miss.
//! `verdict_at` says the same at an observed hit ratio `h`: a cache that misses `1 - h`
//! of the time pays `h * cached + (1 - h) * (miss + evict)` per call against `miss`
//! without it; [`verdict`] is `verdict_at(.., 1.0)`.
//!
//! [`Figures`] keeps the running figures of one class (decaying means) and [`Classes`] all
//! of them, with the decision and its re-probe: a class passed through still gets cached
//! trials ([`PROBE_EVERY`]), so a change of cost brings it back. Both are plain data, under
//! a lock of their own (never on the lock-free hit path).
//!
//! Neither branch weakens the remote-key guarantee: a cached remote registration is always
//! revocable (revoke), a passed-through one is libibverbs' own; nothing is ever kept.

use std::fmt;

/// What a registration's rights make of it for the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// No remote rights: a hit is the lock-free claim, a release its undo.
    Local,
    /// Remote rights under `MRCACHE_REMOTE=revoke`: a hit binds a window, a release
    /// unbinds it.
    Remote,
}

impl Access {
    /// Both kinds, in the order of the figures' table.
    pub const ALL: [Access; 2] = [Access::Local, Access::Remote];

    /// "local" or "remote", as reports write it.
    pub fn name(self) -> &'static str {
        match self {
            Access::Local => "local",
            Access::Remote => "remote",
        }
    }
}

/// The number of size classes: 2^0 .. 2^63 bytes.
pub(crate) const CLASSES: usize = 64;

/// The size class of a registration of `len` bytes: the exponent of the smallest power of
/// two at or above `len` (0 for 0 and 1; 12 for 4 KiB; 13 for 4 KiB + 1).
pub(crate) fn size_class(len: usize) -> u32 {
    if len <= 1 {
        0
    } else {
        usize::BITS - (len - 1).leading_zeros()
    }
}

/// A class's name for reports: "4KiB", "64KiB", "1MiB", ...
pub(crate) fn class_name(class: u32) -> String {
    let (n, unit) = match class {
        0..=9 => (1u64 << class, "B"),
        10..=19 => (1u64 << (class - 10), "KiB"),
        20..=29 => (1u64 << (class - 20), "MiB"),
        30..=39 => (1u64 << (class - 30), "GiB"),
        _ => (1u64 << (class.min(63) - 40), "TiB"),
    };
    format!("{n}{unit}")
}

/// Measured costs of one size class and access kind, per operation, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Costs {
    /// Provider reg + dereg: what the registration costs without the cache.
    pub miss_ns: f64,
    /// A hit and its release (for `Remote`, including the window bind and unbind).
    pub cached_ns: f64,
    /// One eviction's bookkeeping beyond the deregistration `miss_ns` counts.
    pub evict_ns: f64,
}

/// What the cache does with a class's misses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Register and keep: later calls hit.
    Cache,
    /// Register through the provider uncached (local) or through libibverbs (remote),
    /// as without the cache.
    PassThrough,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Verdict::Cache => "cache",
            Verdict::PassThrough => "pass-through",
        })
    }
}

fn known(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

/// One call in this many (on average) reads the clock for the admission figures of a
/// round, a pass-through or a release (`sampled`). A clock read is not free everywhere:
/// in the TCG guest the clock source is the emulated HPET and `clock_gettime` is a system
/// call plus an emulated device read, 1.4-4.5 us, against a 70 us registration; every
/// call timed made a pass-through pay two to four of them. The figures are decaying means
/// (`Mean`): a sample in 16 follows a change of cost as surely, 16 times more slowly.
pub const SAMPLE_EVERY: u64 = 16;

/// Whether this call is one of the sampled ones (about one in `every`; every call for
/// `every` 0 or 1): a counter shared by every thread, mixed (splitmix64) so a program that
/// alternates between a few classes does not land every sample on one of them.
pub fn sampled(every: u64) -> bool {
    if every <= 1 {
        return true;
    }
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut z = CALLS
        .fetch_add(1, Relaxed)
        .wrapping_add(1)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    let z = z ^ (z >> 31);
    // A mask for a power of two (`SAMPLE_EVERY`): a division on every call otherwise,
    // a helper call under TCG.
    if every.is_power_of_two() {
        z & (every - 1) == 0
    } else {
        z % every == 0
    }
}

/// Cache `access`'s class with these `costs` where a cached round is cheaper than a miss.
/// A figure not measured yet (zero, negative or not finite) caches: the first misses
/// measure it, as the cache without admission would.
pub fn verdict(access: Access, costs: &Costs) -> Verdict {
    verdict_at(access, costs, 1.0)
}

/// `verdict` at hit ratio `hit_ratio` (clamped to 0..=1): caching costs
/// `h * cached_ns + (1 - h) * (miss_ns + evict_ns)` per call, passing through `miss_ns`.
pub(crate) fn verdict_at(_access: Access, costs: &Costs, hit_ratio: f64) -> Verdict {
    if !known(costs.miss_ns) || !known(costs.cached_ns) {
        return Verdict::Cache;
    }
    let h = if hit_ratio.is_nan() {
        1.0
    } else {
        hit_ratio.clamp(0.0, 1.0)
    };
    let evict = if known(costs.evict_ns) {
        costs.evict_ns
    } else {
        0.0
    };
    let cached = h * costs.cached_ns + (1.0 - h) * (costs.miss_ns + evict);
    if cached < costs.miss_ns {
        Verdict::Cache
    } else {
        Verdict::PassThrough
    }
}

/// The band around the tie: a cached class passes through only when a cached round costs
/// more than `BAND_OUT` misses, a passed-through one comes back only under `BAND_IN`
/// (figures near a tie would otherwise flip the verdict with every sample).
pub const BAND_OUT: f64 = 1.25;
pub(crate) const BAND_IN: f64 = 0.8;
/// Updates in a row within the band before a passed-through class's dearer miss resets its
/// trial interval (`Figures::settle`): one stall lifts the miss figure for a few only.
pub(crate) const BAND_UPDATES: u32 = 16;

/// `verdict` with the band: the verdict that follows `held` at these costs.
pub fn verdict_banded(costs: &Costs, held: Verdict) -> Verdict {
    if !known(costs.miss_ns) || !known(costs.cached_ns) {
        return Verdict::Cache;
    }
    let (c, m) = (costs.cached_ns, costs.miss_ns);
    match held {
        Verdict::Cache if c > BAND_OUT * m => Verdict::PassThrough,
        Verdict::PassThrough if c < BAND_IN * m => Verdict::Cache,
        v => v,
    }
}

/// The hit ratio above which caching pays (`None`: never, a cached round costs at least a
/// miss; `Some(0.0)`: a figure is missing).
#[cfg(test)]
pub(crate) fn break_even(costs: &Costs) -> Option<f64> {
    if !known(costs.miss_ns) || !known(costs.cached_ns) {
        return Some(0.0);
    }
    let gain = costs.miss_ns - costs.cached_ns;
    if gain <= 0.0 {
        return None;
    }
    let evict = if known(costs.evict_ns) {
        costs.evict_ns
    } else {
        0.0
    };
    Some(evict / (gain + evict))
}

/// A passed-through class gets one cached trial after this many of its misses; the
/// interval doubles after each trial, up to `PROBE_MAX`, and comes back to this when its
/// round comes down by more than a quarter or a dearer miss brings the round within the
/// band (`Figures::settle`).
/// Public for the integration tests only.
pub const PROBE_EVERY: u64 = 32;
pub(crate) const PROBE_MAX: u64 = 1024;
/// The longest interval between a cached remote class's probes, in hits.
pub(crate) const PROBE_HITS_MAX: u64 = 8192;
/// A cached remote class's probe passes this many of its calls through in a row; the first
/// is not a sample (`Figures::probe_cold`). After a long run of hits it is the cold one
/// (the provider's and the kernel's paths out of the caches, and under TCG out of the
/// translated code: 2-4x a plain back-to-back miss in the aarch64 guest), while the app
/// without the cache makes its calls back to back; the others are what a miss costs.
/// Public for the integration tests only.
pub const PROBE_BURST: u32 = 4;
/// A cached class passes through only on at least this many cached rounds (`Figures::complete`).
pub(crate) const MIN_ROUNDS: u64 = 3;
/// A cached remote class passes through only on at least this many cached rounds, and
/// `MIN_MISSES` misses measured whole: its first rounds are slow (the first binds, cold
/// paths) and the mean forgets them only over a dozen samples; with `MIN_ROUNDS` a probe
/// burst's first warm miss against those rounds flipped remote 256 KiB, which pays 1.5x
/// in the x86 guest (`reg_loop_default`: 32 of 10000 registrations on the first MR).
pub const SETTLED_ROUNDS: u64 = 16;
pub(crate) const MIN_MISSES: u64 = 3;
/// A cached remote class passes through only once its figures have said so for this many
/// more samples (whole rounds and misses): a single stall sample (counted up to 8x the
/// mean) can lift a cached round by 87%, past the band of a class that pays 1.3x (remote
/// 256 KiB in the x86 guest: `reg_loop_default` flipped after 3111 and 6073 of 10000 hits).
pub const FLIP_SAMPLES: u64 = 8;
/// A trial's entry serves this many hits (each timed) before the class passes through again.
pub(crate) const TRIAL_HITS: u32 = 4;

/// The running figures of one class.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Figures {
    /// Provider registrations (misses, uncached, trials).
    pub reg: Mean,
    /// Provider deregistrations.
    pub dereg: Mean,
    /// libibverbs' whole `ibv_reg_mr` of a call admission passed through (remote): what
    /// a miss costs the app without the cache. Used for `miss_ns` once measured (the
    /// cache's own registration differs: MW_BIND rights, its probes, its bookkeeping).
    pub pass_reg: Mean,
    /// ... and libibverbs' whole `ibv_dereg_mr` of it.
    pub pass_dereg: Mean,
    /// Cached rounds measured whole: a locked hit (with its bind for remote) ...
    pub hit: Mean,
    /// ... and a release (with its unbind for remote).
    pub release: Mean,
    /// A local cached round as the lock-free path does it (the table probe, the claim and
    /// the release of a reference), timed by the cache itself on a new entry of the class
    /// (the app's lock-free hits are not timed: that would cost every hit).
    pub round: Mean,
    /// Eviction bookkeeping per evicted entry (the clock, the removal).
    pub evict: Mean,
    /// Calls of this class since its last trial (pass-through class) or probe (remote
    /// cached class).
    pub(crate) misses: u64,
    /// Remote cached class: hits passed through to re-measure what a miss costs now.
    pub probes: u64,
    /// Calls left to pass through in the current probe burst (`PROBE_BURST`).
    pub(crate) probe_burst: u32,
    /// The class's next pass-through sample is a burst's first: not counted in `pass_reg`,
    /// nor its deregistration in `pass_dereg`.
    pub(crate) probe_cold: bool,
    /// Hits between those probes now (0: `PROBE_EVERY`); doubles up to `PROBE_HITS_MAX`
    /// and comes back only when the verdict changes (a probe costs a whole miss, and noisy
    /// figures would otherwise keep it at 32).
    pub(crate) probe_hits_every: u64,
    /// Misses passed through because caching did not pay.
    pub passed: u64,
    /// Cached trials of a passed-through class.
    pub trials: u64,
    /// The verdict of the last miss.
    pub verdict: Option<Verdict>,
    /// Misses between trials now (0: `PROBE_EVERY`).
    pub(crate) probe_every: u64,
    /// The last pass-through sample was more than half off `pass_reg` (either way): the
    /// cost is changing, every pass-through is timed until a sample no longer moves it
    /// (`Cache::plan`, `acquire`: steady, one in `SAMPLE_EVERY`).
    pub(crate) pass_moving: bool,
    /// The banded verdict (`verdict_banded`) as of the last update (`None`: cache).
    pub(crate) held: Option<Verdict>,
    /// A cached remote class: the count of samples (`samples`) when its figures first said
    /// pass-through, in a run of updates that all said so (`FLIP_SAMPLES`).
    pub pass_since: Option<u64>,
    /// Hits left in the current trial: a passed-through class's cached entries serve this
    /// many hits after a trial (timing its cached round), then are evicted at the next.
    pub(crate) trial_hits: u32,
    /// A trial's first hit and first release are not samples (`COLD_HIT`, `COLD_RELEASE`
    /// while still to come): after a run of pass-throughs they are the cold ones, as a
    /// probe burst's first pass-through is after a run of hits (`probe_cold`).
    pub(crate) trial_cold: u8,
    /// A passed-through class's cached round at its last trial: a trial that brings it
    /// down by a quarter resets the trial interval (`settle`).
    pub(crate) trial_round: Option<f64>,
    /// A passed-through class: updates in a row with its round within the band of its miss,
    /// and whether that may reset the trial interval (armed at the flip to pass-through and
    /// at a trial made outside the band, spent when it fires: `settle`).
    pub(crate) band_run: u32,
    pub(crate) band_armed: bool,
}

/// In `Figures::trial_cold`.
pub(crate) const COLD_HIT: u8 = 1;
pub(crate) const COLD_RELEASE: u8 = 2;

impl Figures {
    /// A sample of a cached hit (a trial's first is skipped: `trial_cold`).
    pub(crate) fn add_hit(&mut self, ns: f64) {
        if !self.take_cold(COLD_HIT) {
            self.hit.add(ns);
        }
    }

    /// A sample of a cached release (a trial's first is skipped: `trial_cold`).
    pub(crate) fn add_release(&mut self, ns: f64) {
        if !self.take_cold(COLD_RELEASE) {
            self.release.add(ns);
        }
    }

    /// Whether `bit` of `trial_cold` was still set (it is cleared).
    fn take_cold(&mut self, bit: u8) -> bool {
        let cold = self.trial_cold & bit != 0;
        self.trial_cold &= !bit;
        cold
    }

    /// After new samples (`before`: the costs until then): a move of more than a quarter in
    /// the miss or the cached round brings trials back to every `PROBE_EVERY` misses. A
    /// passed-through class counts only its round coming down by a quarter (which only a
    /// trial shows) and a dearer miss that keeps the round within the band of it for
    /// `BAND_UPDATES` updates, once a flip or trial: a stall in one pass-through's timing
    /// lifts the miss figure for a few updates (`noisy`: on the aarch64 guest any move
    /// brought trials back 64-91 times in 8,000 calls).
    pub(crate) fn settle(&mut self, access: Access, before: &Costs) {
        let now = self.costs(access);
        let moved = |a: f64, b: f64| known(a) && known(b) && ((a - b).abs() > 0.25 * a.min(b));
        let measured = |c: &Costs| known(c.miss_ns) && known(c.cached_ns);
        let reset = if self.held == Some(Verdict::PassThrough) && measured(before) && measured(&now)
        {
            // Against the update before and the last trial's round: one round sample
            // moves its mean by 1/8 at most, a trial's 3 by a third. And a dearer miss
            // that brings the round within the band of it: a trial may then bring the
            // class back (its round may have come down too, which only a trial shows).
            let mark = self.trial_round.unwrap_or(0.0).max(before.cached_ns);
            let in_band = now.cached_ns < BAND_OUT * now.miss_ns;
            self.band_run = if in_band {
                self.band_run.saturating_add(1)
            } else {
                0
            };
            let band = self.band_armed && self.band_run >= BAND_UPDATES;
            if band {
                self.band_armed = false;
            }
            now.cached_ns * 1.25 < mark || band
        } else {
            moved(before.miss_ns, now.miss_ns) || moved(before.cached_ns, now.cached_ns)
        };
        if reset {
            self.probe_every = PROBE_EVERY;
            self.trial_round = None;
        }
    }

    /// The registration figure of a miss. Like with like: libibverbs' own call as the app
    /// pays it, once measured (`pass_reg`), else the cache's registrations.
    pub(crate) fn miss_reg(&self) -> Mean {
        if self.pass_reg.samples > 0 {
            self.pass_reg
        } else {
            self.reg
        }
    }

    /// The deregistration figure of a miss (`pass_dereg` once measured, else `dereg`).
    pub(crate) fn miss_dereg(&self) -> Mean {
        if self.pass_dereg.samples > 0 {
            self.pass_dereg
        } else {
            self.dereg
        }
    }

    /// The model's costs from these figures.
    pub fn costs(&self, access: Access) -> Costs {
        let miss_ns = self.miss_reg().value + self.miss_dereg().value;
        let cached_ns = if access == Access::Local && self.round.samples > 0 {
            self.round.value
        } else if self.hit.samples > 0 && self.release.samples > 0 {
            self.hit.value + self.release.value
        } else {
            0.0
        };
        Costs {
            miss_ns,
            cached_ns,
            evict_ns: self.evict.value,
        }
    }
}

/// How a miss is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Register and cache (the class pays).
    Cache,
    /// A passed-through class's cached trial (its figures are refreshed).
    Trial,
    /// Pass through (caching does not pay at the class's figures).
    PassThrough,
}

/// The figures of every class and access kind, and the decision for each miss.
#[derive(Debug, Clone)]
pub struct Classes {
    figures: Vec<Figures>,
    /// Slots handed out by `get_mut` since the last `take_touched` (a bit per slot): the
    /// classes whose `Figures::steady_pass` may have changed.
    touched: [u64; 2],
}

impl Default for Classes {
    fn default() -> Self {
        Classes {
            figures: vec![Figures::default(); 2 * CLASSES],
            touched: [0; 2],
        }
    }
}

fn slot(access: Access, class: u32) -> usize {
    (access as usize) * CLASSES + (class as usize).min(CLASSES - 1)
}

impl Classes {
    /// The figures of the size class of `len` bytes for `access`.
    pub fn get(&self, access: Access, len: usize) -> &Figures {
        &self.figures[slot(access, size_class(len))]
    }

    /// As `get`, to update them (the class is then among those `take_touched` returns).
    pub fn get_mut(&mut self, access: Access, len: usize) -> &mut Figures {
        let i = slot(access, size_class(len));
        self.touched[i / CLASSES] |= 1 << (i % CLASSES);
        &mut self.figures[i]
    }

    /// A miss of `len` bytes: cache it, try it, or pass it through (`auto`); with `auto`
    /// false (`MRCACHE_ADMIT=always`) every miss caches, and the figures are still kept.
    pub fn decide(&mut self, access: Access, len: usize, auto: bool) -> Decision {
        let f = self.get_mut(access, len);
        let v = f.verdict_now(access);
        if f.verdict != Some(v) {
            f.probe_every = PROBE_EVERY;
            f.probe_hits_every = PROBE_EVERY;
            f.misses = 0;
            f.band_armed = v == Verdict::PassThrough;
        }
        f.verdict = Some(v);
        if !auto || v == Verdict::Cache {
            return Decision::Cache;
        }
        f.misses += 1;
        if f.probe_every == 0 {
            f.probe_every = PROBE_EVERY;
        }
        if f.misses >= f.probe_every {
            f.misses = 0;
            f.probe_every = (2 * f.probe_every).min(PROBE_MAX);
            f.trials += 1;
            f.trial_hits = TRIAL_HITS;
            f.trial_cold = COLD_HIT | COLD_RELEASE;
            let c = f.costs(access);
            f.trial_round = Some(c.cached_ns).filter(|r| r.is_finite());
            f.band_armed |= c.cached_ns >= BAND_OUT * c.miss_ns;
            Decision::Trial
        } else {
            f.passed += 1;
            Decision::PassThrough
        }
    }

    /// A cached entry of `len` bytes was found: whether it may serve the hit. Not in a
    /// passed-through class (the caller evicts it if idle and takes the miss path), except
    /// the `TRIAL_HITS` hits after a trial.
    pub(crate) fn allow_hit(&mut self, access: Access, len: usize, auto: bool) -> bool {
        let f = self.get_mut(access, len);
        if !auto || f.held_verdict(access) == Verdict::Cache {
            return true;
        }
        if f.trial_hits > 0 {
            f.trial_hits -= 1;
            return true;
        }
        false
    }

    /// A hit of a remote class that caches: whether to pass it through instead (a probe,
    /// a burst of `PROBE_BURST` calls after `PROBE_EVERY` hits, the interval doubling to
    /// `PROBE_HITS_MAX`), so
    /// that what a miss costs is re-measured (the caller times the registration libibverbs
    /// makes, `Sample::Registration`): a cached class never misses otherwise, and its
    /// miss figure would stay whatever its first miss cost (set-up included).
    pub(crate) fn probe_hit(&mut self, access: Access, len: usize, auto: bool) -> bool {
        let f = self.get_mut(access, len);
        if !auto || access != Access::Remote {
            return false;
        }
        if f.probe_burst > 0 {
            f.probe_burst -= 1;
            f.probes += 1;
            return true;
        }
        if f.probe_hits_every == 0 {
            f.probe_hits_every = PROBE_EVERY;
        }
        f.misses += 1;
        if f.misses < f.probe_hits_every {
            return false;
        }
        f.misses = 0;
        f.probe_hits_every = (2 * f.probe_hits_every).min(PROBE_HITS_MAX);
        f.probe_burst = PROBE_BURST - 1;
        f.probe_cold = true;
        f.probes += 1;
        true
    }
}

mod mean;
mod report;
mod sketch;
mod steady;
mod verdict;
pub use mean::Mean;
pub(crate) use sketch::Sketch;

#[cfg(test)]
mod tests;
