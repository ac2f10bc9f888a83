//! The lock-free lookups find candidates, not answers: a table word may be stale (its slot
//! reused since) or another key's (a tag collision). These tests plant such words and
//! check that nothing is handed out or released through them.

use crate::cache::state::{key_hash, mr_hash};
use crate::cache::*;
use std::cell::RefCell;

/// What `before_claim` runs.
type Window = Box<dyn FnOnce(u32)>;

thread_local! {
    /// Run once, on this thread, between a lock-free lookup's first look at a slot and its
    /// claim: what another thread might do in that window.
    static BEFORE_CLAIM: RefCell<Option<Window>> = const { RefCell::new(None) };
}

pub(in crate::cache) fn before_claim(id: u32) {
    if let Some(f) = BEFORE_CLAIM.with(|h| h.borrow_mut().take()) {
        f(id);
    }
}

use super::fake::{Fake, LIMITS, idle_entry, req};

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

/// The lock-free lookup compares the whole key before it claims: a slot of the same range
/// under another PD, access or iova is neither handed out nor claimed (its state word is
/// left as it was).
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
        let before = cache.fast.slots.get(b).unwrap().load();
        assert_eq!(cache.try_hit(&a), None, "A was served {b_req:?}");
        let s = cache.fast.slots.get(b).unwrap().load();
        assert_eq!(
            s, before,
            "B's state word was touched: claimed for {b_req:?}"
        );
        assert_eq!(
            cache.snapshot().counts[Counter::Hits],
            hits,
            "the lookup counted a hit"
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

/// A slot's generation must never repeat: a lock-free hit swaps exactly the state word it
/// read before comparing the key, so a slot reused until its generation wrapped back to the
/// one seen, its new entry idle as the old one was, would hand that entry out for the old
/// key. The slot is retired at its last generation instead. Reuses that do not reach the
/// last generation are stood for by `set_generation`.
#[test]
fn a_slot_is_retired_at_its_last_generation_so_no_state_word_comes_back() {
    let fake: &'static Fake = Box::leak(Box::new(Fake::default()));
    let cache: &'static Cache<&'static Fake> = Box::leak(Box::new(Cache::new(fake, LIMITS)));
    let a = req(0x10_0000);
    let (x, _) = idle_entry(cache, a.addr);
    let slot = cache.fast.slots.get(x).unwrap();
    // A is the entry after 2^23 - 3 reuses of its slot.
    slot.set_generation(slots::LAST_GENERATION - 1);
    let evict_all = || {
        let gone = cache.lock().evict_idle(&cache.fast, |_| true);
        cache.deregister_all(&gone);
    };
    let served = std::rc::Rc::new(std::cell::Cell::new(0));
    let reused_after_last = served.clone();
    BEFORE_CLAIM.with(|h| {
        *h.borrow_mut() = Some(Box::new(move |id| {
            assert_eq!(id, x);
            // Another thread, while this one is between its look at A and its claim.
            evict_all();
            let (b, _) = idle_entry(cache, 0x20_0000);
            assert_eq!(b, x, "B reuses A's slot, at its last generation");
            evict_all();
            let (c, _) = idle_entry(cache, 0x30_0000);
            if c == x {
                // Reused past its last generation: the generation wrapped. 2^23 - 2 more
                // reuses bring it back to A's, the entry in it idle as A was.
                reused_after_last.set(1);
                slot.set_generation(slots::LAST_GENERATION - 2);
                evict_all();
                let (d, d_ptr) = idle_entry(cache, 0x40_0000);
                assert_eq!(d, x);
                reused_after_last.set(d_ptr);
            }
        }))
    });
    let got = cache.try_hit(&a);
    assert_eq!(got, None, "A was served another key's registration");
    assert_eq!(
        served.get(),
        0,
        "a slot was reused past its last generation"
    );
    assert!(slot.retired());
    // Its entry is gone and it stays out of use.
    evict_all();
    for k in 0..4 {
        let (id, _) = idle_entry(cache, 0x50_0000 + k * 0x10_0000);
        assert_ne!(id, x, "a retired slot was reused");
    }
}
