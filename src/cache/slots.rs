//! Entry slots the hit path reads without the cache lock: each entry's reference counts,
//! flags and generation are one atomic word, so a hit and its release are one
//! compare-and-swap each; the slot also carries the entry's request and provider MR, so
//! that a lookup can check what it found (one cache line per slot).
//!
//! Slots live in chunks that are allocated once and never freed, so a slot id from a table
//! stays a valid address. A slot is reused only once dead and unreferenced, and every reuse
//! bumps its generation, which never wraps: a slot that reached its last generation is
//! retired (never reused). So a state word, once replaced by a reuse, never comes back, and
//! a lock-free hit or release that swaps exactly the state word it read before checking the
//! slot's key or MR pointer acts on the entry it checked (no compare after the claim).
//! The request fields and flags are written under the cache lock only, by `reset`.

use super::types::{Mr, Request};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

const CHUNK_BITS: u32 = 10;
const CHUNK: usize = 1 << CHUNK_BITS;
const CHUNKS: usize = 4096;
/// The most entries a cache holds at once (4,096 chunks of 1,024 slots).
const MAX_SLOTS: usize = CHUNKS * CHUNK;
const _: () = assert!(MAX_SLOTS < 1 << super::table::ID_BITS);

/// One reference (any holder: the provider's pointer, a shadow, a granted key): 12 bits,
/// 4,095 at once (a claim beyond that fails: the lock-free hit takes the locked path, which
/// passes the call through, `Bypass::Saturated`).
const REF: u64 = 1;
const REFS: u64 = (1 << 12) - 1;
/// One holder of the provider's own pointer (also counted in the references).
const HOLDER: u64 = 1 << 12;
const HOLDERS: u64 = REFS << 12;
/// Out of the lookup tables: never claimed again; deregistered at the last release.
pub(crate) const DEAD: u64 = 1 << 24;
/// The clock bit of the approximate LRU: released since the eviction hand last passed.
const USED: u64 = 1 << 25;
/// Registered without remote rights: every holder needs a grant (the locked path).
pub(crate) const REVOCABLE: u64 = 1 << 26;
/// The generation: 23 bits, bumped at each reuse of the slot; a slot whose generation is
/// the last (`GENS`) is retired when its entry goes (after 8,388,607 reuses).
const GEN: u64 = 1 << 27;
pub(crate) const LAST_GENERATION: u64 = (1 << 23) - 1;
const GENS: u64 = LAST_GENERATION * GEN;
/// Lock-free hits counted in the slot itself (the claim's own compare-and-swap counts
/// them, no shared counter is written), a statistic nothing decides on: the top 14 bits,
/// so that the claim that finds the field full carries out of the word, which empties it,
/// and its caller adds `HITS_FLUSHED` to the cache's counter (one add and its carry, no
/// compare).
const HIT: u64 = 1 << 50;
const HITS: u64 = !0 << 50;
pub(crate) const HITS_FLUSHED: u64 = 1 << 14;

/// `Slot::flags`: the slot holds an entry (live or dead).
const PRESENT: u32 = 1;
/// The entry is in the range index and the exact-key table.
const INDEXED: u32 = 2;
/// `Mr::via_wrapper`.
const VIA_WRAPPER: u32 = 4;

pub(crate) fn refs(s: u64) -> u64 {
    s & REFS
}

pub(crate) fn holders(s: u64) -> u64 {
    (s & HOLDERS) >> HOLDERS.trailing_zeros()
}

pub(crate) fn dead(s: u64) -> bool {
    s & DEAD != 0
}

/// Hits counted in the slot and not yet flushed to the cache's counter.
pub(crate) fn hits(s: u64) -> u64 {
    s >> HITS.trailing_zeros()
}

#[derive(Default)]
#[repr(align(64))]
pub(crate) struct Slot {
    pub(crate) state: AtomicU64,
    /// The provider's `ibv_mr *` (what a hit on the primary pointer hands out).
    mr: AtomicUsize,
    pd: AtomicUsize,
    context: AtomicUsize,
    addr: AtomicUsize,
    len: AtomicUsize,
    iova: AtomicU64,
    access: AtomicU32,
    flags: AtomicU32,
}

