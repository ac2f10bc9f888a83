//! The hash of the hit path's tables: the keys are addresses, not attacker-chosen strings,
//! so a cheap multiply-and-fold hash does; and a counter striped over cache lines.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub(super) const MUL: u64 = 0x9e37_79b9_7f4a_7c15;
/// Stripes of a `Striped` counter.
const STRIPES: usize = 64;

/// Maps and sets keyed by addresses (handles, MRs, PDs, windows) or small integers: std's
/// SipHash guards against keys an attacker chooses, which these are not, and a remote
/// round's maps spent about 370 of its 4,191 instructions in it (callgrind, fake provider);
/// in the TCG guest every instruction counts about 5 ns.
pub type WordMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<WordHasher>>;
/// A set keyed by a word, hashed by `WordHasher` (as `WordMap`).
pub type WordSet<K> = std::collections::HashSet<K, std::hash::BuildHasherDefault<WordHasher>>;

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
        fold(self.0)
    }
}

/// The hash of a few words for the hit path's key: each word is multiplied by its own
/// odd constant and rotated by its own amount, all at once, then the products are xored
/// and folded as `finish` does. `WordHasher` chains one multiply per word, a latency of
/// about 25 cycles before a lookup can start; this one is two multiplies deep.
#[inline(always)]
pub(crate) fn words_hash<const N: usize>(w: [u64; N]) -> u64 {
    const K: [u64; 5] = [
        MUL,
        0xc2b2_ae3d_27d4_eb4f,
        0x1656_67b1_9e37_79f9,
        0xd6e8_feb8_6659_fd93,
        0xff51_afd7_ed55_8ccd,
    ];
    const ROT: [u32; 5] = [0, 17, 31, 43, 53];
    let mut h = 0u64;
    for i in 0..N {
        h ^= w[i].wrapping_mul(K[i % 5]).rotate_left(ROT[i % 5]);
    }
    fold(h)
}

/// A 64x64->128 multiply, its halves xored: every bit of `h` reaches both the low bits (a
/// table's home index) and the top ones (its tag).
#[inline(always)]
fn fold(h: u64) -> u64 {
    let m = (h as u128).wrapping_mul(MUL as u128 | 1);
    (m as u64) ^ ((m >> 64) as u64)
}

#[inline]
pub(crate) fn hash_of<K: Hash>(k: &K) -> u64 {
    let mut h = WordHasher::default();
    k.hash(&mut h);
    h.finish()
}

#[repr(align(128))]
struct Padded<T>(T);

/// A counter split over cache lines, so that threads counting at once do not contend; the
/// caller picks the stripe (the hit path uses bits of its key's hash).
pub(crate) struct Striped {
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

    pub(crate) fn load(&self) -> u64 {
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

    /// The hit path's key: page-aligned buffers of one length, iova = addr (as
    /// `ibv_reg_mr` passes it), must spread over a table's home bits and its tag.
    #[test]
    fn page_aligned_keys_with_iova_equal_to_addr_spread() {
        let (mut low, mut high, mut all) = (HashSet::new(), HashSet::new(), HashSet::new());
        for i in 0..4096u64 {
            let a = 0x7f00_0000_0000 + i * 8192;
            let h = words_hash([0x5555_0000_1000, a, 4096, 1, a]);
            low.insert(h & 0xfff);
            high.insert(h >> 55);
            all.insert(h);
        }
        // A random function leaves about 1 of the 512 tags unused here: > 500 of them.
        assert!(low.len() > 2000, "low bits take {} values", low.len());
        assert!(high.len() > 500, "top 9 bits take {} values", high.len());
        assert_eq!(all.len(), 4096);
        // Keys that differ in one word only (the PD, the access, the length) differ.
        let base = [
            0x5555_0000_1000,
            0x7f00_0000_0000,
            4096,
            1,
            0x7f00_0000_0000,
        ];
        let mut seen = HashSet::new();
        for (i, d) in [(0usize, 0x40u64), (2, 4096), (3, 2), (4, 4096), (1, 4096)] {
            let mut k = base;
            k[i] += d;
            assert!(seen.insert(words_hash(k) & 0xffff) || i == 0, "word {i}");
        }
        assert!(!seen.contains(&(words_hash(base) & 0xffff)));
    }

    #[test]
    fn striped_counts() {
        let s = Striped::default();
        s.add(3, 2);
        s.add(70, 1);
        assert_eq!(s.load(), 3);
    }
}
