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

    /// Each bucket's count, in bucket order (for the checks).
    #[cfg(test)]
    pub(super) fn counts(&self) -> Vec<u16> {
        self.counts.iter().map(|c| c.load(SeqCst)).collect()
    }

    /// The count of `ptr`'s bucket (for the checks).
    #[cfg(test)]
    pub(super) fn count_of(&self, ptr: usize) -> u16 {
        self.bucket(ptr).load(SeqCst)
    }

    /// The bucket `ptr` falls in (for the checks).
    #[cfg(test)]
    pub(super) fn bucket_of(ptr: usize) -> usize {
        Self::index(ptr)
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
        let mut z = crate::cache::tests::fake::XorShift(0x9e37_79b9_7f4a_7c15);
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
        use crate::cache::tests::fake::{Fake, LIMITS, idle_entry};
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
