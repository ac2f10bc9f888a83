//! The lock-free lookups find candidates, not answers: a table word may be stale (its slot
//! reused since) or another key's (a tag collision). These tests plant such words and
//! check that nothing is handed out or released through them.

use super::state::{key_hash, mr_hash};
use super::*;
use std::sync::Mutex;

#[derive(Default)]
struct Fake {
    next: AtomicU64,
    deregistered: Mutex<Vec<usize>>,
}

impl Registrar for &Fake {
    fn register(&self, _: &Request) -> Result<Mr, i32> {
        Ok(Mr {
            ptr: 0x1000 * (1 + self.next.fetch_add(1, SeqCst) as usize),
            via_wrapper: false,
        })
    }
    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        self.deregistered.lock().unwrap().push(mr.ptr);
        Ok(())
    }
    fn alloc_shadow(&self) -> Option<usize> {
        None
    }
    fn fill_shadow(&self, _: usize, _: Mr, _: usize, _: usize) -> bool {
        false
    }
}

const LIMITS: Limits = Limits {
    max_entries: usize::MAX,
    max_bytes: u64::MAX,
    shadow: true,
    remote_superset: false,
};

fn req(addr: usize) -> Request {
    Request {
        pd: 0x10,
        context: 0x20,
        addr,
        len: 0x1000,
        iova: addr as u64,
        access: 1,
    }
}

/// Cache `req(addr)` and leave it idle; its slot id and provider pointer.
fn idle_entry(cache: &Cache<&Fake>, addr: usize) -> (u32, usize) {
    let (h, o) = cache.acquire(&req(addr)).unwrap();
    assert_eq!(o, Outcome::Miss);
    assert_eq!(cache.release(h), Released::Kept);
    (cache.fast.by_mr(h).unwrap(), h)
}

#[test]
fn a_hit_through_another_keys_word_hands_nothing_out() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let (b, b_ptr) = idle_entry(&cache, 0x20_0000);
    // A word under A's hash naming B's slot: what a lookup of A meets when B's slot was
    // A's until a moment ago, or when B's key shares A's tag and run.
    let a = req(0x10_0000);
    cache
        .fast
        .exact
        .insert(key_hash(&a), b, |i| cache.fast.slot_key_hash(i));
    let (h, o) = cache.acquire(&a).unwrap();
    assert_ne!(h, b_ptr, "A was served B's registration");
    assert_eq!(o, Outcome::Miss);
    let s = cache.fast.slots.get(b).unwrap().load();
    assert_eq!(
        slots::refs(s),
        0,
        "B kept a reference from the failed claim"
    );
    assert_eq!(
        cache.snapshot().counts[Counter::Hits],
        0,
        "the failed claim counted a hit"
    );
}

#[test]
fn a_release_through_another_pointers_word_releases_nothing() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let (h, _) = cache.acquire(&req(0x20_0000)).unwrap();
    let b = cache.fast.by_mr(h).unwrap();
    // A pointer the cache never handed out, whose hash leads to B's slot.
    let foreign = 0xdead_0000;
    cache
        .fast
        .by_mr
        .insert(mr_hash(foreign), b, |i| cache.fast.slot_mr_hash(i));
    assert_eq!(cache.release(foreign), Released::NotOurs);
    let s = cache.fast.slots.get(b).unwrap().load();
    assert_eq!(
        slots::holders(s),
        1,
        "B's holding was released by another pointer"
    );
    assert_eq!(cache.release(h), Released::Kept);
}

/// A lock-free claim on the wrong entry is given back after that entry died (invalidated
/// meanwhile): the give-back is its last reference. It takes no lock (`try_hit` promises
/// that), so the next drain removes and deregisters the entry.
#[test]
fn giving_back_a_claim_on_an_entry_that_died_meanwhile_deregisters_it() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let (b, b_ptr) = idle_entry(&cache, 0x20_0000);
    let slot = cache.fast.slots.get(b).unwrap();
    assert!(slot.claim_primary(false));
    cache.invalidate(0x20_0000, 0x20_1000);
    assert!(
        fake.deregistered.lock().unwrap().is_empty(),
        "claimed: kept"
    );
    cache.unclaim(b, slot);
    assert!(
        fake.deregistered.lock().unwrap().is_empty(),
        "without the lock"
    );
    cache.drain_pending();
    assert_eq!(*fake.deregistered.lock().unwrap(), vec![b_ptr]);
    assert_eq!(cache.snapshot().entries, 0);
}
