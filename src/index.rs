//! `RangeIndex`: the address ranges of cached entries, answering "which entries overlap
//! [a, b)" in O(log n + k).
//!
//! Entries may overlap each other (the same buffer registered with different flags or on
//! different PDs), so a plain map by start address cannot bound a query. Ranges are kept in
//! one ordered map per power-of-two length class: a range of class c is shorter than
//! 2^(c+1), so only starts in [a - 2^(c+1) + 1, b) can overlap [a, b).

use std::collections::BTreeMap;

const CLASSES: usize = usize::BITS as usize;

#[derive(Default)]
pub(crate) struct RangeIndex {
    classes: Vec<BTreeMap<(usize, u32), usize>>,
    len: usize,
}

fn class_of(len: usize) -> usize {
    (usize::BITS - 1 - len.max(1).leading_zeros()) as usize
}

impl RangeIndex {
    pub fn new() -> RangeIndex {
        RangeIndex {
            classes: (0..CLASSES).map(|_| BTreeMap::new()).collect(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Add `id` for `[start, end)`; `end > start`.
    pub(crate) fn insert(&mut self, start: usize, end: usize, id: u32) {
        if self.classes[class_of(end - start)]
            .insert((start, id), end)
            .is_none()
        {
            self.len += 1;
        }
    }

    /// Remove `id` for `[start, end)`; returns whether it was there.
    pub(crate) fn remove(&mut self, start: usize, end: usize, id: u32) -> bool {
        let removed = self.classes[class_of(end - start)]
            .remove(&(start, id))
            .is_some();
        if removed {
            self.len -= 1;
        }
        removed
    }

    /// Call `f(id, start, end)` for every range overlapping `[start, end)`.
    pub(crate) fn for_each_overlap(
        &self,
        start: usize,
        end: usize,
        mut f: impl FnMut(u32, usize, usize),
    ) {
        if end <= start {
            return;
        }
        for (c, map) in self.classes.iter().enumerate() {
            if map.is_empty() {
                continue;
            }
            let longest = if c + 1 >= CLASSES {
                usize::MAX
            } else {
                (1usize << (c + 1)) - 1
            };
            let lo = start.saturating_sub(longest);
            for (&(s, id), &e) in map.range((lo, 0)..(end, 0)) {
                if e > start {
                    f(id, s, e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn overlaps(idx: &RangeIndex, s: usize, e: usize) -> Vec<u32> {
        let mut v = Vec::new();
        idx.for_each_overlap(s, e, |id, _, _| v.push(id));
        v.sort();
        v
    }

    #[test]
    fn finds_overlaps_across_classes() {
        let mut idx = RangeIndex::new();
        idx.insert(0x1000, 0x2000, 1);
        idx.insert(0x0, 0x100000, 2);
        idx.insert(0x1800, 0x1801, 3);
        idx.insert(0x5000, 0x6000, 4);
        assert_eq!(overlaps(&idx, 0x1fff, 0x2000), vec![1, 2]);
        assert_eq!(overlaps(&idx, 0x1800, 0x1801), vec![1, 2, 3]);
        assert_eq!(overlaps(&idx, 0x2000, 0x5000), vec![2]);
        assert_eq!(overlaps(&idx, 0x100000, 0x200000), Vec::<u32>::new());
        assert!(idx.remove(0x0, 0x100000, 2));
        assert!(!idx.remove(0x0, 0x100000, 2));
        assert_eq!(overlaps(&idx, 0x2000, 0x5000), Vec::<u32>::new());
        assert_eq!(idx.len(), 3);
    }

    proptest! {
        #[test]
        fn matches_a_linear_scan(
            ranges in prop::collection::vec((0usize..1 << 20, 1usize..1 << 16), 0..60),
            queries in prop::collection::vec((0usize..1 << 20, 1usize..1 << 17), 1..20),
        ) {
            let mut idx = RangeIndex::new();
            for (i, &(s, l)) in ranges.iter().enumerate() {
                idx.insert(s, s + l, i as u32);
            }
            for &(qs, ql) in &queries {
                let want: Vec<u32> = ranges
                    .iter()
                    .enumerate()
                    .filter(|&(_, &(s, l))| s < qs + ql && qs < s + l)
                    .map(|(i, _)| i as u32)
                    .collect();
                prop_assert_eq!(overlaps(&idx, qs, qs + ql), want);
            }
        }
    }
}
