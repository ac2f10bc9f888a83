use super::*;

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

/// A stall in one window of a phase moves its figure little: the figure is the median over
/// the windows, where the phase's total over its pairs would carry the stall's whole length
/// (the control's long phases on a loaded emulated guest: 3x an application's own timing).
#[test]
fn a_stalled_window_does_not_make_the_figure() {
    let stall = Duration::from_millis(200);
    let pair = || std::thread::sleep(Duration::from_micros(100));
    let mut i = 0;
    let t = Instant::now();
    let ns = counted_phase(100, 10, || {
        if i == 35 {
            std::thread::sleep(stall);
        }
        i += 1;
        pair();
        Ok(())
    })
    .unwrap();
    let mean = t.elapsed().as_nanos() as f64 / 100.0;
    assert!(
        ns * 2.0 < mean && ns >= 100_000.0,
        "figure {ns:.0} ns per pair, the phase's mean {mean:.0}"
    );
    // The timed phase: the same, windows of 10 pairs until 150 ms have passed (the stall,
    // 400 ms in the sixth window, ends it; five windows fit in 150 ms even on a loaded host).
    let mut i = 0;
    let t = Instant::now();
    let (ns, n) = phase(Duration::from_millis(150), 10, || {
        if i == 55 {
            std::thread::sleep(2 * stall);
        }
        i += 1;
        pair();
        Ok(())
    })
    .unwrap();
    let mean = t.elapsed().as_nanos() as f64 / n as f64;
    assert!(
        n >= 60 && ns * 2.0 < mean,
        "figure {ns:.0} over {n} pairs, mean {mean:.0}"
    );
}
