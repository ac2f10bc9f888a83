//! The release's recent-hit word (`recent.rs`): a release after a lock-free hit finds the
//! slot through it without the MR-pointer table, and a word that names another pointer's
//! slot (stale, planted, or reached by a pointer the cache never handed out) releases
//! nothing.

use super::fake::{Fake, LIMITS, idle_entry, req};
use crate::cache::state::mr_hash;
use crate::cache::*;

#[test]
fn a_release_after_a_lock_free_hit_needs_no_mr_table_word() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let (a, a_ptr) = idle_entry(&cache, 0x10_0000);
    assert_eq!(cache.try_hit(&req(0x10_0000)), Some(a_ptr));
    // The MR-pointer table no longer leads to A: only the hit's word can.
    let rehash = |i| cache.fast.slot_mr_hash(i);
    assert!(cache.fast.by_mr.remove(mr_hash(a_ptr), a, rehash));
    assert_eq!(
        cache.try_release(a_ptr),
        Some(Released::Kept),
        "the release did not find the slot the hit just handed out"
    );
    let s = cache.fast.slots.get(a).unwrap().load();
    assert_eq!(slots::holders(s), 0, "A still held after its release");
    cache.fast.by_mr.insert(mr_hash(a_ptr), a, rehash);
}

#[test]
fn a_recent_hit_word_naming_another_pointers_slot_releases_nothing() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let (b_ptr, o) = cache.acquire(&req(0x20_0000)).unwrap();
    assert_eq!(o, Outcome::Miss);
    let b = cache.fast.by_mr(b_ptr).unwrap();
    // A pointer the cache never handed out, whose word on this thread names B's slot.
    let foreign = 0xdead_0000;
    cache.fast.recent.plant(foreign, b);
    assert_eq!(cache.try_release(foreign), None);
    assert_eq!(cache.release(foreign), Released::NotOurs);
    let s = cache.fast.slots.get(b).unwrap().load();
    assert_eq!(
        slots::holders(s),
        1,
        "B's holding was released by another pointer"
    );
    assert_eq!(cache.try_release(b_ptr), Some(Released::Kept));
}

/// The word a hit on A left behind names A's slot after A was evicted and B took the slot:
/// a second release of A's pointer must not give back B's holding.
#[test]
fn a_word_left_by_a_hit_on_an_evicted_entry_releases_nothing_of_the_slots_next_entry() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let (a, a_ptr) = idle_entry(&cache, 0x10_0000);
    assert_eq!(cache.try_hit(&req(0x10_0000)), Some(a_ptr));
    assert_eq!(cache.try_release(a_ptr), Some(Released::Kept));
    let gone = cache
        .lock()
        .evict_idle(&cache.fast, |e| e.req.addr == 0x10_0000);
    cache.deregister_all(&gone);
    let (b_ptr, o) = cache.acquire(&req(0x20_0000)).unwrap();
    assert_eq!(o, Outcome::Miss);
    assert_eq!(cache.fast.by_mr(b_ptr), Some(a), "B reuses A's slot");
    // The word the hit left (unit tests pick one line per thread, `recent::line_index`).
    assert_eq!(cache.fast.recent.candidate(a_ptr), Some(a));
    assert_eq!(cache.try_release(a_ptr), None);
    let s = cache.fast.slots.get(a).unwrap().load();
    assert_eq!(
        slots::holders(s),
        1,
        "B's holding was released by A's stale pointer"
    );
    assert_eq!(cache.release(b_ptr), Released::Kept);
}
