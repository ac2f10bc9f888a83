//! The timing of `mrcache bench`'s phases: batches of pairs between clock readings, a
//! phase's figure its total over its pairs; and the median and range of a set of figures.

use super::units::us;

use std::time::{Duration, Instant};

/// Median and range of a set of figures, in ns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(v: &[f64]) -> Spread {
        let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        if s.is_empty() {
            return Spread {
                median: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
            };
        }
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Spread {
            median,
            min: s[0],
            max: s[n - 1],
        }
    }
}

/// What one reading of the clock costs here, in ns (the median of 5 runs of 64 readings):
/// tens of ns with a vDSO clock (TSC), microseconds where `clock_gettime` is a system call
/// (the HPET of an emulated guest: about 7 us on the rxe guest).
pub fn clock_ns() -> f64 {
    let mut runs = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let mut last = t;
        for _ in 0..64 {
            last = std::hint::black_box(Instant::now());
        }
        runs.push((last - t).as_nanos() as f64 / 64.0);
    }
    Spread::of(&runs).median
}

/// Pairs per batch for a phase whose pairs take about `pair_ns`: enough that the one clock
/// reading per batch is under 0.1% of the batch at the cost `clock_ns` measured (a reading
/// between registrations can cost several times what back-to-back readings do: an emulated
/// HPET read waits for the emulator's lock); at most 65,536, at least 1.
pub fn batch_for(pair_ns: f64, clock_ns: f64) -> usize {
    if !(pair_ns.is_finite() && pair_ns > 0.0 && clock_ns.is_finite()) {
        return 1;
    }
    ((1000.0 * clock_ns / pair_ns).ceil() as usize).clamp(1, 65536)
}

/// Pairs of `f` in batches of `batch` pairs (one clock reading each), at least one batch,
/// until `slice` has passed: (ns per pair, pairs). The figure is the phase's total time
/// over its pairs, what an application doing these pairs pays: a cost that comes back
/// every few pairs (deferred kernel work, a flush) counts for what it costs, as a stall of
/// the machine does; the robustness against stalls is the median over rounds (each round
/// one figure per phase), not a median inside the phase, which would drop every cost
/// landing in fewer than half of its windows.
pub fn phase(
    slice: Duration,
    batch: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<(f64, usize), String> {
    let batch = batch.max(1);
    let t = Instant::now();
    let mut n = 0usize;
    loop {
        for _ in 0..batch {
            f()?;
        }
        n += batch;
        let took = t.elapsed();
        if took >= slice {
            return Ok((took.as_nanos() as f64 / n as f64, n));
        }
    }
}

/// `pairs` pairs of `f` (at least one), one clock reading at each end: the phase's total
/// over its pairs, as [`phase`] (the control's phases, given a count, not a time).
pub fn counted_phase(
    pairs: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    let pairs = pairs.max(1);
    let t = Instant::now();
    for _ in 0..pairs {
        f()?;
    }
    Ok(t.elapsed().as_nanos() as f64 / pairs as f64)
}

impl Spread {
    /// `median (min-max)`, in microseconds.
    pub fn text(&self) -> String {
        format!("{} ({}-{})", us(self.median), us(self.min), us(self.max))
    }

    /// `{"median", "min", "max"}` in microseconds, null where not finite.
    pub fn json(&self) -> serde_json::Value {
        let f = |v: f64| {
            if v.is_finite() {
                serde_json::json!(v / 1000.0)
            } else {
                serde_json::Value::Null
            }
        };
        serde_json::json!({"median": f(self.median), "min": f(self.min), "max": f(self.max)})
    }
}
