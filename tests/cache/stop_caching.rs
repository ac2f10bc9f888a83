//! `Cache::stop_caching`: the switch the preload throws when its monitor can no longer see
//! memory go away (a patch refused or overwritten). After it nothing may be hit again:
//! idle entries are deregistered at once, entries in use at their last release, and every
//! new registration is the caller's alone.

use mrcache::access::LOCAL_WRITE;
use mrcache::cache::{Cache, Limits, Mr, Outcome, Registrar, Released, Request};
use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

#[derive(Default)]
struct Hca {
    next: AtomicUsize,
    live: Mutex<HashSet<usize>>,
}

impl Registrar for Hca {
    fn register(&self, _req: &Request) -> Result<Mr, i32> {
        let ptr = 0x1000 + 0x100 * self.next.fetch_add(1, SeqCst);
        self.live.lock().unwrap().insert(ptr);
        Ok(Mr {
            ptr,
            via_wrapper: false,
        })
    }
    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        assert!(
            self.live.lock().unwrap().remove(&mr.ptr),
            "double deregistration"
        );
        Ok(())
    }
    fn alloc_shadow(&self) -> Option<usize> {
        None
    }
    fn fill_shadow(&self, _slot: usize, _mr: Mr, _addr: usize, _len: usize) -> bool {
        false
    }
}

fn req(addr: usize) -> Request {
    Request {
        pd: 1,
        context: 1,
        addr,
        len: 4096,
        iova: addr as u64,
        access: LOCAL_WRITE,
    }
}

fn cache() -> Cache<Hca> {
    Cache::new(
        Hca::default(),
        Limits {
            max_entries: 100,
            max_bytes: 1 << 30,
            shadow: false,
            remote_superset: false,
        },
    )
}

fn live(c: &Cache<Hca>) -> usize {
    c.registrar().live.lock().unwrap().len()
}

#[test]
fn stop_caching_deregisters_idle_and_in_use_entries_and_caches_nothing_after() {
    let c = cache();
    let (idle, o) = c.acquire(&req(0x10000)).unwrap();
    assert_eq!(o, Outcome::Miss);
    assert_eq!(c.release(idle), Released::Kept);
    let (busy, _) = c.acquire(&req(0x20000)).unwrap();
    // Cached as usual: the idle one is a hit.
    let (h, o) = c.acquire(&req(0x10000)).unwrap();
    assert_eq!((h, o), (idle, Outcome::Hit));
    assert_eq!(c.release(h), Released::Kept);
    assert_eq!(live(&c), 2);

    assert!(c.stop_caching("test: the monitor is blind"));
    assert!(!c.stop_caching("again"), "stopping twice is a no-op");
    assert_eq!(c.caching_stopped(), Some("test: the monitor is blind"));
    assert_eq!(live(&c), 1, "the idle entry is deregistered at once");

    // The entry in use is no longer found: a new registration of its range is separate.
    let (again, o) = c.acquire(&req(0x20000)).unwrap();
    assert_eq!(o, Outcome::Uncached);
    assert_ne!(again, busy);
    assert_eq!(live(&c), 2);
    // Its old holder's release deregisters it.
    assert_eq!(c.release(busy), Released::Deregistered);
    assert_eq!(live(&c), 1);
    assert_eq!(c.release(again), Released::Deregistered);
    assert_eq!(live(&c), 0);

    // Nothing is ever kept again.
    for _ in 0..3 {
        let (h, o) = c.acquire(&req(0x10000)).unwrap();
        assert_eq!(o, Outcome::Uncached);
        assert_eq!(c.release(h), Released::Deregistered);
    }
    assert_eq!(live(&c), 0);
    assert_eq!(c.snapshot().entries, 0);
}

#[test]
fn stop_caching_while_other_threads_register_leaves_nothing_cached() {
    let c = cache();
    let done = AtomicUsize::new(0);
    let cached_after_stop = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..4usize {
            let (c, done, cached_after_stop) = (&c, &done, &cached_after_stop);
            s.spawn(move || {
                let mut after = 0;
                for i in 0.. {
                    let stopped = c.caching_stopped().is_some();
                    let r = req(0x100_0000 + ((t * 7 + i) % 16) * 4096);
                    let (h, o) = c.acquire(&r).unwrap();
                    if stopped && o != Outcome::Uncached {
                        cached_after_stop.fetch_add(1, SeqCst);
                    }
                    c.release(h);
                    done.fetch_add(1, SeqCst);
                    after += usize::from(stopped);
                    if after == 500 {
                        break;
                    }
                }
            });
        }
        // Stop while every worker is busy (each has done some work, none can finish before).
        while done.load(SeqCst) < 400 {
            std::thread::yield_now();
        }
        c.stop_caching("test");
    });
    assert_eq!(
        cached_after_stop.load(SeqCst),
        0,
        "a hit or a new entry after the stop"
    );
    assert_eq!(
        c.snapshot().entries,
        0,
        "no entry survives or sneaks in after the stop"
    );
    assert_eq!(live(&c), 0, "every registration was deregistered");
}
