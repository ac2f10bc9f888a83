//! The registrations passed through to libibverbs, by the MR address libibverbs returned,
//! in a small lock-free table: their `ibv_dereg_mr` goes straight to libibverbs
//! (`take_passed`) instead of first asking the cache whether the handle is one of its own
//! (`release_at`: the state lock and four hash lookups, about 600 instructions a pair, most
//! of what a pass-through would cost beside libibverbs alone).
//!
//! Why a handle found here is libibverbs' and never the cache's: an address is recorded
//! when libibverbs returns that MR to the app (`note_foreign`), and taken out before its
//! `ibv_dereg_mr` reaches libibverbs (the only call that frees it), so while it is here no
//! other live object has that address. The one way to leave a stale address here is an MR
//! freed without our hook (or by a dereg nested in one of our hooks, a signal handler's,
//! which goes to libibverbs untouched); against that, an address is recorded once however
//! often it is noted, and every address the cache itself hands out (a
//! provider registration's MR, a shadow or grant slot) is forgotten here when the cache
//! gets it (`forget_passed`), so a cache handle is never taken for a pass-through.
//!
//! Full (more than `PROBES` live pass-throughs landing on one stretch): not recorded, and
//! that MR's deregistration takes the locked path (`release_at` answers `NotOurs`), as
//! every one did before. No lock, no allocation, no panic: called from the hooks.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// Slots of the table (a power of two).
const SLOTS: usize = 1024;
/// Slots looked at from an address's home slot.
const PROBES: usize = 8;
/// The low bit of a slot: this pass-through's deregistration is to be timed (an admission
/// sample, `note_passthrough_dereg`). MR objects are malloc'd, 8-byte aligned at least.
const TIMED: usize = 1;

pub(super) struct PassedSet {
    slots: Box<[AtomicUsize]>,
    /// Addresses recorded now: zero lets a cache that passes nothing through skip the
    /// table on every deregistration and every new handle.
    live: AtomicUsize,
}

impl Default for PassedSet {
    fn default() -> PassedSet {
        PassedSet {
            slots: (0..SLOTS).map(|_| AtomicUsize::new(0)).collect(),
            live: AtomicUsize::new(0),
        }
    }
}

impl PassedSet {
    fn home(ptr: usize) -> usize {
        ((ptr >> 3).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) & (SLOTS - 1)
    }

    fn probe(&self, ptr: usize) -> impl Iterator<Item = &AtomicUsize> {
        let home = Self::home(ptr);
        (0..PROBES).map(move |i| &self.slots[(home + i) & (SLOTS - 1)])
    }

    /// Record `ptr` (timed: its deregistration is an admission sample); false when it
    /// cannot be (not aligned, or its stretch of the table full).
    pub(super) fn insert(&self, ptr: usize, timed: bool) -> bool {
        if ptr == 0 || ptr & 7 != 0 {
            return false;
        }
        let word = ptr | if timed { TIMED } else { 0 };
        // Already here (left behind by an MR freed without our hooks, e.g. a dereg nested
        // in a hook, which goes to libibverbs untouched): one copy only, so that
        // `forget_all` can never leave one behind.
        for slot in self.probe(ptr) {
            let w = slot.load(Acquire);
            if w & !TIMED == ptr && slot.compare_exchange(w, word, AcqRel, Relaxed).is_ok() {
                return true;
            }
        }
        for slot in self.probe(ptr) {
            if slot.compare_exchange(0, word, AcqRel, Relaxed).is_ok() {
                self.live.fetch_add(1, AcqRel);
                return true;
            }
        }
        false
    }

    /// Take `ptr` out: Some(timed) if it was recorded.
    pub(super) fn take(&self, ptr: usize) -> Option<bool> {
        if ptr == 0 || self.live.load(Acquire) == 0 {
            return None;
        }
        for slot in self.probe(ptr) {
            let w = slot.load(Acquire);
            if w & !TIMED == ptr && slot.compare_exchange(w, 0, AcqRel, Relaxed).is_ok() {
                self.live.fetch_sub(1, AcqRel);
                return Some(w & TIMED != 0);
            }
        }
        None
    }
}

impl<R: Registrar> Cache<R> {
    /// `mr` is an MR libibverbs returned for a registration passed through (timed: an
    /// admission sample whose deregistration is timed too): its `ibv_dereg_mr` may skip
    /// the cache (`take_passed`).
    pub(super) fn note_passed(&self, mr: usize, timed: bool) {
        self.passed.insert(mr, timed);
    }

    /// `mr` is an MR libibverbs returned for a registration nested in one of the preload's
    /// calls (maybe under the cache's own lock on this thread): recorded lock-free, so its
    /// later `ibv_dereg_mr` goes to libibverbs (`take_passed`) even where a tombstone of a
    /// deregistered cache MR at the same address would refuse it. No lock, no allocation.
    pub fn note_nested_mr(&self, mr: usize) {
        self.note_passed(mr, false);
    }

    /// The app's `ibv_dereg_mr(mr)`, asked before the cache's own `release_at`: Some when
    /// `mr` is a registration passed through to libibverbs (taken out: the caller hands it
    /// to libibverbs; `Some(true)`: time that and report it, `note_passthrough_dereg`);
    /// None: ask `release_at`.
    pub fn take_passed(&self, mr: usize) -> Option<bool> {
        self.passed.take(mr)
    }

