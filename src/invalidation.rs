//! `InvalidationQueue`: how a memory hook tells the cache that `[start, end)` is going away.
//!
//! A hook runs inside `munmap`, `madvise`, `free` and friends, possibly while its own thread
//! holds the cache lock (the cache allocates; the allocator unmaps). So a hook never takes
//! a lock, never allocates and never deregisters: it bumps a counter and pushes the range
//! into a fixed ring (a bounded lock-free queue after Vyukov). The cache drains the ring
//! under its lock before every lookup, so no lookup that starts after the unmap can hit an
//! entry overlapping the range. When the ring is full nothing is dropped: the range is
//! merged into one overflow range covering everything that did not fit (over-invalidating
//! is safe), so memory stays bounded however often a program unmaps.
//!
//! Two counters, invalidations begun and finished, let a registration tell whether an
//! unmap was in flight while it pinned pages (see `Cache::acquire`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};

const CAPACITY: usize = 1024;

struct Slot {
    seq: AtomicUsize,
    /// The invalidation's number (its place in the `started` count).
    number: AtomicU64,
    start: AtomicUsize,
    end: AtomicUsize,
}

pub struct InvalidationQueue {
    slots: [Slot; CAPACITY],
    head: AtomicUsize,
    tail: AtomicUsize,
    overflowed: AtomicBool,
    overflow_start: AtomicUsize,
    overflow_end: AtomicUsize,
    started: AtomicU64,
    finished: AtomicU64,
    active: AtomicBool,
    /// Ranges pushed, and ranges merged into the overflow range (for statistics).
    pub pushed: AtomicU64,
    pub overflows: AtomicU64,
}

impl Default for InvalidationQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl InvalidationQueue {
    pub const fn new() -> InvalidationQueue {
        let mut slots = [const {
            Slot {
                seq: AtomicUsize::new(0),
                number: AtomicU64::new(0),
                start: AtomicUsize::new(0),
                end: AtomicUsize::new(0),
            }
        }; CAPACITY];
        let mut i = 0;
        while i < CAPACITY {
            slots[i].seq = AtomicUsize::new(i);
            i += 1;
        }
        InvalidationQueue {
            slots,
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            overflowed: AtomicBool::new(false),
            overflow_start: AtomicUsize::new(usize::MAX),
            overflow_end: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            active: AtomicBool::new(false),
            pushed: AtomicU64::new(0),
            overflows: AtomicU64::new(0),
        }
    }

    /// From now on ranges are recorded (a cache exists). Before, hooks only count.
    pub fn activate(&self) {
        self.active.store(true, SeqCst);
    }

    pub fn is_active(&self) -> bool {
        self.active.load(Relaxed)
    }

    /// A hook, before the memory changes. Lock-free, allocation-free.
    pub fn begin(&self, start: usize, end: usize) {
        let number = self.started.fetch_add(1, SeqCst);
        if self.active.load(SeqCst) {
            self.push(number, start, end);
        }
    }

    /// A hook, after the memory changed.
    pub fn end(&self) {
        self.finished.fetch_add(1, SeqCst);
    }

    /// (begun, finished) invalidation counts.
    pub fn counters(&self) -> (u64, u64) {
        let started = self.started.load(SeqCst);
        (started, self.finished.load(SeqCst))
    }

    pub fn started(&self) -> u64 {
        self.started.load(SeqCst)
    }

    fn push(&self, number: u64, start: usize, end: usize) {
        self.pushed.fetch_add(1, Relaxed);
        loop {
            let pos = self.tail.load(Relaxed);
            let slot = &self.slots[pos % CAPACITY];
            let seq = slot.seq.load(Acquire);
            let diff = seq as isize - pos as isize;
            if diff == 0 {
                if self
                    .tail
                    .compare_exchange_weak(pos, pos + 1, Relaxed, Relaxed)
                    .is_ok()
                {
                    slot.number.store(number, Relaxed);
                    slot.start.store(start, Relaxed);
                    slot.end.store(end, Relaxed);
                    slot.seq.store(pos + 1, Release);
                    return;
                }
            } else if diff < 0 {
                // Full: merge into the overflow range, bounds first, then the flag.
                self.overflows.fetch_add(1, Relaxed);
                self.overflow_start.fetch_min(start, SeqCst);
                self.overflow_end.fetch_max(end, SeqCst);
                self.overflowed.store(true, SeqCst);
                return;
            }
        }
    }