impl Slot {
    fn update(&self, f: impl Fn(u64) -> Option<u64>) -> Result<u64, u64> {
        self.state.fetch_update(AcqRel, Acquire, f)
    }

    /// A new entry in this slot (cache lock held), held once: by the provider's pointer,
    /// or (revocable) by a grant. The slot must be free (dead and unreferenced, or new).
    pub(crate) fn reset(&self, req: &Request, mr: Mr, revocable: bool) {
        self.mr.store(mr.ptr, Relaxed);
        self.pd.store(req.pd, Relaxed);
        self.context.store(req.context, Relaxed);
        self.addr.store(req.addr, Relaxed);
        self.len.store(req.len, Relaxed);
        self.iova.store(req.iova, Relaxed);
        self.access.store(req.access, Relaxed);
        let wrapper = if mr.via_wrapper { VIA_WRAPPER } else { 0 };
        self.flags.store(PRESENT | INDEXED | wrapper, Relaxed);
        // The hits counted here stay (`Cache::snapshot` adds every slot's). A retired slot
        // is never reset (`State::remove` keeps it off the free list): the generation only
        // grows, so no state word of an earlier entry comes back.
        let old = self.state.load(Relaxed);
        debug_assert!(old & GENS != GENS, "a retired slot was reset");
        let generation = ((old & GENS) + GEN) | (old & HITS);
        let s = if revocable {
            REF | REVOCABLE
        } else {
            REF | HOLDER
        };
        // Release: whoever reads this state word sees the fields above.
        self.state.store(generation | s, Release);
    }

    /// The request this slot was last reset with (stable while the caller holds a
    /// reference or the cache lock).
    #[inline]
    pub(crate) fn request(&self) -> Request {
        Request {
            pd: self.pd.load(Relaxed),
            context: self.context.load(Relaxed),
            addr: self.addr.load(Relaxed),
            len: self.len.load(Relaxed),
            iova: self.iova.load(Relaxed),
            access: self.access.load(Relaxed),
        }
    }

    pub fn mr(&self) -> Mr {
        Mr {
            ptr: self.mr.load(Relaxed),
            via_wrapper: self.flags.load(Relaxed) & VIA_WRAPPER != 0,
        }
    }

    #[inline(always)]
    pub(crate) fn mr_ptr(&self) -> usize {
        self.mr.load(Relaxed)
    }

    /// Whether the slot was reset for exactly this key (everything but the context).
    #[inline(always)]
    pub(crate) fn has_key(&self, r: &Request) -> bool {
        self.addr.load(Relaxed) == r.addr
            && self.len.load(Relaxed) == r.len
            && self.pd.load(Relaxed) == r.pd
            && self.access.load(Relaxed) == r.access
            && self.iova.load(Relaxed) == r.iova
    }

    /// Live and held as often as it can count (`REFS`): the one reason a claim on a live
    /// entry fails.
    pub(crate) fn saturated(&self) -> bool {
        let s = self.state.load(Acquire);
        s & DEAD == 0 && refs(s) == REFS
    }

    /// At its last generation: once its entry is gone the slot is never reused.
    pub(crate) fn retired(&self) -> bool {
        self.state.load(Relaxed) & GENS == GENS
    }

    /// The lock-free hit's look: the state word, if the slot holds exactly this key. The
    /// fields are read after the state word (Acquire: they are at least those `reset`
    /// published with it); they may also be those of a reset under way since, which
    /// `claim_seen` then refuses (a reset follows a kill, which changed the word).
    #[inline(always)]
    pub(crate) fn look(&self, r: &Request) -> Option<u64> {
        let s = self.state.load(Acquire);
        self.has_key(r).then_some(s)
    }

    /// Tests: stand for reuses the test does not make one by one.
    #[cfg(test)]
    pub(crate) fn set_generation(&self, generation: u64) {
        let s = self.state.load(Relaxed);
        self.state
            .store(s & !GENS | (generation * GEN) & GENS, Relaxed);
    }

