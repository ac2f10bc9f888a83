//! The lock-free hit path must step aside once an invalidation has begun: "no lookup after
//! an unmap can hit an entry overlapping it". Each case caches a registration, lets an
//! unmap hook report its range (without anything draining the queue), and checks that the
//! next lookup of that exact key is not served from the old entry.

use mrcache::cache::{Cache, Limits, Mr, Outcome, Registrar, Released, Request};
use mrcache::stats::Counter;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

#[derive(Default)]
struct Fake {
    next: AtomicUsize,
    live: Mutex<Vec<usize>>,
    /// The MR each shadow was last filled with: the cache reuses shadows across entries, so
    /// two handles are the same registration only if their MRs are.
    shadow_mr: Mutex<std::collections::HashMap<usize, usize>>,
    /// Deregistrations of an MR that was not live (a double deregistration).
    unknown_deregs: AtomicUsize,
}

impl Registrar for &Fake {
    fn register(&self, _: &Request) -> Result<Mr, i32> {
        let ptr = 0x1000 * (1 + self.next.fetch_add(1, SeqCst));
        self.live.lock().unwrap().push(ptr);
        Ok(Mr {
            ptr,
            via_wrapper: false,
        })
    }
    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        let mut live = self.live.lock().unwrap();
        let before = live.len();
        live.retain(|&p| p != mr.ptr);
        if live.len() == before {
            self.unknown_deregs.fetch_add(1, SeqCst);
            return Err(22);
        }
        Ok(())
    }
    fn alloc_shadow(&self) -> Option<usize> {
        Some((1 << 40) + 64 * self.next.fetch_add(1, SeqCst))
    }
    fn fill_shadow(&self, shadow: usize, mr: Mr, _: usize, _: usize) -> bool {
        self.shadow_mr.lock().unwrap().insert(shadow, mr.ptr);
        true
    }
}

impl Fake {
    /// The provider's MR behind a handle the cache gave out (read while it is held: a held
    /// shadow is not refilled).
    fn mr_of(&self, handle: usize) -> usize {
        match self.shadow_mr.lock().unwrap().get(&handle) {
            Some(&mr) => mr,
            None => handle,
        }
    }
}

const LIMITS: Limits = Limits {
    max_entries: usize::MAX,
    max_bytes: u64::MAX,
    shadow: true,
    remote_superset: false,
};

/// Shadows off: holders share the provider's pointer.
const SHARED: Limits = Limits {
    shadow: false,
    ..LIMITS
};

fn req(addr: usize) -> Request {
    Request {
        pd: 0x10,
        context: 0x20,
        addr,
        len: 0x4000,
        iova: addr as u64,
        access: 1,
    }
}

/// A cache holding one idle entry for `req(0x10_0000)`, hit once on the fast path; returns
/// the provider pointer.
fn cached(cache: &Cache<&Fake>) -> usize {
    let r = req(0x10_0000);
    let (h, o) = cache.acquire(&r).unwrap();
    assert_eq!(o, Outcome::Miss);
    assert_eq!(cache.release(h), Released::Kept);
    // A hit with nothing pending (the hit path proper).
    assert_eq!(cache.acquire(&r).unwrap(), (h, Outcome::Hit));
    assert_eq!(cache.release(h), Released::Kept);
    h
}

#[test]
fn no_hit_while_an_unmap_hook_is_in_flight() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let old = cached(&cache);
    // The hook reported the range and is about to unmap: nothing drained it yet.
    cache.invalidate_begin(0x10_2000, 0x10_3000);
    let (h, o) = cache.acquire(&req(0x10_0000)).unwrap();
    assert_ne!(
        (h, o),
        (old, Outcome::Hit),
        "a lookup after the unmap hook began was served the entry it invalidates"
    );
    assert!(
        !fake.live.lock().unwrap().contains(&old),
        "old MR deregistered"
    );
    cache.invalidate_end();
    cache.release(h);
}

#[test]
fn no_hit_after_an_unmap_finished_before_any_drain() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let old = cached(&cache);
    cache.invalidate_begin(0x0f_0000, 0x10_1000);
    cache.invalidate_end();
    let (h, o) = cache.acquire(&req(0x10_0000)).unwrap();
    assert_eq!(o, Outcome::Miss, "re-registered after the unmap");
    assert_ne!(h, old);
    // The fast path is back once the queue is drained and quiet: the new entry is hit.
    assert_eq!(cache.release(h), Released::Kept);
    assert_eq!(cache.acquire(&req(0x10_0000)).unwrap(), (h, Outcome::Hit));
    assert_eq!(cache.release(h), Released::Kept);
}

#[test]
fn an_entry_in_use_when_invalidated_goes_at_its_release() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let r = req(0x10_0000);
    let (h, _) = cache.acquire(&r).unwrap();
    cache.invalidate_begin(0x10_0000, 0x10_1000);
    cache.invalidate_end();
    // Drained by this unrelated lookup; the entry is in use, so it stays registered.
    cache
        .acquire(&req(0x20_0000))
        .map(|(x, _)| cache.release(x))
        .unwrap();
    assert!(fake.live.lock().unwrap().contains(&h));
    // Its release (the last reference of a dead entry) must take the locked path.
    assert_eq!(cache.release(h), Released::Deregistered);
    assert!(!fake.live.lock().unwrap().contains(&h));
    assert_eq!(cache.release(h), Released::DoubleRelease);
}

