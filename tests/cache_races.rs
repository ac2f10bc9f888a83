//! Races between threads inside the cache, each forced to happen rather than hoped for.

use mrcache::access::LOCAL_WRITE;
use mrcache::cache::{Cache, Limits, Mr, Outcome, Registrar, Released, Request};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

/// A provider that counts live registrations and can hold callers inside `register` until
/// a number of them are there at once, or stall inside `deregister`.
struct Provider {
    live: Mutex<HashSet<usize>>,
    next: AtomicUsize,
    register_meet: Option<Barrier>,
    /// The MR whose deregistration sticks for 3 s (0: none).
    stall_ptr: AtomicUsize,
    stalled: AtomicBool,
    panic_dereg: AtomicBool,
}

impl Provider {
    fn new(register_meet: Option<usize>) -> Provider {
        Provider {
            live: Mutex::new(HashSet::new()),
            next: AtomicUsize::new(1),
            register_meet: register_meet.map(Barrier::new),
            stall_ptr: AtomicUsize::new(0),
            stalled: AtomicBool::new(false),
            panic_dereg: AtomicBool::new(false),
        }
    }
}

impl Registrar for &Provider {
    fn register(&self, _req: &Request) -> Result<Mr, i32> {
        if let Some(b) = &self.register_meet {
            b.wait();
        }
        let ptr = 0x7000_0000 + self.next.fetch_add(1, SeqCst) * 64;
        self.live.lock().unwrap().insert(ptr);
        Ok(Mr {
            ptr,
            via_wrapper: false,
        })
    }

    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        if self.panic_dereg.load(SeqCst) {
            panic!("provider bug inside deregister");
        }
        if self.stall_ptr.load(SeqCst) == mr.ptr {
            self.stalled.store(true, SeqCst);
            std::thread::sleep(Duration::from_secs(3));
        }
        assert!(self.live.lock().unwrap().remove(&mr.ptr));
        Ok(())
    }

    fn alloc_shadow(&self) -> Option<usize> {
        Some(0x9000_0000 + self.next.fetch_add(1, SeqCst) * 64)
    }

    fn fill_shadow(&self, _slot: usize, _mr: Mr, _addr: usize, _len: usize) -> bool {
        true
    }
}

fn cache(p: &Provider) -> Cache<&Provider> {
    Cache::new(
        p,
        Limits {
            max_entries: 64,
            max_bytes: 1 << 30,
            shadow: true,
            remote_superset: false,
        },
    )
}

fn request(pd: usize, addr: usize, len: usize) -> Request {
    Request {
        pd,
        context: 0x50,
        addr,
        len,
        iova: addr as u64,
        access: LOCAL_WRITE,
    }
}

/// Two threads miss on the same key at the same moment (both inside the provider's
/// register): only one registration may be cached, or the memory stays pinned twice.
#[test]
fn concurrent_misses_of_one_key_cache_one_registration() {
    let p = Provider::new(Some(2));
    let c = cache(&p);
    let req = request(0x100, 0x10_0000, 8192);
    let outcomes: Vec<(usize, Outcome)> = std::thread::scope(|s| {
        let t: Vec<_> = (0..2)
            .map(|_| s.spawn(|| c.acquire(&req).unwrap()))
            .collect();
        t.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let misses = outcomes.iter().filter(|(_, o)| *o == Outcome::Miss).count();
    assert_eq!(
        misses, 1,
        "both concurrent misses were cached: {outcomes:?}"
    );
    for (h, _) in &outcomes {
        assert_ne!(c.release(*h), Released::NotOurs);
    }
    assert_eq!(c.snapshot().entries, 1);
    assert_eq!(
        p.live.lock().unwrap().len(),
        1,
        "the memory is pinned twice"
    );
}

/// An unmap hook is held between its report and its system call while another thread
/// churns unrelated unmaps: a registration of the range being unmapped must never be
/// cached (it pins pages that are about to go), however the unrelated hooks interleave.
#[test]
fn an_open_invalidation_is_never_hidden_by_unrelated_ones() {
    let p = Provider::new(None);
    let c = cache(&p);
    let req = request(0x100, 0x10_0000, 8192);
    c.invalidate_begin(req.addr, req.addr + req.len);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(SeqCst) {
                c.invalidate_begin(0x4000_0000, 0x4000_1000);
                c.invalidate_end();
            }
        });
        for i in 0..300 {
            let (h, o) = c.acquire(&req).unwrap();
            assert_eq!(
                o,
                Outcome::Uncached,
                "attempt {i}: cached while the unmap of its range was in flight"
            );
            assert_eq!(c.release(h), Released::Deregistered);
        }
        stop.store(true, SeqCst);
    });
    c.invalidate_end();
}

/// `ibv_dealloc_pd`'s flush waits only for deregistrations of its own PD, and never for
/// ever: a provider call stuck on another PD, or one that panicked, does not hang it.
#[test]
fn flush_waits_are_bounded_and_per_pd() {
    let p = Provider::new(None);
    let c = cache(&p);
    let a = request(0x100, 0x10_0000, 4096);
    let b = request(0x200, 0x20_0000, 4096);
    let (ha, _) = c.acquire(&a).unwrap();
    c.release(ha);
    let (hb, _) = c.acquire(&b).unwrap();
    c.release(hb);
    // The deregistration of PD 0x100's MR sticks in the provider for 3 s (another thread).
    p.stall_ptr.store(ha, SeqCst);
    std::thread::scope(|s| {
        s.spawn(|| c.flush_pd(0x100));
        while !p.stalled.load(SeqCst) {
            std::thread::yield_now();
        }
        let t = Instant::now();
        assert_eq!(c.flush_pd(0x200), 1);
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "flushing PD 0x200 waited {:?} for a deregistration on PD 0x100",
            t.elapsed()
        );
    });
    // A deregistration that panics leaves nothing behind that a flush would wait on.
    let (h, _) = c.acquire(&a).unwrap();
    c.release(h);
    p.panic_dereg.store(true, SeqCst);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.flush_pd(0x100)));
    assert!(r.is_err());
    p.panic_dereg.store(false, SeqCst);
    let (tx, rx) = std::sync::mpsc::channel();
    let c = &c;
    std::thread::scope(|s| {
        s.spawn(move || {
            c.flush_all();
            let _ = tx.send(());
        });
        let r = rx.recv_timeout(Duration::from_secs(10));
        assert!(r.is_ok(), "a flush hung after a panicked deregistration");
    });
}
