//! `InvalidationQueue`: how a memory hook tells the cache that `[start, end)` is going away.
//!
//! A hook runs inside `munmap`, `madvise`, `free` and friends, possibly while its own thread
//! holds the cache lock (the cache allocates; the allocator unmaps). So a hook never takes
//! a lock, never allocates and never deregisters: it bumps a counter and pushes the range
//! into a fixed ring (a bounded lock-free queue after Vyukov). The cache drains the ring
//! under its lock before every lookup, so no lookup that starts after the unmap can hit an
//! entry overlapping the range. When the ring is full nothing is dropped: the range is
//! merged into one overflow range covering everything that did not fit (over-invalidating
//! is safe), so memory stays bounded however often a program unmaps. The overflow range is
//! one packed word: a merge is one compare-and-swap and a drain one swap, so no interleaving
//! of producers and drains can lose a range.
//!
//! Two counters, invalidations begun and finished, let a registration tell whether an
//! unmap was in flight while it pinned pages (see `Cache::acquire`).

use crate::ring::{self, Next, Ring};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

const CAPACITY: usize = 1024;

/// The overflow range, packed: bit 63 says a range is present, bit 62 that it covers the
/// whole address space; else bits 31..62 hold the first and bits 0..31 the last 64 KiB unit
/// touched. 31 bits of 64 KiB units span 2^47 bytes, all of x86-64's 4-level user space;
/// a range reaching beyond that becomes "everything".
mod packed {
    pub(crate) const EMPTY: u64 = 0;
    const PRESENT: u64 = 1 << 63;
    const EVERYTHING: u64 = 1 << 62;
    const UNIT: u32 = 16;
    const FIELD: u32 = 31;
    const MASK: u64 = (1 << FIELD) - 1;
    const LIMIT: usize = 1 << (UNIT + FIELD);

    pub(crate) fn pack(start: usize, end: usize) -> u64 {
        if end > LIMIT {
            return PRESENT | EVERYTHING;
        }
        let first = (start >> UNIT) as u64;
        let last = ((end - 1) >> UNIT) as u64;
        PRESENT | first << FIELD | last
    }

    /// The smallest packed range covering both.
    pub(crate) fn merge(a: u64, b: u64) -> u64 {
        if a == EMPTY {
            return b;
        }
        if (a | b) & EVERYTHING != 0 {
            return PRESENT | EVERYTHING;
        }
        let first = (a >> FIELD & MASK).min(b >> FIELD & MASK);
        let last = (a & MASK).max(b & MASK);
        PRESENT | first << FIELD | last
    }

    /// `[start, end)` of a present packed range.
    pub(crate) fn unpack(w: u64) -> (usize, usize) {
        if w & EVERYTHING != 0 {
            return (0, usize::MAX);
        }
        let first = (w >> FIELD & MASK) as usize;
        let last = (w & MASK) as usize;
        (first << UNIT, (last + 1) << UNIT)
    }
}

/// Ranges the memory hooks report before memory goes away, lock-free and allocation-free, for the cache to drain.
pub struct InvalidationQueue {
    /// Pending ranges: the invalidation's number (its place in the `started` count), start,
    /// end.
    ring: Ring<3, [ring::Slot<3>; CAPACITY]>,
    /// Ranges that did not fit in the ring, merged (`packed`).
    overflow: AtomicU64,
    started: AtomicU64,
    finished: AtomicU64,
    active: AtomicBool,
    /// Ranges merged into the overflow range (for statistics).
    pub overflows: AtomicU64,
}

impl Default for InvalidationQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl InvalidationQueue {
    /// An empty queue, inactive (usable in a `static`).
    pub const fn new() -> InvalidationQueue {
        let mut slots = [const { ring::Slot::new(0) }; CAPACITY];
        let mut i = 0;
        while i < CAPACITY {
            slots[i] = ring::Slot::new(i);
            i += 1;
        }
        InvalidationQueue {
            ring: Ring::with_slots(slots),
            overflow: AtomicU64::new(packed::EMPTY),
            started: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            active: AtomicBool::new(false),
            overflows: AtomicU64::new(0),
        }
    }

