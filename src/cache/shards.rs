//! The concurrent maps of the hit path (exact key -> entry, provider MR -> entry): hash
//! maps split into shards, each behind its own mutex on its own cache line, so threads
//! working on different buffers rarely meet. The key is hashed once, with a cheap
//! multiply-and-fold hash (the keys are addresses, not attacker-chosen strings), and the
//! map reuses that hash instead of hashing again.
//!
//! A caller that must act on a value atomically with respect to its removal does so inside
//! `with`, under the shard's lock: whoever removes the key waits for it.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

const SHARD_BITS: u32 = 6;
pub const SHARDS: usize = 1 << SHARD_BITS;
const MUL: u64 = 0x9e37_79b9_7f4a_7c15;
/// The hash bits the map keeps in its control bytes to tell keys apart (hashbrown's `h2`:
/// the top 7).
const TAG_BITS: u32 = 7;

/// Word-at-a-time hash: each word is mixed in with a rotate, xor and multiply, and the
/// result folded through a 64x64->128 multiply so every bit of every word reaches the low
/// bits (the map's bucket index), the top 7 (its tag byte) and the 6 below (our shard
/// index).
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

fn hash_of<K: Hash>(k: &K) -> u64 {
    let mut h = WordHasher::default();
    k.hash(&mut h);
    h.finish()
}

/// A key with its hash, so the map does not hash it again.
#[derive(Clone, PartialEq, Eq)]
pub struct Hashed<K> {
    hash: u64,
    key: K,
}

impl<K> Hash for Hashed<K> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// Hands the precomputed hash through.
#[derive(Default, Clone, Copy)]
pub struct PassThrough;

