//! `State::bury` and `State::unbury` keep the tombstone counts by bucket (`buried.rs`)
//! exactly equal to the tombstone set: no bucket left high (a lock taken for nothing) or low
//! (a tombstone missed).

use crate::cache::buried::BuriedCounts;
use crate::cache::state::{Fast, State};
use crate::cache::tests::fake::XorShift;

fn exact(f: &Fast, st: &State) {
    // Every bucket's count is exactly the number of tombstones hashing there.
    let counts = f.buried.counts();
    let mut want = vec![0u32; counts.len()];
    for &p in st.tombstone_set.iter() {
        want[BuriedCounts::bucket_of(p)] += 1;
    }
    for (i, &c) in counts.iter().enumerate() {
        assert_eq!(c as u32, want[i], "bucket {i}");
    }
}

/// Random bury/unbury over a pool larger than TOMBSTONES (the queue pops), with
/// re-burials of already-buried addresses and unburials of absent ones.
#[test]
fn counts_equal_the_set_under_random_ops() {
    let f = Fast::default();
    let mut st = State::new();
    let mut x = XorShift(0x2545_f491_4f6c_dd1d);
    let mut rnd = || x.next();
    let mut max_count = 0u16;
    for i in 0..200_000u64 {
        let p = 0x5555_0000_0000usize + (rnd() % 12_000) as usize * 48;
        if rnd() % 3 == 0 {
            st.unbury(&f, p);
        } else {
            st.bury(&f, p);
        }
        if i % 20_000 == 0 {
            exact(&f, &st);
        }
        // Only the bucket just changed can have risen.
        max_count = max_count.max(f.buried.count_of(p));
    }
    exact(&f, &st);
    assert!(st.tombstone_set.len() <= 4096);
    eprintln!(
        "set len {} max bucket {}",
        st.tombstone_set.len(),
        max_count
    );
    // Adversarial: all in one bucket. The set caps at 4096, so u16 never wraps.
    let same: Vec<usize> = (0usize..)
        .map(|i| 0x7000_0000_0000 + i * 8)
        .filter(|&p| BuriedCounts::bucket_of(p) == BuriedCounts::bucket_of(0x7000_0000_0000))
        .take(10_000)
        .collect();
    for &p in &same {
        st.bury(&f, p);
    }
    exact(&f, &st);
    eprintln!(
        "one bucket after 10,000 burials: {}",
        f.buried.count_of(same[0])
    );
}