    /// In a fork child, where only the forking thread exists: forget pending ranges (the
    /// child's cache starts empty) and any push or hook another thread had in flight.
    pub fn reset_after_fork(&self) {
        for (i, slot) in self.slots.iter().enumerate() {
            slot.seq.store(i, SeqCst);
        }
        self.head.store(0, SeqCst);
        self.tail.store(0, SeqCst);
        self.overflowed.store(false, SeqCst);
        self.overflow_start.store(usize::MAX, SeqCst);
        self.overflow_end.store(0, SeqCst);
        self.finished.store(self.started.load(SeqCst), SeqCst);
    }

    /// Whether anything is waiting to be drained.
    pub fn has_pending(&self) -> bool {
        self.head.load(Acquire) != self.tail.load(Acquire) || self.overflowed.load(Acquire)
    }

    /// Hand every pending range to `f(number, start, end)`; `number` is None for the merged
    /// overflow range. Callers serialise drains (the cache lock). Waits for a push that
    /// has claimed a slot but not yet filled it: that producer holds no lock and is a few
    /// instructions from done.
    pub fn drain(&self, mut f: impl FnMut(Option<u64>, usize, usize)) {
        loop {
            let pos = self.head.load(Relaxed);
            if pos == self.tail.load(Acquire) {
                break;
            }
            let slot = &self.slots[pos % CAPACITY];
            let mut spins = 0u32;
            while slot.seq.load(Acquire) != pos + 1 {
                spins += 1;
                if spins > 64 {
                    std::thread::yield_now();
                }
                std::hint::spin_loop();
            }
            let (n, s, e) = (
                slot.number.load(Relaxed),
                slot.start.load(Relaxed),
                slot.end.load(Relaxed),
            );
            slot.seq.store(pos + CAPACITY, Release);
            self.head.store(pos + 1, Release);
            f(Some(n), s, e);
        }
        if self.overflowed.swap(false, SeqCst) {
            let s = self.overflow_start.swap(usize::MAX, SeqCst);
            let e = self.overflow_end.swap(0, SeqCst);
            if e > s {
                f(None, s, e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drained(q: &InvalidationQueue) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        q.drain(|_, s, e| v.push((s, e)));
        v
    }

    #[test]
    fn inactive_queue_only_counts() {
        let q = InvalidationQueue::new();
        q.begin(0x1000, 0x2000);
        q.end();
        assert_eq!(q.counters(), (1, 1));
        assert!(drained(&q).is_empty());
    }

    #[test]
    fn ranges_come_back_in_order_and_overflow_merges() {
        let q = Box::new(InvalidationQueue::new());
        q.activate();
        for i in 0..CAPACITY + 10 {
            q.begin(i * 0x1000, i * 0x1000 + 0x100);
        }
        let v = drained(&q);
        assert_eq!(v.len(), CAPACITY + 1);
        assert_eq!(v[0], (0, 0x100));
        assert_eq!(
            v[CAPACITY - 1],
            ((CAPACITY - 1) * 0x1000, (CAPACITY - 1) * 0x1000 + 0x100)
        );
        assert_eq!(
            v[CAPACITY],
            (CAPACITY * 0x1000, (CAPACITY + 9) * 0x1000 + 0x100)
        );
        assert!(!q.has_pending());
        // Reusable after a full cycle.
        q.begin(1, 2);
        assert_eq!(drained(&q), vec![(1, 2)]);
    }

    #[test]
    fn concurrent_producers_lose_nothing() {
        let q = Box::new(InvalidationQueue::new());
        q.activate();
        let total = std::sync::atomic::AtomicUsize::new(0);
        let covered = std::sync::Mutex::new(vec![false; 4 * 5000]);
        std::thread::scope(|s| {
            for t in 0..4 {
                let q = &q;
                s.spawn(move || {
                    for i in 0..5000 {
                        let k = t * 5000 + i;
                        q.begin(k, k + 1);
                        q.end();
                    }
                });
            }
            s.spawn(|| {
                for _ in 0..2000 {
                    q.drain(|_, a, b| {
                        total.fetch_add(1, Relaxed);
                        let mut c = covered.lock().unwrap();
                        for k in a..b.min(c.len()) {
                            c[k] = true;
                        }
                    });
                }
            });
        });
        q.drain(|_, a, b| {
            let mut c = covered.lock().unwrap();
            for k in a..b.min(c.len()) {
                c[k] = true;
            }
        });
        assert!(
            covered.lock().unwrap().iter().all(|&c| c),
            "an invalidation was lost"
        );
        assert_eq!(q.counters(), (20000, 20000));
    }
}
