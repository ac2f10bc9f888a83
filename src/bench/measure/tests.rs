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
