//! A hash table of slot ids that readers probe without any lock: open addressing with
//! linear probing over 32-bit atomic words, each an entry's slot id and a few bits of its
//! key's hash (a tag). Writers (insert, remove, growth) are serialized by the cache lock.
//!
//! A reader may see a word a writer is moving or has just removed, or miss a word being
//! moved: so whatever it finds is only a candidate, which the caller validates against the
//! slot itself (its key, its state word), and a miss on the lock-free path is retried on
//! the locked one, where the table is exact.
//!
//! Growth publishes a table twice the size; the old ones stay allocated (a reader may still
//! be probing one) and are never written again: together they are smaller than the current
//! one. They are counted in `bytes`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::*};

/// Slot ids are below 2^23 (`MAX_SLOTS`); a word holds the id plus one, so 0 is empty.
pub(super) const ID_BITS: u32 = 23;
const ID_MASK: u32 = (1 << ID_BITS) - 1;
const TAG_BITS: u32 = 32 - ID_BITS;
/// The smallest table: 2^8 words (1 KiB: short probe runs for a small cache).
const MIN_BITS: u32 = 8;
/// The largest: 2^24 words, room for 2^23 ids at three quarters full.
const LEVELS: usize = (ID_BITS + 1 - MIN_BITS + 1) as usize;

fn tag(hash: u64) -> u32 {
    (hash >> (64 - TAG_BITS)) as u32
}

fn word(hash: u64, id: u32) -> u32 {
    debug_assert!(id < ID_MASK);
    (tag(hash) << ID_BITS) | (id + 1)
}

fn id_of(w: u32) -> u32 {
    (w & ID_MASK) - 1
}

pub(crate) struct Table {
    /// Tables of 2^(MIN_BITS + i) words, allocated as the table grows (a fixed-size array:
    /// the reader's bounds check compares with a constant).
    levels: [OnceLock<Box<[AtomicU32]>>; LEVELS],
    /// The level readers probe.
    current: AtomicUsize,
    /// Occupied words of the current level (written under the cache lock only).
    len: AtomicUsize,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            levels: std::array::from_fn(|_| OnceLock::new()),
            current: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
        }
    }
}

fn words(n: usize) -> Box<[AtomicU32]> {
    (0..n).map(|_| AtomicU32::new(0)).collect()
}

impl Table {
    fn level(&self, l: usize) -> &[AtomicU32] {
        self.levels[l].get_or_init(|| words(1 << (MIN_BITS as usize + l)))
    }

    /// The current table (for writers: allocated if need be).
    fn table(&self) -> &[AtomicU32] {
        self.level(self.current.load(Acquire))
    }

    /// Call `f` on every candidate id for `hash`, in probe order, until it returns Some.
    /// Lock-free; candidates are unvalidated and one present may be missed while a writer
    /// moves it.
    #[inline(always)]
    pub(crate) fn find<R>(&self, hash: u64, mut f: impl FnMut(u32) -> Option<R>) -> Option<R> {
        // Published only once allocated and filled.
        let t = self.levels[self.current.load(Acquire)].get()?;
        let mask = t.len() - 1;
        let want = tag(hash);
        let mut i = hash as usize & mask;
        // At most every word once (a full table cannot be, but a reader must not spin).
        let mut left = mask;
        loop {
            let w = t[i].load(Acquire);
            if w == 0 {
                return None;
            }
            if w >> ID_BITS == want
                && let Some(r) = f(id_of(w))
            {
                return Some(r);
            }
            if left == 0 {
                return None;
            }
            left -= 1;
            i = (i + 1) & mask;
        }
    }

    /// Add `id` under `hash` (cache lock held). `hash_of(id)`: the hash of an id already in
    /// the table, to move it when the table grows.
    pub(crate) fn insert(&self, hash: u64, id: u32, hash_of: impl Fn(u32) -> u64) {
        let len = self.len.load(Relaxed) + 1;
        let l = self.current.load(Relaxed);
        if len * 4 > self.level(l).len() * 3 && l + 1 < LEVELS {
            let old = self.level(l);
            let new = self.level(l + 1);
            for w in old {
                let w = w.load(Relaxed);
                if w != 0 {
                    place(new, hash_of(id_of(w)), w);
                }
            }
            // Readers switch to the new table with every word in place.
            self.current.store(l + 1, Release);
        }
        place(self.table(), hash, word(hash, id));
        self.len.store(len, Relaxed);
    }