/// The cache reuses a released shadow `ibv_mr` for any entry, so the same handle after an
/// invalidation is not by itself a stale hit: the test below compares the MRs behind the
/// handles (it compared the handles, and failed once in CI under load).
#[test]
fn a_spare_shadow_comes_back_for_a_new_entry() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let v = req(0x40_0000);
    let (primary, _) = cache.acquire(&v).unwrap();
    // The provider's pointer is held: a second holder gets a shadow.
    let (old, _) = cache.acquire(&v).unwrap();
    let old_mr = fake.mr_of(old);
    assert_ne!(old, old_mr);
    cache.release(old);
    cache.invalidate_begin(v.addr, v.addr + v.len);
    cache.invalidate_end();
    cache.release(primary);
    let (fresh, _) = cache.acquire(&v).unwrap();
    let (x, _) = cache.acquire(&v).unwrap();
    assert_eq!(x, old, "the spare shadow is handed out again");
    assert_ne!(fake.mr_of(x), old_mr, "for the new registration");
    cache.release(x);
    cache.release(fresh);
}

/// Two threads hit the same buffer and private ones (draining the queue whenever they see
/// it dirty) while this thread unmaps and re-registers the shared one: every lookup that
/// starts after the unmap hook began must miss the old entry.
#[test]
fn concurrent_hits_never_see_an_entry_after_its_unmap_began() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let victim = req(0x40_0000);
    let done = std::sync::atomic::AtomicBool::new(false);
    /// Stops the other threads however this one leaves (an assertion failing included).
    struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
        }
    }
    std::thread::scope(|s| {
        for t in 0..2 {
            let (cache, done) = (&cache, &done);
            s.spawn(move || {
                let own = req(0x80_0000 + t * 0x10_0000);
                while !done.load(SeqCst) {
                    for r in [&victim, &own] {
                        let (x, _) = cache.acquire(r).unwrap();
                        cache.release(x);
                    }
                }
            });
        }
        let _stop = Stop(&done);
        for _ in 0..5_000 {
            let (old, _) = cache.acquire(&victim).unwrap();
            let old_mr = fake.mr_of(old);
            cache.release(old);
            cache.invalidate_begin(victim.addr, victim.addr + victim.len);
            cache.invalidate_end();
            // Any lookup from here on: never `old`'s registration (the fake never reuses an
            // MR pointer; the cache does reuse shadows, for other entries too).
            let (x, _) = cache.acquire(&victim).unwrap();
            let x_mr = fake.mr_of(x);
            cache.release(x);
            assert_ne!(x_mr, old_mr, "hit an entry whose unmap had begun");
        }
    });
}

/// Shadows off, so holders share the provider's pointer: three threads release a pointer
/// held twice, at once, on a live entry and on one invalidated while in use. Exactly two
/// releases count (the last of a dead entry deregisters it, once), the third is a double
/// release, and nothing is deregistered twice or leaked.
#[test]
fn racing_releases_of_a_shared_pointer_count_each_holding_once() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, SHARED);
    for i in 0..2_000usize {
        let r = req(0x100_0000 + (i % 8) * 0x10_0000);
        let (h, _) = cache.acquire(&r).unwrap();
        assert_eq!(cache.acquire(&r).unwrap(), (h, Outcome::Hit), "shared");
        let dead = i % 2 == 1;
        if dead {
            cache.invalidate(r.addr, r.addr + 0x1000);
        }
        let barrier = std::sync::Barrier::new(3);
        let results: Vec<Released> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..3)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        cache.release(h)
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let n = |want: Released| results.iter().filter(|&&x| x == want).count();
        assert_eq!(n(Released::DoubleRelease), 1, "round {i}: {results:?}");
        if dead {
            assert_eq!(n(Released::Deregistered), 1, "round {i}: {results:?}");
            assert_eq!(n(Released::Kept), 1, "round {i}: {results:?}");
            assert!(!fake.live.lock().unwrap().contains(&h), "round {i}: leaked");
        } else {
            assert_eq!(n(Released::Kept), 2, "round {i}: {results:?}");
        }
        assert_eq!(
            fake.unknown_deregs.load(SeqCst),
            0,
            "round {i}: deregistered twice"
        );
    }
}

