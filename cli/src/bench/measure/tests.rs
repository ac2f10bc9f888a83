use super::*;
use crate::bench::timing::counted_phase;

#[test]
fn spread_is_median_and_range() {
    assert_eq!(
        Spread::of(&[3.0, 1.0, 2.0]),
        Spread {
            median: 2.0,
            min: 1.0,
            max: 3.0
        }
    );
    assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0]).median, 2.5);
    assert!(Spread::of(&[]).median.is_nan());
}

/// One clock reading per batch is under 0.1% of the batch (rxe guest: 1 us a reading).
#[test]
fn batches_hide_the_clock() {
    assert_eq!(batch_for(40_000.0, 1_000.0), 25);
    assert_eq!(batch_for(1_000.0, 1_000.0), 1000);
    assert_eq!(batch_for(5_000_000.0, 1_000.0), 1);
    assert_eq!(batch_for(10.0, 1_000.0), 65536);
    assert_eq!(batch_for(140_000.0, 20.0), 1);
    for (pair, clock) in [(40_000.0, 1_000.0), (2_000.0, 7_000.0), (300.0, 25.0)] {
        assert!(batch_for(pair, clock) as f64 * pair >= 1000.0 * clock);
    }
    assert_eq!(batch_for(f64::NAN, 7_000.0), 1);
    assert_eq!(batch_for(0.0, 7_000.0), 1);
    assert!(clock_ns() > 0.0);
}

/// The timed phase's figure is its total over its pairs too: a cost in one batch of six
/// (a stall, a flush of deferred work) is in it with its whole length, as an application
/// pays it. Against the windowed median of before it failed (see docs/testing.md).
#[test]
fn a_timed_phase_is_what_its_pairs_cost_in_all() {
    let mut i = 0;
    let t = Instant::now();
    let (ns, n) = phase(Duration::from_millis(100), 10, || {
        if i % 60 == 59 {
            std::thread::sleep(Duration::from_millis(20));
        }
        i += 1;
        std::thread::sleep(Duration::from_micros(100));
        Ok(())
    })
    .unwrap();
    let mean = t.elapsed().as_nanos() as f64 / n as f64;
    assert!(
        n % 10 == 0 && n >= 60 && ns > mean * 0.95 && ns <= mean,
        "figure {ns:.0} ns over {n} pairs, what they cost in all {mean:.0} ns a pair"
    );
}

/// A cost that comes back in one window of four (deferred kernel work
/// repaid every few deregistrations, or a cache's periodic sweep) is what an application
/// pays on average, but the median over the windows drops it. Both `phase` and
/// `counted_phase` report the cheap windows only. This asserts what an application pays
/// (the phase's mean), so it fails with a median over windows: the figure is then ~4x
/// under the mean.
#[test]
fn a_periodic_cost_is_in_the_figure() {
    let mut i = 0usize;
    let t = Instant::now();
    let ns = counted_phase(80, || {
        // Every 4th window of 10 pairs: one pair costs 30 ms (a flush of deferred work).
        if i % 40 == 39 {
            std::thread::sleep(Duration::from_millis(30));
        }
        i += 1;
        std::thread::sleep(Duration::from_micros(100));
        Ok(())
    })
    .unwrap();
    let mean = t.elapsed().as_nanos() as f64 / 80.0;
    assert!(
        ns > mean / 1.5,
        "figure {ns:.0} ns per pair, what the application paid on average {mean:.0} ns"
    );
}