pub struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn write(&mut self, _: &[u8]) {
        unreachable!("only Hashed keys go into these maps")
    }
    fn write_u64(&mut self, w: u64) {
        self.0 = w;
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

impl BuildHasher for PassThrough {
    type Hasher = PassThroughHasher;
    fn build_hasher(&self) -> PassThroughHasher {
        PassThroughHasher(0)
    }
}

pub type Shard<K, V> = HashMap<Hashed<K>, V, PassThrough>;

#[repr(align(128))]
struct Padded<T>(T);

/// One shard: its map behind its lock, alone on its cache line.
type Locked<K, V> = Padded<Mutex<Shard<K, V>>>;

pub struct Shards<K, V> {
    shards: Box<[Locked<K, V>]>,
}

impl<K: Hash + Eq + Clone, V> Default for Shards<K, V> {
    fn default() -> Self {
        Shards {
            shards: (0..SHARDS)
                .map(|_| Padded(Mutex::new(HashMap::with_hasher(PassThrough))))
                .collect(),
        }
    }
}

impl<K: Hash + Eq + Clone, V> Shards<K, V> {
    /// The key with its hash, and the shard it lives in.
    pub fn locate(&self, key: &K) -> (Hashed<K>, usize) {
        let hash = hash_of(key);
        // The bits just below the map's tag byte (the top 7): taken from the tag itself,
        // every key of a shard would carry one of two tags.
        let shard = (hash >> (64 - TAG_BITS - SHARD_BITS)) as usize & (SHARDS - 1);
        (
            Hashed {
                hash,
                key: key.clone(),
            },
            shard,
        )
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard<K, V>> {
        // Nothing panics while holding a shard (plain map operations).
        self.shards[shard]
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Run `f` on the value of `key` under its shard's lock; also returns the shard index.
    pub fn with<R>(&self, key: &K, f: impl FnOnce(Option<&V>) -> R) -> (R, usize) {
        let (k, shard) = self.locate(key);
        (f(self.lock(shard).get(&k)), shard)
    }

    pub fn get(&self, key: &K) -> Option<V>
    where
        V: Copy,
    {
        self.with(key, |v| v.copied()).0
    }

    pub fn contains(&self, key: &K) -> bool {
        self.with(key, |v| v.is_some()).0
    }

    pub fn insert(&self, key: K, value: V) -> Option<V> {
        let (k, shard) = self.locate(&key);
        self.lock(shard).insert(k, value)
    }

    /// Remove `key` if its value satisfies `pred`.
    pub fn remove_if(&self, key: &K, pred: impl FnOnce(&V) -> bool) -> Option<V> {
        let (k, shard) = self.locate(key);
        let mut m = self.lock(shard);
        if m.get(&k).is_some_and(pred) {
            m.remove(&k)
        } else {
            None
        }
    }

    /// Every shard locked, in order (for `fork()`: no shard may be held mid-update by a
    /// thread the child will not have).
    pub fn lock_all(&self) -> Vec<MutexGuard<'_, Shard<K, V>>> {
        (0..SHARDS).map(|i| self.lock(i)).collect()
    }

    /// Bytes of the maps' tables (an estimate of their metadata per entry).
    pub fn table_bytes(&self) -> usize {
        (0..SHARDS)
            .map(|i| self.lock(i).capacity() * (size_of::<(Hashed<K>, V)>() + 1))
            .sum()
    }
}

/// A counter split over cache lines, so that threads counting at once do not contend; the
/// caller picks the stripe (the hit path uses the shard index of its key).
pub struct Striped {
    cells: Box<[Padded<AtomicU64>]>,
}

impl Default for Striped {
    fn default() -> Self {
        Striped {
            cells: (0..SHARDS).map(|_| Padded(AtomicU64::new(0))).collect(),
        }
    }
}

impl Striped {
    pub fn add(&self, stripe: usize, n: u64) {
        self.cells[stripe % SHARDS].0.fetch_add(n, Relaxed);
    }

    pub fn load(&self) -> u64 {
        self.cells.iter().map(|c| c.0.load(Relaxed)).sum()
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

    #[test]
    fn page_aligned_keys_spread_over_shards_and_buckets() {
        let m: Shards<(usize, usize), u32> = Shards::default();
        let mut shards = std::collections::HashSet::new();
        let mut low = std::collections::HashSet::new();
        for i in 0..4096usize {
            let (k, s) = m.locate(&(0x7f00_0000_0000 + i * 8192, 4096));
            shards.insert(s);
            low.insert(k.hash & 0xfff);
        }
        assert_eq!(shards.len(), SHARDS);
        assert!(low.len() > 2000, "low bits take {} values", low.len());
    }

    /// The map's tag byte (the top 7 bits of the hash, hashbrown's `h2`) must still vary
    /// among the keys of one shard: were the shard index taken from those same bits, every
    /// key of a shard would carry one of two tags, and a lookup would compare keys against
    /// about half of each probed group instead of almost none.
    #[test]
    fn tags_vary_within_a_shard() {
        let m: Shards<(usize, usize), u32> = Shards::default();
        let mut tags = vec![std::collections::HashSet::new(); SHARDS];
        for i in 0..65536usize {
            let (k, s) = m.locate(&(0x7f00_0000_0000 + i * 8192, 4096));
            tags[s].insert(k.hash >> 57);
        }
        let fewest = tags.iter().map(|t| t.len()).min().unwrap();
        assert!(
            fewest > 100,
            "a shard's keys carry only {fewest} of 128 tags"
        );
    }

    #[test]
    fn map_operations() {
        let m: Shards<usize, u32> = Shards::default();
        assert_eq!(m.insert(8, 1), None);
        assert_eq!(m.get(&8), Some(1));
        assert_eq!(m.remove_if(&8, |&v| v == 2), None);
        assert!(m.contains(&8));
        assert_eq!(m.remove_if(&8, |_| true), Some(1));
        assert!(!m.contains(&8));
        let s = Striped::default();
        s.add(3, 2);
        s.add(70, 1);
        assert_eq!(s.load(), 3);
    }
}
