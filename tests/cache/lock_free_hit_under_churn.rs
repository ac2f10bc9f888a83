//! The lock-free hit path under churn: threads hit and release thousands of keys (long
//! probe runs, tag collisions) while another invalidates and evicts (slots reused, words
//! moved back by removals) in fresh caches (tables growing while they are probed). Every
//! handle handed out must be a live registration of exactly the request (or, for a shadow,
//! of a range containing it); nothing is deregistered twice; nothing is left registered.

use mrcache::cache::{Cache, Limits, Mr, Registrar, Released, Request};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

#[derive(Default)]
struct Fake {
    next: AtomicUsize,
    /// Live registrations: provider pointer -> (pd, addr, len, access).
    live: Mutex<HashMap<usize, (usize, usize, usize, u32)>>,
    /// Shadow -> the provider pointer and range it was last filled with.
    shadows: Mutex<HashMap<usize, (usize, usize, usize)>>,
    bad_deregs: AtomicUsize,
}

impl Registrar for &Fake {
    fn register(&self, r: &Request) -> Result<Mr, i32> {
        let ptr = 0x1000 * (1 + self.next.fetch_add(1, SeqCst));
        let key = (r.pd, r.addr, r.len, r.access);
        self.live.lock().unwrap().insert(ptr, key);
        Ok(Mr {
            ptr,
            via_wrapper: false,
        })
    }
    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        if self.live.lock().unwrap().remove(&mr.ptr).is_none() {
            self.bad_deregs.fetch_add(1, SeqCst);
            return Err(22);
        }
        Ok(())
    }
    fn alloc_shadow(&self) -> Option<usize> {
        Some((1 << 44) + 256 * self.next.fetch_add(1, SeqCst))
    }
    fn fill_shadow(&self, slot: usize, mr: Mr, addr: usize, len: usize) -> bool {
        self.shadows
            .lock()
            .unwrap()
            .insert(slot, (mr.ptr, addr, len));
        true
    }
}

const KEYS: usize = 3_000;

fn req(k: usize) -> Request {
    // Two lengths per buffer: some keys contain others (containing hits with shadows on).
    let addr = 0x1000_0000 + (k / 2) * 0x4000;
    Request {
        pd: 0x10,
        context: 0x20,
        addr,
        len: if k % 2 == 0 { 0x1000 } else { 0x2000 },
        iova: addr as u64,
        access: 1,
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 as usize
    }
}

/// What `h`, handed out for `r`, must be: a live registration of exactly `r`, or a shadow
/// of one containing it.
fn check(fake: &Fake, r: &Request, h: usize) {
    let live = fake.live.lock().unwrap();
    if let Some(&(pd, addr, len, access)) = live.get(&h) {
        assert_eq!(
            (pd, addr, len, access),
            (r.pd, r.addr, r.len, r.access),
            "handed out another key's registration"
        );
        return;
    }
    let (mr, addr, len) = *fake
        .shadows
        .lock()
        .unwrap()
        .get(&h)
        .expect("handed out a pointer that is neither live nor a shadow");
    assert_eq!((addr, len), (r.addr, r.len), "shadow of another range");
    let &(pd, s, l, _) = live.get(&mr).expect("a shadow of a deregistered MR");
    assert!(
        pd == r.pd && s <= r.addr && r.addr + r.len <= s + l,
        "shadow not containing"
    );
}

/// Counts a hitter out however it leaves (a failed assertion too).
struct Gone<'a>(&'a AtomicUsize);
impl Drop for Gone<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

fn churn(shadow: bool, max_entries: usize, seed: u64) {
    let fake = Fake::default();
    let cache = Cache::new(
        &fake,
        Limits {
            max_entries,
            max_bytes: u64::MAX,
            shadow,
            remote_superset: false,
        },
    );
    // Hitters still running: the invalidator runs as long as they do.
    let running = AtomicUsize::new(3);
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let (cache, fake, running) = (&cache, &fake, &running);
            s.spawn(move || {
                let _gone = Gone(running);
                let mut rng = Rng(seed * 7919 + t + 1);
                let mut held: Vec<(Request, usize)> = Vec::new();
                for _ in 0..20_000 {
                    let r = req(rng.next() % KEYS);
                    let (h, _) = cache.acquire(&r).unwrap();
                    check(fake, &r, h);
                    held.push((r, h));
                    if held.len() > 4 || rng.next() % 2 == 0 {
                        let (_, h) = held.swap_remove(rng.next() % held.len());
                        let released = cache.release(h);
                        assert!(
                            matches!(released, Released::Kept | Released::Deregistered),
                            "release of a held handle: {released:?}"
                        );
                    }
                }
                for (_, h) in held {
                    cache.release(h);
                }
            });
        }
        let mut rng = Rng(seed + 99);
        while running.load(SeqCst) > 0 {
            let r = req(rng.next() % KEYS);
            cache.invalidate(r.addr, r.addr + 0x1000);
            // Room for lock-free hits between invalidations.
            std::thread::yield_now();
        }
    });
    cache.flush_all();
    assert_eq!(fake.bad_deregs.load(SeqCst), 0, "deregistered twice");
    assert_eq!(
        fake.live.lock().unwrap().len(),
        0,
        "registrations left behind"
    );
}

#[test]
fn hits_under_churn_shadows_off() {
    for seed in 0..3 {
        churn(false, usize::MAX, seed);
    }
}

#[test]
fn hits_under_churn_shadows_on() {
    for seed in 0..3 {
        churn(true, usize::MAX, seed);
    }
}

#[test]
fn hits_under_churn_with_eviction() {
    for seed in 0..3 {
        churn(true, 500, seed);
    }
}