    /// Take `id` out from under `hash` (cache lock held); whether it was there. Later
    /// words of its run move back into the hole, so no run is ever broken.
    pub(crate) fn remove(&self, hash: u64, id: u32, hash_of: impl Fn(u32) -> u64) -> bool {
        let t = self.table();
        let mask = t.len() - 1;
        let want = word(hash, id);
        let mut hole = hash as usize & mask;
        loop {
            match t[hole].load(Relaxed) {
                0 => return false,
                w if w == want => break,
                _ => hole = (hole + 1) & mask,
            }
        }
        let mut next = hole;
        loop {
            next = (next + 1) & mask;
            let w = t[next].load(Relaxed);
            if w == 0 {
                break;
            }
            // A word may move back to the hole when its home is not between the hole
            // (exclusive) and where it stands (inclusive), cyclically.
            let home = hash_of(id_of(w)) as usize & mask;
            if (next.wrapping_sub(home) & mask) >= (next.wrapping_sub(hole) & mask) {
                // Copied before its old place is overwritten: a reader may see it twice,
                // never a run broken ahead of it.
                t[hole].store(w, Release);
                hole = next;
            }
        }
        t[hole].store(0, Release);
        self.len.fetch_sub(1, Relaxed);
        true
    }

    /// Empty the table (no other thread may be probing).
    #[cfg(test)]
    pub(crate) fn clear(&self) {
        self.table().iter().for_each(|w| w.store(0, Relaxed));
        self.len.store(0, Relaxed);
    }

    /// Bytes of every table allocated (the current one and those it replaced).
    pub fn bytes(&self) -> usize {
        self.levels
            .iter()
            .filter_map(|l| l.get())
            .map(|t| t.len() * size_of::<AtomicU32>())
            .sum()
    }
}

/// Store `w` in the first empty word of its run.
fn place(t: &[AtomicU32], hash: u64, w: u32) {
    let mask = t.len() - 1;
    let mut i = hash as usize & mask;
    while t[i].load(Relaxed) != 0 {
        i = (i + 1) & mask;
    }
    t[i].store(w, Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Hashes that collide a lot (few home slots, few tags) to exercise runs and wrap-around.
    fn h(id: u32) -> u64 {
        let x = (id as u64 % 7).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (x & !0xf) | (id as u64 % 3)
    }

    fn all(t: &Table, hash: u64) -> Vec<u32> {
        let mut v = Vec::new();
        t.find(hash, |id| {
            v.push(id);
            None::<()>
        });
        v
    }

    proptest! {
        /// Against a set: after any sequence of inserts and removes (through growth), every
        /// id present is found under its hash, and none removed is.
        #[test]
        fn matches_a_set(ops in prop::collection::vec((0u32..200, any::<bool>()), 0..600)) {
            let t = Table::default();
            let mut set = std::collections::BTreeSet::new();
            for (id, add) in ops {
                if add && !set.contains(&id) {
                    t.insert(h(id), id, h);
                    set.insert(id);
                } else if !add {
                    prop_assert_eq!(t.remove(h(id), id, h), set.remove(&id));
                }
                for id in 0..200 {
                    prop_assert_eq!(all(&t, h(id)).contains(&id), set.contains(&id));
                }
            }
        }
    }

    #[test]
    fn grows_and_counts_every_level() {
        let t = Table::default();
        for id in 0..1000 {
            t.insert(h(id), id, h);
        }
        assert!(all(&t, h(999)).contains(&999));
        // 2048 words in use after 1000 at most three quarters full, 256..1024 retired.
        assert_eq!(t.bytes(), (2048 + 1792) * 4);
        t.clear();
        assert!(all(&t, h(999)).is_empty());
    }
}