    pub(crate) fn present(&self) -> bool {
        self.flags.load(Relaxed) & PRESENT != 0
    }

    pub(crate) fn indexed(&self) -> bool {
        self.flags.load(Relaxed) & INDEXED != 0
    }

    /// Out of the range index and the exact-key table (cache lock held).
    pub(crate) fn set_unindexed(&self) {
        self.flags.fetch_and(!INDEXED, Relaxed);
    }

    /// The entry is gone (cache lock held): the slot may be reset.
    pub(crate) fn set_absent(&self) {
        self.flags.store(0, Relaxed);
    }

    /// Hand out the provider's pointer: when nobody holds it, or (`share`, shadows off)
    /// also when somebody does. False: dead, revocable, or held and not shared.
    pub(crate) fn claim_primary(&self, share: bool) -> bool {
        self.update(|s| {
            let ok = s & (DEAD | REVOCABLE) == 0
                && refs(s) < REFS
                && holders(s) < REFS
                && (holders(s) == 0 || share);
            ok.then_some(s + REF + HOLDER)
        })
        .is_ok()
    }

    /// `claim_primary` for the lock-free hit path, on the entry `look` saw (`seen`),
    /// counting the hit in the slot: the hits to add to the cache's counter (0, or
    /// `HITS_FLUSHED` when the field was full). The swap succeeds only from a word of the
    /// same generation, so on the entry whose key `look` compared (a reuse changes the
    /// generation for good); None when the slot was reused since, or cannot be claimed.
    /// The swap releases what this thread read of the slot to whoever changes the word
    /// next, so no later reset's field writes can have been what `look` read.
    #[inline(always)]
    pub(crate) fn claim_seen(&self, seen: u64, share: bool) -> Option<u64> {
        let mut s = seen;
        loop {
            // `holders <= refs`, so the references' bound covers the holders'.
            let ok = s & (DEAD | REVOCABLE) == 0 && refs(s) < REFS && (share || holders(s) == 0);
            if !ok {
                return None;
            }
            let (counted, full) = s.overflowing_add(HIT);
            let flushed = if full { HITS_FLUSHED } else { 0 };
            match self
                .state
                .compare_exchange_weak(s, counted + REF + HOLDER, AcqRel, Relaxed)
            {
                Ok(_) => return Some(flushed),
                Err(now) if now & GENS == seen & GENS => s = now,
                Err(_) => return None,
            }
        }
    }

    /// One more reference that is not the provider's pointer (a shadow or a grant).
    pub(crate) fn claim_other(&self) -> bool {
        self.update(|s| (s & DEAD == 0 && refs(s) < REFS).then_some(s + REF))
            .is_ok()
    }

    /// Give back one holding of the provider's pointer; the previous state. `Err`: nobody
    /// holds it (a second release), or `last_dead` is false and this is the last reference
    /// of a dead entry (the caller must take the locked path, which deregisters it).
    pub(crate) fn release_primary(&self, last_dead: bool) -> Result<u64, u64> {
        self.update(|s| {
            let last = refs(s) == 1;
            let ok = holders(s) > 0 && refs(s) > 0 && (last_dead || !(last && dead(s)));
            ok.then(|| (s - REF - HOLDER) | if last { USED } else { 0 })
        })
    }

