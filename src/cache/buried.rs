//! How many tombstones (`State::bury`) fall in each bucket of their addresses' hash, kept
//! under the state lock and read without it: a registration passed through to libibverbs
//! (`Cache::note_foreign`) takes the lock to clear its address's tombstone only when its
//! bucket holds one. With a flag for "any tombstone yet" instead, every pass-through of a
//! cache that had ever deregistered an MR took the lock and a hash lookup for nothing,
//! about 110 of the 1,935 instructions a default remote pass-through pair would cost
//! (callgrind).
//!
//! No false "none": a count is raised (SeqCst) before the buried MR is deregistered, so
//! before its address can be freed and handed out again by the allocator, whose
//! free/malloc order any later registration that gets the address is behind; it is
//! lowered only when a tombstone leaves (under the lock). A bucket shared by other
//! tombstones only costs the lock, as every call did before: with the queue full (4,096
//! tombstones) about one address in nine that has none shares a bucket with one (64 KiB of
//! counts; with 8,192 buckets 33-46% were measured). The counts never exceed the number
//! of tombstones (`TOMBSTONES` and one more, for a moment): u16 holds them.

use std::sync::atomic::{AtomicU16, Ordering::*};

const BUCKETS: usize = 32768;

pub(super) struct BuriedCounts {
    counts: Box<[AtomicU16]>,
}

impl Default for BuriedCounts {
    fn default() -> BuriedCounts {
        BuriedCounts {
            counts: (0..BUCKETS).map(|_| AtomicU16::new(0)).collect(),
        }
    }
}

impl BuriedCounts {
    fn index(ptr: usize) -> usize {
        ((ptr >> 3).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) & (BUCKETS - 1)
    }

    fn bucket(&self, ptr: usize) -> &AtomicU16 {
        &self.counts[Self::index(ptr)]
    }

    /// The memory the counts take.
    pub(super) fn bytes(&self) -> usize {
        self.counts.len() * size_of::<AtomicU16>()
    }

    /// A tombstone for `ptr` was added (under the state lock, before the MR is freed).
    pub(super) fn add(&self, ptr: usize) {
        self.bucket(ptr).fetch_add(1, SeqCst);
    }

    /// A tombstone for `ptr` left (under the state lock).
    pub(super) fn remove(&self, ptr: usize) {
        self.bucket(ptr).fetch_sub(1, SeqCst);
    }

    /// Whether `ptr` may have a tombstone (false: it has none).
    pub(super) fn maybe(&self, ptr: usize) -> bool {
        self.bucket(ptr).load(SeqCst) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every buried address reads "maybe" until its tombstone leaves; most others read
    /// "none" (a shared bucket is allowed, a missed tombstone never).
    #[test]
    fn counts_follow_the_tombstones() {
        let b = BuriedCounts::default();
        // Heap addresses (16-byte aligned, anywhere in 1 GiB), from a fixed sequence.
        let mut z = crate::cache::test_fake::XorShift(0x9e37_79b9_7f4a_7c15);
        let mut heap = move || 0x5555_0000_0000 + (z.next() as usize % (1 << 26)) * 16;
        let mut ptrs: Vec<usize> = (0..4096).map(|_| heap()).collect();
        ptrs.sort();
        ptrs.dedup();
        for &p in &ptrs {
            b.add(p);
        }
        assert!(ptrs.iter().all(|&p| b.maybe(p)));
        // Full (the queue's 4,096 tombstones): the share of other addresses read maybe.
        let others: Vec<usize> = (0..20_000)
            .map(|_| heap())
            .filter(|p| ptrs.binary_search(p).is_err())
            .collect();
        let maybe = others.iter().filter(|&&p| b.maybe(p)).count();
        println!(
            "{maybe} of {} addresses without a tombstone read maybe",
            others.len()
        );
        assert!(
            maybe * 100 < others.len() * 15,
            "{maybe} of {}",
            others.len()
        );
        for &p in &ptrs[..2048] {
            b.remove(p);
        }
        assert!(
            ptrs[2048..].iter().all(|&p| b.maybe(p)),
            "a tombstone missed"
        );
        let others = (0..10_000)
            .map(|i| 0x7f00_0000_0000 + i * 64)
            .filter(|&p| b.maybe(p))
            .count();
        assert!(
            others < 1_500,
            "{others} of 10,000 other addresses read maybe"
        );
        for &p in &ptrs[2048..] {
            b.remove(p);
        }
        assert!(ptrs.iter().all(|&p| !b.maybe(p)));
    }

    /// A pass-through whose address has no tombstone in its bucket does not wait for the
    /// state lock, though the cache has buried MRs (with the flag it waited: this test
    /// timed out against it).
    #[test]
    fn a_pass_through_without_a_tombstone_skips_the_lock() {
        use crate::cache::test_fake::{Fake, LIMITS, idle_entry};
        use crate::cache::{Cache, Released};
        let fake = Fake::default();
        let cache = Cache::new(&fake, LIMITS);
        let (_, h) = idle_entry(&cache, 0x10_0000);
        cache.invalidate(0x10_0000, 0x10_1000); // deregistered: h is a tombstone
        assert_eq!(cache.release(h), Released::DoubleRelease);
        assert!(cache.fast.buried.maybe(h));
        let other = (1..)
            .map(|i| 0x7f00_0000_0000usize + i * 64)
            .find(|&p| !cache.fast.buried.maybe(p))
            .unwrap();
        let held = cache.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                cache.note_foreign(other);
                tx.send(()).unwrap();
            });
            let done = rx.recv_timeout(std::time::Duration::from_secs(20));
            drop(held);
            assert!(done.is_ok(), "note_foreign waited for the state lock");
        });
        // The buried address reused by a pass-through: live again, not a double release.
        cache.note_foreign(h);
        assert_eq!(cache.release(h), Released::NotOurs);
    }
}

#[cfg(test)]
mod fuzz {
    use super::*;
    use crate::cache::state::{Fast, State};

    fn exact(f: &Fast, st: &State) {
        // Every bucket's count is exactly the number of tombstones hashing there.
        let mut want = vec![0u32; BUCKETS];
        for &p in st.tombstone_set.iter() {
            want[BuriedCounts::index(p)] += 1;
        }
        for (i, c) in f.buried.counts.iter().enumerate() {
            assert_eq!(c.load(SeqCst) as u32, want[i], "bucket {i}");
        }
    }

    /// Random bury/unbury over a pool larger than TOMBSTONES (the queue pops), with
    /// re-burials of already-buried addresses and unburials of absent ones.
    #[test]
    fn counts_equal_the_set_under_random_ops() {
        let f = Fast::default();
        let mut st = State::new();
        let mut x = crate::cache::test_fake::XorShift(0x2545_f491_4f6c_dd1d);
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
            max_count = max_count.max(f.buried.bucket(p).load(SeqCst));
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
            .filter(|&p| std::ptr::eq(f.buried.bucket(p), f.buried.bucket(0x7000_0000_0000)))
            .take(10_000)
            .collect();
        for &p in &same {
            st.bury(&f, p);
        }
        exact(&f, &st);
        eprintln!(
            "one bucket after 10,000 burials: {}",
            f.buried.bucket(same[0]).load(SeqCst)
        );
    }
}
