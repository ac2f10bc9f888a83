//! The hash of the hit path's tables: the keys are addresses, not attacker-chosen strings,
//! so a cheap multiply-and-fold hash does; and a counter striped over cache lines.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub(super) const MUL: u64 = 0x9e37_79b9_7f4a_7c15;
/// Stripes of a `Striped` counter.
const STRIPES: usize = 64;

/// Word-at-a-time hash: each word is mixed in with a rotate, xor and multiply, and the
/// result folded through a 64x64->128 multiply so every bit of every word reaches both the
/// low bits (a table's home index) and the top ones (its tag).
#[derive(Default)]
pub struct WordHasher(u64);

impl Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    fn write_u64(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(23) ^ w).wrapping_mul(MUL);
    }
    fn write_u32(&mut self, w: u32) {
        self.write_u64(w as u64);
    }
    fn write_usize(&mut self, w: usize) {
        self.write_u64(w as u64);
    }
    fn finish(&self) -> u64 {
        let m = (self.0 as u128).wrapping_mul(MUL as u128 | 1);
        (m as u64) ^ ((m >> 64) as u64)
    }
}

#[inline]
pub fn hash_of<K: Hash>(k: &K) -> u64 {
    let mut h = WordHasher::default();
    k.hash(&mut h);
    h.finish()
}

#[repr(align(128))]
struct Padded<T>(T);

/// A counter split over cache lines, so that threads counting at once do not contend; the
/// caller picks the stripe (the hit path uses bits of its key's hash).
pub struct Striped {
    cells: Box<[Padded<AtomicU64>]>,
}

impl Default for Striped {
    fn default() -> Self {
        Striped {
            cells: (0..STRIPES).map(|_| Padded(AtomicU64::new(0))).collect(),
        }
    }
}

impl Striped {
    #[inline]
    pub fn add(&self, stripe: usize, n: u64) {
        self.cells[stripe % STRIPES].0.fetch_add(n, Relaxed);
    }

    pub fn load(&self) -> u64 {
        // Wrapping: a stripe may have been counted down below zero (`add` of a negative
        // number, wrapped) while another was counted up.
        self.cells
            .iter()
            .fold(0u64, |n, c| n.wrapping_add(c.0.load(Relaxed)))
    }
}

impl std::fmt::Debug for Striped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.load())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn page_aligned_keys_spread_over_low_and_high_bits() {
        let (mut low, mut high) = (HashSet::new(), HashSet::new());
        for i in 0..4096usize {
            let h = hash_of(&(0x7f00_0000_0000 + i * 8192, 4096));
            low.insert(h & 0xfff);
            high.insert(h >> 55);
        }
        assert!(low.len() > 2000, "low bits take {} values", low.len());
        assert_eq!(high.len(), 512, "top 9 bits take {} values", high.len());
    }

    #[test]
    fn striped_counts() {
        let s = Striped::default();
        s.add(3, 2);
        s.add(70, 1);
        assert_eq!(s.load(), 3);
    }
}
