//! The timing of `mrcache bench`'s phases: windows of pairs between clock readings, and the
//! median and range of a set of figures.

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

/// Pairs of `f` in windows of `batch` pairs (one clock reading each), at least one window,
/// until `slice` has passed: (ns per pair, pairs). The figure is the median over the
/// windows of each one's ns per pair, not the phase's total over its pairs: a stall of the
/// machine (an emulated guest's vCPU descheduled by its host, an interrupt storm) lands in
/// a few windows and moves the median little, where it would weigh on the total with its
/// whole length. An application timing its own calls sees what a median of short windows
/// sees (tests/c/rev26_app.c: 1 ms windows; `bench_agrees_with_app`).
pub fn phase(
    slice: Duration,
    batch: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<(f64, usize), String> {
    let t = Instant::now();
    let mut n = 0usize;
    let mut windows = Vec::new();
    let mut w = t;
    loop {
        for _ in 0..batch {
            f()?;
        }
        n += batch;
        let now = Instant::now();
        windows.push((now - w).as_nanos() as f64 / batch as f64);
        w = now;
        if now - t >= slice {
            break;
        }
    }
    Ok((Spread::of(&windows).median, n))
}

/// `pairs` pairs of `f` (at least one) in windows of `batch` pairs: the median over the
/// windows of ns per pair, as [`phase`] (the control's phases, given a count, not a time).
pub fn counted_phase(
    pairs: usize,
    batch: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    let batch = batch.max(1);
    let mut left = pairs.max(1);
    let mut windows = Vec::new();
    while left > 0 {
        let k = batch.min(left);
        let t = Instant::now();
        for _ in 0..k {
            f()?;
        }
        windows.push(t.elapsed().as_nanos() as f64 / k as f64);
        left -= k;
    }
    Ok(Spread::of(&windows).median)
}