    /// From now on ranges are recorded (a cache exists). Before, hooks only count.
    pub fn activate(&self) {
        self.active.store(true, SeqCst);
    }

    /// Whether `activate` was called.
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

    /// When no invalidation is in flight: the number begun so far. None while one is.
    pub(crate) fn quiet(&self) -> Option<u64> {
        self.quiet_with(|| {})
    }

    /// `quiet`, running `between` between its two loads (tests put other hooks there).
    /// `finished` is read first: hooks finish out of order, so with `started` read first an
    /// unrelated hook that begins and ends between the loads would make the counts equal
    /// while an older one is still between its report and its system call.
    fn quiet_with(&self, between: impl FnOnce()) -> Option<u64> {
        let finished = self.finished.load(SeqCst);
        between();
        let started = self.started.load(SeqCst);
        (started == finished).then_some(started)
    }

    #[inline]
    pub(crate) fn started(&self) -> u64 {
        self.started.load(SeqCst)
    }

    fn push(&self, number: u64, start: usize, end: usize) {
        if !self.ring.push([number, start as u64, end as u64]) && end > start {
            // Full: merge into the overflow range in one compare-and-swap.
            self.overflows.fetch_add(1, Relaxed);
            let mine = packed::pack(start, end);
            let _ = self
                .overflow
                .fetch_update(SeqCst, SeqCst, |w| Some(packed::merge(w, mine)));
        }
    }

    /// In a fork child, where only the forking thread exists: forget pending ranges (the
    /// child's cache starts empty) and any push or hook another thread had in flight.
    /// `open_here`: hooks the forking thread itself has open (fork from a signal handler
    /// that interrupted one): they finish in the child, so `finished` is set to leave them
    /// counted as in flight, and the ring keeps its positions (such a hook may be between
    /// claiming a slot and filling it, and will fill it): positions are skipped, not reset,
    /// and a slot a vanished producer never fills only makes later pushes overflow, which
    /// loses nothing.
    pub fn reset_after_fork(&self, open_here: u64) {
        let started = self.started.load(SeqCst);
        if open_here == 0 {
            self.ring.reset();
        } else {
            self.ring.skip_pending();
        }
        self.overflow.store(packed::EMPTY, SeqCst);
        self.finished
            .store(started.saturating_sub(open_here), SeqCst);
    }

    /// Whether anything is waiting to be drained.
    pub(crate) fn has_pending(&self) -> bool {
        self.ring.has_pending() || self.overflow.load(Acquire) != packed::EMPTY
    }

    /// Hand every pending range to `f(number, start, end)`; `number` is None for the merged
    /// overflow range and for ranges seen ahead of an unfilled slot (those come again, with
    /// their number, once consumed). Callers serialise drains (the cache lock).
    ///
    /// Bounded: it consumes up to the tail seen on entry and never waits. A slot a producer
    /// has claimed but not yet filled stops consumption there (the ring is consumed in
    /// order), but that producer has not reached its system call yet, so its memory is still
    /// there; every filled slot after it is handed out too, so nothing whose unmap may have
    /// happened is missed.
    pub fn drain(&self, mut f: impl FnMut(Option<u64>, usize, usize)) {
        let tail = self.ring.tail();
        while self.ring.head() != tail {
            match self.ring.pop() {
                Next::Ready([n, s, e]) => f(Some(n), s as usize, e as usize),
                _ => {
                    let from = self.ring.head() + 1;
                    self.ring
                        .peek_filled(from, tail, |[_, s, e]| f(None, s as usize, e as usize));
                    break;
                }
            }
        }
        let w = self.overflow.swap(packed::EMPTY, SeqCst);
        if w != packed::EMPTY {
            let (s, e) = packed::unpack(w);
            f(None, s, e);
        }
    }
}

#[cfg(test)]
mod tests;
