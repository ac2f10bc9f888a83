//! A bounded lock-free ring of fixed-size records of `W` words (Vyukov's bounded queue,
//! with one consumer). A producer claims a slot with one compare-and-swap and fills it; a
//! full ring refuses instead of waiting, so a producer never blocks and never allocates.
//! Shared by the invalidation queue (memory hooks report unmaps) and the trace (every hook
//! pushes a record). Each slot's sequence number says whether it is free for position `pos`
//! (`seq == pos`), filled for it (`seq == pos + 1`), or not yet consumed from the previous
//! lap (`seq < pos`: the ring is full).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

pub(crate) struct Slot<const W: usize> {
    seq: AtomicUsize,
    words: [AtomicU64; W],
}

impl<const W: usize> Slot<W> {
    /// The slot at index `i` of a fresh ring.
    pub const fn new(i: usize) -> Self {
        Slot {
            seq: AtomicUsize::new(i),
            words: [const { AtomicU64::new(0) }; W],
        }
    }
}

/// Slots in a fixed array (a `static`) or a boxed slice (a size chosen at run time).
pub(crate) struct Ring<const W: usize, S> {
    slots: S,
    head: AtomicUsize,
    tail: AtomicUsize,
}

/// A slot claimed by a producer, to fill.
pub(crate) struct Claim<'a, const W: usize> {
    slot: &'a Slot<W>,
    pos: usize,
}

impl<const W: usize> Claim<'_, W> {
    /// The claimed position.
    #[cfg(test)]
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Publish the record: the consumer sees it whole.
    pub(crate) fn fill(self, words: [u64; W]) {
        for (w, v) in self.slot.words.iter().zip(words) {
            w.store(v, Relaxed);
        }
        self.slot.seq.store(self.pos + 1, Release);
    }
}

/// What the consumer finds at the head.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next<const W: usize> {
    Empty,
    /// Claimed by a producer that has not filled it yet.
    Unfilled,
    Ready([u64; W]),
}

impl<const W: usize, S: AsRef<[Slot<W>]>> Ring<W, S> {
    /// A ring over fresh `slots` (slot `i` made by `Slot::new(i)`).
    pub(crate) const fn with_slots(slots: S) -> Self {
        Ring {
            slots,
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
        }
    }

    fn slots(&self) -> &[Slot<W>] {
        self.slots.as_ref()
    }

    /// Claim the next slot; None when the ring is full. Lock-free, allocation-free.
    pub(crate) fn claim(&self) -> Option<Claim<'_, W>> {
        let slots = self.slots();
        loop {
            let pos = self.tail.load(Relaxed);
            let slot = &slots[pos % slots.len()];
            let diff = slot.seq.load(Acquire) as isize - pos as isize;
            if diff == 0 {
                if self
                    .tail
                    .compare_exchange_weak(pos, pos + 1, Relaxed, Relaxed)
                    .is_ok()
                {
                    return Some(Claim { slot, pos });
                }
            } else if diff < 0 {
                return None;
            }
        }
    }

    /// Claim and fill; false when the ring is full.
    pub fn push(&self, words: [u64; W]) -> bool {
        self.claim().map(|c| c.fill(words)).is_some()
    }

    /// Take the record at the head. One consumer at a time (callers serialise).
    pub fn pop(&self) -> Next<W> {
        let slots = self.slots();
        let pos = self.head.load(Relaxed);
        let slot = &slots[pos % slots.len()];
        if slot.seq.load(Acquire) != pos + 1 {
            return if pos == self.tail.load(Acquire) {
                Next::Empty
            } else {
                Next::Unfilled
            };
        }
        let words = std::array::from_fn(|i| slot.words[i].load(Relaxed));
        slot.seq.store(pos + slots.len(), Release);
        self.head.store(pos + 1, Release);
        Next::Ready(words)
    }

    /// The filled records at positions `from..to`, without consuming them. The head stays
    /// behind them (only the consumer moves it), so no producer can reuse these slots
    /// meanwhile.
    pub(crate) fn peek_filled(&self, from: usize, to: usize, mut f: impl FnMut([u64; W])) {
        let slots = self.slots();
        for pos in from..to {
            let slot = &slots[pos % slots.len()];
            if slot.seq.load(Acquire) == pos + 1 {
                f(std::array::from_fn(|i| slot.words[i].load(Relaxed)));
            }
        }
    }

    /// The consumer's position.
    pub(crate) fn head(&self) -> usize {
        self.head.load(Acquire)
    }

    /// The next position a producer claims.
    pub(crate) fn tail(&self) -> usize {
        self.tail.load(Acquire)
    }

    pub(crate) fn has_pending(&self) -> bool {
        self.head() != self.tail()
    }

    /// Empty and fresh again (a fork child, where no other thread exists).
    pub(crate) fn reset(&self) {
        for (i, slot) in self.slots().iter().enumerate() {
            slot.seq.store(i, SeqCst);
        }
        self.head.store(0, SeqCst);
        self.tail.store(0, SeqCst);
    }

    /// Forget what is pending but keep the positions (a fork child where a claimed slot
    /// may still be filled by the forking thread): later claims of unfilled slots' positions
    /// only find the ring full.
    pub(crate) fn skip_pending(&self) {
        self.head.store(self.tail.load(SeqCst), SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_full_and_unfilled() {
        let r: Ring<2, Box<[Slot<2>]>> = Ring::with_slots((0..4).map(Slot::new).collect());
        assert_eq!(r.pop(), Next::Empty);
        for i in 0..4 {
            assert!(r.push([i, i * 10]));
        }
        assert!(!r.push([9, 9]), "full");
        assert_eq!(r.pop(), Next::Ready([0, 0]));
        assert_eq!(r.pop(), Next::Ready([1, 10]));
        let c = r.claim().expect("a slot was freed");
        assert!(r.push([5, 50]));
        assert!(!r.push([6, 60]), "full again");
        for i in 2..4 {
            assert_eq!(r.pop(), Next::Ready([i, i * 10]));
        }
        assert_eq!(r.pop(), Next::Unfilled);
        let mut seen = Vec::new();
        r.peek_filled(r.head() + 1, r.tail(), |w| seen.push(w));
        assert_eq!(seen, vec![[5, 50]]);
        c.fill([4, 40]);
        assert_eq!(r.pop(), Next::Ready([4, 40]));
        assert_eq!(r.pop(), Next::Ready([5, 50]));
        assert_eq!(r.pop(), Next::Empty);
        r.reset();
        assert!(!r.has_pending() && r.tail() == 0);
    }

    #[test]
    fn static_ring() {
        static R: Ring<1, [Slot<1>; 2]> = Ring::with_slots([Slot::new(0), Slot::new(1)]);
        assert!(R.push([7]));
        assert_eq!(R.pop(), Next::Ready([7]));
    }
}
