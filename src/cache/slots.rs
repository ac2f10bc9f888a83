//! Entry slots the hit path reads without the cache lock: each entry's reference counts
//! and flags are one atomic word, so a hit and its release are one compare-and-swap each.
//! Every change of that word (by the hit path or under the cache lock) is atomic.
//!
//! Slots live in chunks that are allocated once and never freed, so a slot id from a map
//! stays a valid address. A slot is reused only after its id left both maps (under their
//! shard locks), and the hit path acts on a slot only under the shard lock of the map it
//! found the id in, so it never acts on a slot that was reused meanwhile.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

const CHUNK_BITS: u32 = 10;
const CHUNK: usize = 1 << CHUNK_BITS;
const CHUNKS: usize = 4096;
/// The most entries a cache holds at once (4,096 chunks of 1,024 slots).
pub const MAX_SLOTS: usize = CHUNKS * CHUNK;

/// One reference (any holder: the provider's pointer, a shadow, a granted key).
const REF: u64 = 1;
const REFS: u64 = (1 << 24) - 1;
/// One holder of the provider's own pointer (also counted in the references).
const HOLDER: u64 = 1 << 24;
const HOLDERS: u64 = REFS << 24;
/// Out of the lookup maps: never claimed again; deregistered at the last release.
pub const DEAD: u64 = 1 << 48;
/// The clock bit of the approximate LRU: released since the eviction hand last passed.
const USED: u64 = 1 << 49;
/// Registered without remote rights: every holder needs a grant (the locked path).
pub const REVOCABLE: u64 = 1 << 50;

pub fn refs(s: u64) -> u64 {
    s & REFS
}

pub fn holders(s: u64) -> u64 {
    (s & HOLDERS) >> 24
}

pub fn dead(s: u64) -> bool {
    s & DEAD != 0
}

#[derive(Default)]
pub struct Slot {
    pub state: AtomicU64,
    /// The provider's `ibv_mr *` (what a hit on the primary pointer hands out).
    pub mr: AtomicUsize,
}

impl Slot {
    fn update(&self, f: impl Fn(u64) -> Option<u64>) -> Result<u64, u64> {
        self.state.fetch_update(AcqRel, Acquire, f)
    }

    /// A new entry held once: by the provider's pointer, or (revocable) by a grant.
    pub fn reset(&self, mr: usize, revocable: bool) {
        self.mr.store(mr, Relaxed);
        let s = if revocable {
            REF | REVOCABLE
        } else {
            REF | HOLDER
        };
        self.state.store(s, Release);
    }

    /// Hand out the provider's pointer: when nobody holds it, or (`share`, shadows off)
    /// also when somebody does. False: dead, revocable, or held and not shared.
    pub fn claim_primary(&self, share: bool) -> bool {
        self.update(|s| {
            let ok = s & (DEAD | REVOCABLE) == 0
                && refs(s) < REFS
                && holders(s) < REFS
                && (holders(s) == 0 || share);
            ok.then_some(s + REF + HOLDER)
        })
        .is_ok()
    }

    /// One more reference that is not the provider's pointer (a shadow or a grant).
    pub fn claim_other(&self) -> bool {
        self.update(|s| (s & DEAD == 0 && refs(s) < REFS).then_some(s + REF))
            .is_ok()
    }

    /// Give back one holding of the provider's pointer; the previous state. `Err`: nobody
    /// holds it (a second release), or `last_dead` is false and this is the last reference
    /// of a dead entry (the caller must take the locked path, which deregisters it).
    pub fn release_primary(&self, last_dead: bool) -> Result<u64, u64> {
        self.update(|s| {
            let last = refs(s) == 1;
            let ok = holders(s) > 0 && refs(s) > 0 && (last_dead || !(last && dead(s)));
            ok.then(|| (s - REF - HOLDER) | if last { USED } else { 0 })
        })
    }

    /// Give back one other reference; the previous state.
    pub fn release_other(&self) -> u64 {
        match self
            .update(|s| (refs(s) > 0).then(|| (s - REF) | if refs(s) == 1 { USED } else { 0 }))
        {
            Ok(s) | Err(s) => s,
        }
    }

    /// Mark dead; the previous state.
    pub fn kill(&self) -> u64 {
        self.state.fetch_or(DEAD, AcqRel)
    }

    /// Mark dead if nobody holds it.
    pub fn kill_if_idle(&self) -> bool {
        self.update(|s| (s & DEAD == 0 && refs(s) == 0).then_some(s | DEAD))
            .is_ok()
    }

    /// Mark dead if the only reference is one holding of the provider's pointer.
    pub fn kill_if_sole(&self) -> bool {
        self.update(|s| (s & DEAD == 0 && refs(s) == 1 && holders(s) == 1).then_some(s | DEAD))
            .is_ok()
    }

    /// The eviction hand passes: an idle entry used since the last pass loses its clock bit
    /// and stays; one not used is marked dead (true: the caller evicts it).
    pub fn clock_evict(&self) -> bool {
        let s = self.state.load(Acquire);
        if s & DEAD != 0 || refs(s) != 0 {
            return false;
        }
        if s & USED != 0 {
            self.state.fetch_and(!USED, AcqRel);
            return false;
        }
        self.kill_if_idle()
    }

    pub fn load(&self) -> u64 {
        self.state.load(Acquire)
    }
}

pub struct Slots {
    chunks: Box<[OnceLock<Box<[Slot]>>]>,
}

impl Default for Slots {
    fn default() -> Self {
        Slots {
            chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect(),
        }
    }
}

impl Slots {
    pub fn get(&self, id: u32) -> Option<&Slot> {
        let id = id as usize;
        self.chunks
            .get(id >> CHUNK_BITS)?
            .get()?
            .get(id & (CHUNK - 1))
    }

    /// Slot `id`, its chunk allocated if need be; None beyond `MAX_SLOTS`.
    pub fn ensure(&self, id: u32) -> Option<&Slot> {
        let id = id as usize;
        let chunk = self.chunks.get(id >> CHUNK_BITS)?;
        chunk
            .get_or_init(|| (0..CHUNK).map(|_| Slot::default()).collect())
            .get(id & (CHUNK - 1))
    }

    /// Bytes of slot memory allocated.
    pub fn bytes(&self) -> usize {
        self.chunks.iter().filter(|c| c.get().is_some()).count() * CHUNK * size_of::<Slot>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_and_releases() {
        let s = Slot::default();
        s.reset(0x40, false);
        assert!(!s.claim_primary(false), "held, shadows on");
        assert!(s.claim_primary(true), "held, shared");
        assert_eq!(holders(s.load()), 2);
        assert!(s.release_primary(false).is_ok());
        assert!(s.release_primary(false).is_ok());
        assert!(s.release_primary(false).is_err(), "second release");
        assert!(!s.clock_evict(), "used since the last pass");
        assert!(s.clock_evict());
        assert!(!s.claim_primary(true), "dead");
        s.reset(0x40, false);
        s.kill();
        assert!(
            s.release_primary(false).is_err(),
            "last reference of a dead entry"
        );
        assert_eq!(refs(s.release_primary(true).unwrap()), 1);
        s.reset(0x80, true);
        assert!(!s.claim_primary(true), "revocable");
        assert!(s.claim_other());
        assert_eq!(refs(s.release_other()), 2);
        assert!(!s.kill_if_sole());
    }
}