/// `try_hit` and `try_release`, the attempts the preload shell makes before its guard, do
/// only what the lock-free path may: each steps aside (None, nothing changed) whenever
/// `acquire` or `release` would take the lock.
#[test]
fn fast_attempts_step_aside_whenever_the_full_path_is_needed() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, LIMITS);
    let r = req(0x10_0000);
    assert_eq!(cache.try_hit(&r), None, "nothing cached yet");
    let h = cached(&cache);
    let hits = cache.snapshot().counts[Counter::Hits];
    assert_eq!(cache.try_hit(&r), Some(h));
    assert_eq!(
        cache.snapshot().counts[Counter::Hits],
        hits + 1,
        "hit counted"
    );
    assert_eq!(cache.try_release(h), Some(Released::Kept));
    assert_eq!(cache.try_release(h), None, "a second release");
    assert_eq!(cache.try_release(0x1234), None, "not ours");
    // Held by one user, then an unmap begins: neither attempt may act any more.
    assert_eq!(cache.try_hit(&r), Some(h));
    cache.invalidate_begin(0x10_0000, 0x10_1000);
    assert_eq!(cache.try_hit(&r), None, "hit after an unmap began");
    assert_eq!(
        cache.try_release(h),
        None,
        "release with an invalidation to drain"
    );
    cache.invalidate_end();
    assert_eq!(cache.release(h), Released::Deregistered);
}

/// `MRCACHE_VERIFY`: every hit is checked on the locked path, never by `try_hit`.
#[test]
fn fast_hit_leaves_verified_hits_to_the_locked_path() {
    struct Verifying<'a>(&'a Fake);
    impl Registrar for Verifying<'_> {
        fn register(&self, r: &Request) -> Result<Mr, i32> {
            self.0.register(r)
        }
        fn deregister(&self, mr: Mr) -> Result<(), i32> {
            self.0.deregister(mr)
        }
        fn alloc_shadow(&self) -> Option<usize> {
            None
        }
        fn fill_shadow(&self, _: usize, _: Mr, _: usize, _: usize) -> bool {
            false
        }
        fn verifies(&self) -> bool {
            true
        }
    }
    let fake = Fake::default();
    let cache = Cache::new(Verifying(&fake), LIMITS);
    let r = req(0x10_0000);
    let (h, _) = cache.acquire(&r).unwrap();
    assert_eq!(cache.release(h), Released::Kept);
    assert_eq!(cache.try_hit(&r), None, "an unverified hit");
}

/// A provider that remembers which address each MR it made was registered for.
#[derive(Default)]
struct Keyed {
    next: AtomicUsize,
    addr_of: Mutex<std::collections::HashMap<usize, usize>>,
}

impl Registrar for &Keyed {
    fn register(&self, r: &Request) -> Result<Mr, i32> {
        let ptr = 0x1000 * (1 + self.next.fetch_add(1, SeqCst));
        self.addr_of.lock().unwrap().insert(ptr, r.addr);
        Ok(Mr {
            ptr,
            via_wrapper: false,
        })
    }
    fn deregister(&self, _: Mr) -> Result<(), i32> {
        Ok(())
    }
    fn alloc_shadow(&self) -> Option<usize> {
        Some((1 << 40) + 64 * self.next.fetch_add(1, SeqCst))
    }
    fn fill_shadow(&self, slot: usize, mr: Mr, _: usize, _: usize) -> bool {
        let mut m = self.addr_of.lock().unwrap();
        let addr = m[&mr.ptr];
        m.insert(slot, addr);
        true
    }
}

/// Two threads hit their own buffers without the lock while this one churns others
/// through a cache too small for all of them: evictions free slots that new entries reuse
/// at once, and move words in the lock-free table under the readers. Every pointer a hit
/// hands out must be a registration of the requested buffer.
#[test]
fn hits_while_slots_are_reused_get_their_own_registration() {
    let keyed = Keyed::default();
    let cache = Cache::new(
        &keyed,
        Limits {
            max_entries: 6,
            ..LIMITS
        },
    );
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..2 {
            let (cache, done, keyed) = (&cache, &done, &keyed);
            s.spawn(move || {
                let own = [0, 1].map(|i| req(0x1_0000_0000 + (2 * t + i) * 0x10_0000));
                while !done.load(SeqCst) {
                    for r in &own {
                        let (h, _) = cache.acquire(r).unwrap();
                        let addr = keyed.addr_of.lock().unwrap().get(&h).copied();
                        cache.release(h);
                        assert_eq!(addr, Some(r.addr), "another buffer's registration");
                    }
                }
            });
        }
        for i in 0..100_000usize {
            let (h, _) = cache
                .acquire(&req(0x2_0000_0000 + (i % 16) * 0x10_0000))
                .unwrap();
            cache.release(h);
        }
        done.store(true, SeqCst);
    });
}

/// Lock-free hits are counted in their entry's state word and flushed to the cache's
/// counter in bulk: every one is counted, across flushes and on two threads at once.
#[test]
fn every_lock_free_hit_is_counted() {
    let fake = Fake::default();
    let cache = Cache::new(&fake, SHARED);
    let r = req(0x10_0000);
    let (h, _) = cache.acquire(&r).unwrap();
    cache.release(h);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..20_000 {
                    assert_eq!(cache.acquire(&r).unwrap(), (h, Outcome::Hit));
                    cache.release(h);
                }
            });
        }
    });
    let counts = cache.snapshot().counts;
    assert_eq!(counts[Counter::Hits], 40_000);
}