    /// The cache got `ptr` as a handle of its own (a provider registration's MR, a shadow
    /// or grant slot): not a pass-through's, whatever an MR freed behind our hooks left.
    pub(super) fn forget_passed(&self, ptr: usize) {
        // Every copy (insert keeps one, but a copy may race in between): bounded by the
        // slots an address can occupy.
        for _ in 0..PROBES {
            if self.passed.take(ptr).is_none() {
                break;
            }
        }
    }

    /// `forget_passed`, then `ptr` (a grant or shadow slot the registrar just gave).
    pub(super) fn mine(&self, ptr: usize) -> usize {
        self.forget_passed(ptr);
        ptr
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::test_fake::{Fake, LIMITS};

    fn req(addr: usize, access: u32) -> Request {
        Request {
            pd: 0x10,
            context: 0x20,
            addr,
            len: 65536,
            iova: addr as u64,
            access,
        }
    }

    /// A pass-through's MR is answered once by `take_passed`; an address left behind (an
    /// MR freed without our hook) that the cache then gets as its own registration is
    /// never taken for a pass-through: that handle's release is the cache's.
    #[test]
    fn a_cache_handle_at_a_left_behind_address_is_never_a_pass_through() {
        let fake = Fake::default();
        let cache = Cache::new(&fake, LIMITS);
        cache.note_foreign(0x9000);
        assert_eq!(cache.take_passed(0x9000), Some(false));
        assert_eq!(cache.take_passed(0x9000), None, "taken once");
        // The fake's first registration is 0x1000: left behind here as a pass-through's.
        cache.note_foreign(0x1000);
        let (h, o) = cache.acquire(&req(0x10_0000, 1)).unwrap();
        assert_eq!((h, o), (0x1000, Outcome::Miss));
        assert_eq!(
            cache.take_passed(h),
            None,
            "the cache's own handle {h:#x} taken for a pass-through's"
        );
        assert_eq!(cache.release(h), Released::Kept);
    }

    /// Two MRs at one address freed behind our hooks (a nested
    /// `ibv_dereg_mr`, e.g. from a signal handler inside a hook, passes through without
    /// `take_passed`), each noted: `insert` does not look for the address already there, so
    /// the table holds it twice, and `forget_passed` takes only one. The cache's own MR
    /// that then lands at that address is answered as a pass-through: the dereg hook would
    /// hand the cached registration straight to libibverbs while the cache keeps it.
    #[test]
    fn a_twice_left_behind_address_is_forgotten_whole() {
        let fake = Fake::default();
        let cache = Cache::new(&fake, LIMITS);
        cache.note_foreign(0x1000); // pass-through A at 0x1000, freed behind the hooks
        cache.note_foreign(0x1000); // pass-through B at 0x1000, freed behind the hooks
        let (h, o) = cache.acquire(&req(0x10_0000, 1)).unwrap();
        assert_eq!((h, o), (0x1000, Outcome::Miss));
        assert_eq!(
            cache.take_passed(h),
            None,
            "the cache's own handle {h:#x} taken for a pass-through's"
        );
    }

    /// An admission sample of a remote class: its deregistration is timed as well.
    #[test]
    fn a_timed_remote_pass_through_is_marked_timed() {
        let fake = Fake::default();
        let cache = Cache::new(&fake, LIMITS).with_remote(RemoteMode::Revoke);
        let r = req(0x10_0000, 1 | access::REMOTE_WRITE);
        cache.note_foreign(0x7000);
        cache.note_passthrough(&r, 0x7000, 50_000);
        assert_eq!(cache.take_passed(0x7000), Some(true));
        cache.note_passthrough_dereg(0x7000, 40_000, true);
        assert!(!cache.passed_through(0x7000));
    }

    #[test]
    fn an_address_is_taken_once_with_its_timing() {
        let s = PassedSet::default();
        assert_eq!(s.take(0x1000), None);
        assert!(s.insert(0x1000, false));
        assert!(s.insert(0x2000, true));
        assert_eq!(s.take(0x2000), Some(true));
        assert_eq!(s.take(0x1000), Some(false));
        assert_eq!(s.take(0x1000), None);
        assert_eq!(s.live.load(Relaxed), 0);
    }

    #[test]
    fn a_full_stretch_refuses_and_nothing_is_lost() {
        let s = PassedSet::default();
        // Addresses with one home slot: PROBES fit, the next does not.
        let home = PassedSet::home(0x10_0000);
        let same: Vec<usize> = (1..1_000_000usize)
            .map(|i| 0x10_0000 + i * 8)
            .filter(|&p| PassedSet::home(p) == home)
            .take(PROBES + 1)
            .collect();
        assert_eq!(same.len(), PROBES + 1);
        for &p in &same[..PROBES] {
            assert!(s.insert(p, false));
        }
        assert!(!s.insert(same[PROBES], false));
        assert!(
            !s.insert(0x1001, false),
            "an unaligned address is not recorded"
        );
        for &p in &same[..PROBES] {
            assert_eq!(s.take(p), Some(false));
        }
        assert_eq!(s.take(same[PROBES]), None);
    }
}
