//! A key whose entry holds all the references a slot counts (4,095): the next registration
//! of that key is passed through as without the cache. Before, it took the miss path: it
//! evicted an idle entry to make room, registered, and handed the registration out
//! uncached (a second registration of the key, and another key's entry lost for nothing).

use super::fake::*;
use crate::cache::*;

const HELD: usize = 4095;

#[test]
fn a_key_held_4095_times_passes_its_next_registration_through_and_evicts_nothing() {
    let fake = Fake::default();
    let limits = Limits {
        max_entries: 2,
        shadow: false,
        ..LIMITS
    };
    let cache = Cache::new(&fake, limits);
    let a = req(0x10_0000);
    let mut held = Vec::with_capacity(HELD);
    for _ in 0..HELD {
        held.push(cache.acquire(&a).unwrap().0);
    }
    let (b, _) = idle_entry(&cache, 0x20_0000);
    let registered = fake.next.load(SeqCst);
    let got = cache.acquire(&a);
    assert!(
        matches!(
            got,
            Err(AcquireError::Bypass {
                why: Bypass::Saturated,
                ..
            })
        ),
        "the 4,096th holding of one key: {got:?} (evicted {:?}, registrations {} -> {})",
        fake.deregistered.lock().unwrap(),
        registered,
        fake.next.load(SeqCst)
    );
    assert_eq!(
        fake.next.load(SeqCst),
        registered,
        "a registration was made"
    );
    assert!(
        fake.deregistered.lock().unwrap().is_empty(),
        "an entry was evicted"
    );
    assert_eq!(
        cache.fast.exact(&req(0x20_0000)),
        Some(b),
        "B's entry is gone"
    );
    // The lock-free hit refuses it too (and leaves the count as it was).
    assert_eq!(cache.try_hit(&a), None);
    let id = cache.fast.exact(&a).unwrap();
    assert_eq!(
        slots::refs(cache.fast.slots.get(id).unwrap().load()),
        HELD as u64
    );
    // Once one holding is given back, the key hits again.
    assert_eq!(cache.release(held.pop().unwrap()), Released::Kept);
    let (h, o) = cache.acquire(&a).unwrap();
    assert_eq!(o, Outcome::Hit);
    held.push(h);
    for h in held {
        assert_eq!(cache.release(h), Released::Kept);
    }
    assert_eq!(slots::refs(cache.fast.slots.get(id).unwrap().load()), 0);
}