    /// The lock-free release: give back one holding of the provider's pointer if this slot
    /// holds `ptr` and this is not the last reference of a dead entry.
    #[inline(always)]
    pub(crate) fn release_if_mr(&self, ptr: usize) -> bool {
        let mut s = self.state.load(Acquire);
        loop {
            let last = refs(s) == 1;
            if holders(s) == 0 || refs(s) == 0 || (last && dead(s)) {
                return false;
            }
            // Stable while the state word is `s`: a slot with holders is not reset, and a
            // reset after a last release changes the generation.
            if self.mr.load(Relaxed) != ptr {
                return false;
            }
            let new = (s - REF - HOLDER) | if last { USED } else { 0 };
            match self.state.compare_exchange_weak(s, new, AcqRel, Acquire) {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
    }

    /// Give back one other reference; the previous state.
    pub(crate) fn release_other(&self) -> u64 {
        match self
            .update(|s| (refs(s) > 0).then(|| (s - REF) | if refs(s) == 1 { USED } else { 0 }))
        {
            Ok(s) | Err(s) => s,
        }
    }

    /// Mark dead; the previous state.
    pub(crate) fn kill(&self) -> u64 {
        self.state.fetch_or(DEAD, AcqRel)
    }

    /// Mark dead if nobody holds it.
    pub(crate) fn kill_if_idle(&self) -> bool {
        self.update(|s| (s & DEAD == 0 && refs(s) == 0).then_some(s | DEAD))
            .is_ok()
    }

    /// Mark dead if the only reference is one holding of the provider's pointer, whether
    /// or not the entry is dead already (its memory went away while it was held: the
    /// holder may still take it for `ibv_rereg_mr`).
    pub(crate) fn kill_if_sole(&self) -> bool {
        self.update(|s| (refs(s) == 1 && holders(s) == 1).then_some(s | DEAD))
            .is_ok()
    }

    /// Mark dead if the only reference is one other than the provider's pointer (a grant
    /// or a shadow), dead already or not: its holder takes it for `ibv_rereg_mr`.
    /// The previous state, or None when others hold it too.
    pub(crate) fn kill_if_sole_other(&self) -> Option<u64> {
        self.update(|s| (refs(s) == 1 && holders(s) == 0).then_some(s | DEAD))
            .ok()
    }

    /// Undo `kill_if_sole_other` (cache lock held): the provider refused the rereg, the
    /// entry is as it was. Only for an entry that was not dead before and is still indexed
    /// (not invalidated meanwhile).
    pub(crate) fn revive(&self) {
        self.state.fetch_and(!DEAD, AcqRel);
    }

    /// The eviction hand passes: an idle entry used since the last pass loses its clock bit
    /// and stays; one not used is marked dead (true: the caller evicts it).
    pub(crate) fn clock_evict(&self) -> bool {
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

    /// `clock_evict` without the eviction: true for an idle entry not used since the last
    /// pass (the caller then evicts it with `kill_if_idle`, or keeps it).
    pub(crate) fn clock_idle(&self) -> bool {
        let s = self.state.load(Acquire);
        if s & DEAD != 0 || refs(s) != 0 {
            return false;
        }
        if s & USED != 0 {
            self.state.fetch_and(!USED, AcqRel);
            return false;
        }
        true
    }

    /// The clock bit: released since the eviction hand last passed.
    pub(crate) fn used(&self) -> bool {
        self.state.load(Acquire) & USED != 0
    }

    pub(crate) fn load(&self) -> u64 {
        self.state.load(Acquire)
    }
}

/// Fixed-size arrays: the hit path's bounds checks compare with constants, not loaded
/// lengths.
pub(crate) struct Slots {
    chunks: Box<[OnceLock<Box<[Slot; CHUNK]>>; CHUNKS]>,
}

impl Default for Slots {
    fn default() -> Self {
        let chunks: Box<[OnceLock<Box<[Slot; CHUNK]>>]> =
            (0..CHUNKS).map(|_| OnceLock::new()).collect();
        Slots {
            chunks: chunks.try_into().unwrap_or_else(|_| unreachable!()),
        }
    }
}

impl Slots {
    #[inline(always)]
    pub fn get(&self, id: u32) -> Option<&Slot> {
        let id = id as usize;
        self.chunks
            .get(id >> CHUNK_BITS)?
            .get()?
            .get(id & (CHUNK - 1))
    }

    /// Slot `id`, its chunk allocated if need be; None beyond `MAX_SLOTS`.
    pub(crate) fn ensure(&self, id: u32) -> Option<&Slot> {
        let id = id as usize;
        let chunk = self.chunks.get(id >> CHUNK_BITS)?;
        chunk
            .get_or_init(|| {
                let c: Box<[Slot]> = (0..CHUNK).map(|_| Slot::default()).collect();
                c.try_into().unwrap_or_else(|_| unreachable!())
            })
            .get(id & (CHUNK - 1))
    }

    /// Hits counted in the slots and not yet flushed (see `HITS_FLUSHED`).
    pub(crate) fn hits(&self) -> u64 {
        self.chunks
            .iter()
            .filter_map(OnceLock::get)
            .flat_map(|c| c.iter())
            .map(|s| hits(s.load()))
            .sum()
    }

    /// Bytes of slot memory allocated.
    pub fn bytes(&self) -> usize {
        self.chunks.iter().filter(|c| c.get().is_some()).count() * CHUNK * size_of::<Slot>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim_hit(s: &Slot, r: &Request, share: bool) -> Option<u64> {
        s.look(r).and_then(|seen| s.claim_seen(seen, share))
    }

    fn request() -> Request {
        Request {
            pd: 1,
            context: 2,
            addr: 0x1000,
            len: 0x1000,
            iova: 0x1000,
            access: 1,
        }
    }

    #[test]
    fn claims_and_releases() {
        let s = Slot::default();
        let r = request();
        let mr = |ptr| Mr {
            ptr,
            via_wrapper: false,
        };
        s.reset(&r, mr(0x40), false);
        assert!(!s.claim_primary(false), "held, shadows on");
        assert!(s.claim_primary(true), "held, shared");
        assert_eq!(holders(s.load()), 2);
        assert!(s.release_primary(false).is_ok());
        assert!(s.release_primary(false).is_ok());
        assert!(s.release_primary(false).is_err(), "second release");
        assert!(!s.clock_evict(), "used since the last pass");
        assert!(s.clock_evict());
        assert!(!s.claim_primary(true), "dead");
        s.reset(&r, mr(0x40), false);
        s.kill();
        assert!(
            s.release_primary(false).is_err(),
            "last reference of a dead entry"
        );
        assert_eq!(refs(s.release_primary(true).unwrap()), 1);
        let before = s.load();
        s.reset(&r, mr(0x80), true);
        assert_ne!(
            s.load() & GENS,
            before & GENS,
            "a reuse bumps the generation"
        );
        assert!(!s.claim_primary(true), "revocable");
        assert!(s.claim_other());
        assert_eq!(refs(s.release_other()), 2);
        assert!(!s.kill_if_sole());
    }

    #[test]
    fn lock_free_release_checks_the_pointer() {
        let s = Slot::default();
        let r = request();
        s.reset(
            &r,
            Mr {
                ptr: 0x40,
                via_wrapper: true,
            },
            false,
        );
        assert!(s.has_key(&r) && s.mr().via_wrapper && s.present() && s.indexed());
        assert!(!s.release_if_mr(0x80), "another pointer");
        assert!(s.claim_primary(true));
        assert!(s.release_if_mr(0x40));
        s.kill();
        assert!(!s.release_if_mr(0x40), "last reference of a dead entry");
        assert!(s.release_primary(true).is_ok());
        assert!(!s.release_if_mr(0x40), "nobody holds it");
    }

    #[test]
    fn lock_free_hits_are_counted_in_the_slot_and_flushed_when_full() {
        let s = Slot::default();
        let r = request();
        let mr = Mr {
            ptr: 0x40,
            via_wrapper: false,
        };
        s.reset(&r, mr, false);
        assert!(s.release_if_mr(0x40));
        let generation = s.load() & GENS;
        let mut flushed = 0;
        for _ in 0..HITS_FLUSHED + 5 {
            flushed += claim_hit(&s, &r, false).unwrap();
            assert!(s.release_if_mr(0x40));
        }
        assert_eq!(flushed, HITS_FLUSHED);
        assert_eq!(
            s.load() & GENS,
            generation,
            "the flush touched the generation"
        );
        assert_eq!(hits(s.load()), 5);
        assert_eq!(refs(s.load()), 0);
        assert!(claim_hit(&s, &r, false).is_some());
        assert!(claim_hit(&s, &r, false).is_none(), "held, not shared");
        s.kill();
        assert!(claim_hit(&s, &r, true).is_none(), "dead");
        assert!(s.release_primary(true).is_ok());
        s.reset(&r, mr, false);
        assert_eq!(hits(s.load()), 6, "a reuse keeps the slot's count");
    }
}
