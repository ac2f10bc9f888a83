//! An address the cache buried, handed by the "allocator" to a pass-through on
//! another thread, must never release as a double deregistration.

use super::fake::{LIMITS, req};
use crate::cache::*;
use std::sync::Mutex;

/// A provider whose MR pointers come from a small free list (LIFO, like an allocator's
/// bin), shared with the pass-throughs (libibverbs' own registrations).
struct Pool {
    free: Mutex<Vec<usize>>,
}

impl Pool {
    fn take(&self) -> usize {
        let mut f = self.free.lock().unwrap();
        f.pop().expect("pool empty")
    }
    fn give(&self, p: usize) {
        self.free.lock().unwrap().push(p);
    }
}

impl Registrar for &Pool {
    fn register(&self, _: &Request) -> Result<Mr, i32> {
        Ok(Mr {
            ptr: self.take(),
            via_wrapper: false,
        })
    }
    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        self.give(mr.ptr);
        Ok(())
    }
    fn alloc_shadow(&self) -> Option<usize> {
        None
    }
    fn fill_shadow(&self, _: usize, _: Mr, _: usize, _: usize) -> bool {
        false
    }
}

fn run(stop: bool) -> (usize, usize) {
    let pool = Pool {
        free: Mutex::new((0..8).map(|i| 0x9000_0000 + i * 0x40).collect()),
    };
    let cache = Cache::new(&pool, LIMITS);
    if stop {
        cache.stop_caching("test"); // every registration uncached: released and buried
    }
    let doubles = std::sync::atomic::AtomicUsize::new(0);
    let passes = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        // The cache's side: register, release (buried, deregistered, address freed).
        s.spawn(|| {
            for i in 0..100_000usize {
                let r = req(0x10_0000 + (i % 3) * 0x1000);
                let (h, _) = cache.acquire(&r).unwrap();
                cache.release(h);
                if !stop && i % 2 == 0 {
                    cache.flush_all(); // idle entries removed: buried, deregistered
                }
            }
        });
        // libibverbs' own registrations (pass-throughs) reusing freed addresses.
        s.spawn(|| {
            for _ in 0..100_000 {
                let p = pool.take_opt();
                let Some(p) = p else { continue };
                cache.note_foreign(p);
                passes.fetch_add(1, SeqCst);
                match cache.release(p) {
                    Released::NotOurs => {}
                    Released::DoubleRelease => {
                        doubles.fetch_add(1, SeqCst);
                    }
                    other => panic!("{other:?}"),
                }
                pool.give(p);
            }
        });
    });
    (passes.into_inner(), doubles.into_inner())
}

impl Pool {
    fn take_opt(&self) -> Option<usize> {
        self.free.lock().unwrap().pop()
    }
}

#[test]
fn reused_address_is_never_a_double_release() {
    for stop in [true, false] {
        let (passes, doubles) = run(stop);
        eprintln!(
            "stop_caching={stop}: {passes} pass-throughs on freed addresses, {doubles} false double releases"
        );
        assert_eq!(doubles, 0);
    }
}

/// The same with the registry's groups overflowing (batches of 5,000 uncached MRs released
/// at once over a pool of 12,000 addresses): tombstones dropped and reuses interleave.
#[test]
fn reuse_with_tombstones_dropped() {
    let pool = Pool {
        free: Mutex::new((0..12_000).map(|i| 0x9000_0000 + i * 0x50).collect()),
    };
    let cache = Cache::new(&pool, LIMITS);
    cache.stop_caching("test");
    let doubles = std::sync::atomic::AtomicUsize::new(0);
    let passes = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..8 {
                let hs: Vec<usize> = (0..5_000)
                    .map(|i| cache.acquire(&req(0x10_0000 + i * 0x1000)).unwrap().0)
                    .collect();
                for h in hs {
                    assert_eq!(cache.release(h), Released::Deregistered);
                }
            }
            done.store(true, SeqCst);
        });
        s.spawn(|| {
            while !done.load(SeqCst) {
                let Some(p) = pool.take_opt() else { continue };
                cache.note_foreign(p);
                passes.fetch_add(1, SeqCst);
                if cache.release(p) == Released::DoubleRelease {
                    doubles.fetch_add(1, SeqCst);
                }
                pool.give(p);
            }
        });
    });
    eprintln!(
        "{} pass-throughs, {} false double releases",
        passes.load(SeqCst),
        doubles.load(SeqCst),
    );
    assert_eq!(doubles.load(SeqCst), 0);
}
