//! The lock-free lookups find candidates, not answers: a table word may be stale (its slot
//! reused since) or another key's (a tag collision). These tests plant such words and
//! check that nothing is handed out or released through them.

use super::state::{key_hash, mr_hash};
use super::*;
use std::cell::RefCell;

/// What `before_claim` runs.
type Window = Box<dyn FnOnce(u32)>;

thread_local! {
    /// Run once, on this thread, between a lock-free lookup's first look at a slot and its
    /// claim: what another thread might do in that window.
    static BEFORE_CLAIM: RefCell<Option<Window>> = const { RefCell::new(None) };
}

pub(super) fn before_claim(id: u32) {
    if let Some(f) = BEFORE_CLAIM.with(|h| h.borrow_mut().take()) {
        f(id);
    }
}

use super::test_fake::{Fake, LIMITS, idle_entry, req};

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

/// The lock-free lookup filters candidates on their range only before it claims one; a
/// slot of the same range under another PD, access or iova is claimed, compared in full,
/// and given back, never handed out.
#[test]
fn a_hit_through_a_word_of_the_same_range_under_another_key_hands_nothing_out() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let a = req(0x10_0000);
    let others = [
        Request { pd: 0x11, ..a },
        Request { access: 3, ..a },
        Request { iova: 0x4000, ..a },
    ];
    for b_req in others {
        let (b_ptr, o) = cache.acquire(&b_req).unwrap();
        assert_eq!(o, Outcome::Miss);
        assert_eq!(cache.release(b_ptr), Released::Kept);
        let b = cache.fast.by_mr(b_ptr).unwrap();
        // A word under A's hash naming B's slot, as a tag collision would leave.
        cache
            .fast
            .exact
            .insert(key_hash(&a), b, |i| cache.fast.slot_key_hash(i));
        let hits = cache.snapshot().counts[Counter::Hits];
        assert_eq!(cache.try_hit(&a), None, "A was served {b_req:?}");
        let s = cache.fast.slots.get(b).unwrap().load();
        assert_eq!(slots::refs(s), 0, "B kept a reference from the claim");
        assert_eq!(
            cache.snapshot().counts[Counter::Hits],
            hits,
            "the claim given back counted a hit"
        );
        // B itself still hits.
        assert_eq!(cache.try_hit(&b_req), Some(b_ptr));
        assert_eq!(cache.release(b_ptr), Released::Kept);
        assert!(
            cache
                .fast
                .exact
                .remove(key_hash(&a), b, |i| cache.fast.slot_key_hash(i))
        );
    }
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

/// A lookup of A meeting B's slot (a tag collision, or a word of a slot reused since) must
/// leave B alone: a claim taken on B, even for a moment, sets B's clock bit (a never-hit
/// entry then outlives the eviction hand), and while it stands a hit on B is refused the
/// provider's pointer (a shadow instead) and an eviction or `rereg` of B fails.
#[test]
fn a_lookup_through_another_keys_word_leaves_that_entry_untouched() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let (b, _) = idle_entry(&cache, 0x20_0000);
    let slot = cache.fast.slots.get(b).unwrap();
    // The eviction hand passes once: B's clock bit (set by its release) is cleared.
    assert!(!slot.clock_evict());
    let before = slot.load();
    let a = req(0x10_0000);
    cache
        .fast
        .exact
        .insert(key_hash(&a), b, |i| cache.fast.slot_key_hash(i));
    assert_eq!(cache.try_hit(&a), None);
    assert_eq!(slot.load(), before, "a lookup of A changed B's state word");
}

/// The slot a lookup found holding its key is reused for another key before the claim: the
/// claim lands on the other entry, and the comparison after it must notice.
#[test]
fn a_slot_reused_between_the_first_look_and_the_claim_hands_nothing_out() {
    // Leaked: the hook outlives this frame's borrows.
    let fake: &'static Fake = Box::leak(Box::new(Fake::default()));
    let cache: &'static Cache<&'static Fake> = Box::leak(Box::new(Cache::new(fake, LIMITS)));
    let a = req(0x10_0000);
    let (a_slot, _) = idle_entry(cache, a.addr);
    let b = req(0x20_0000);
    let b_ptr = std::rc::Rc::new(std::cell::Cell::new(0));
    let seen = b_ptr.clone();
    BEFORE_CLAIM.with(|h| {
        *h.borrow_mut() = Some(Box::new(move |id| {
            assert_eq!(id, a_slot);
            // Another thread: A is evicted, B is cached in A's slot, and left idle.
            let gone = cache
                .lock()
                .evict_idle(&cache.fast, |e| e.req.addr == a.addr);
            cache.deregister_all(&gone);
            let (h, o) = cache.acquire(&b).unwrap();
            assert_eq!(o, Outcome::Miss);
            assert_eq!(cache.fast.by_mr(h), Some(a_slot), "B reuses A's slot");
            assert_eq!(cache.release(h), Released::Kept);
            seen.set(h);
        }))
    });
    let got = cache.try_hit(&a);
    assert_ne!(b_ptr.get(), 0, "the window was reached");
    assert_eq!(got, None, "A was served B's registration");
    let s = cache.fast.slots.get(a_slot).unwrap().load();
    assert_eq!(
        slots::refs(s),
        0,
        "B kept a reference from the failed claim"
    );
}
