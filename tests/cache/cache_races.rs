//! Races between threads inside the cache, each forced to happen rather than hoped for, and
//! deregistrations in flight (taken out of the cache, inside the provider): a panic or a
//! reused MR pointer must not make a flush wait for nothing or return too early.

use mrcache::access::LOCAL_WRITE;
use mrcache::cache::{Cache, Detached, Limits, Mr, Outcome, Registrar, Released, Request};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Barrier, Mutex, mpsc};
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
        if self.panic_dereg.swap(false, SeqCst) {
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

fn cache<R: Registrar>(p: R) -> Cache<R> {
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

/// An uncached registration (made while an unmap was in flight) released twice: the
/// second release is a double release, not a pointer passed on to libibverbs (which would
/// dereference the freed MR: seen as a segfault in the VM's double_dereg case).
#[test]
fn a_second_release_of_an_uncached_registration_is_a_double_release() {
    let p = Provider::new(None);
    let c = cache(&p);
    let req = request(0x100, 0x10_0000, 8192);
    c.invalidate_begin(req.addr, req.addr + req.len);
    let (h, o) = c.acquire(&req).unwrap();
    c.invalidate_end();
    assert_eq!(o, Outcome::Uncached);
    assert_eq!(c.release(h), Released::Deregistered);
    assert_eq!(c.release(h), Released::DoubleRelease);
}

/// A panic in the first of several deregistrations of one flush does not strand the rest:
/// every later flush (dealloc_pd, close_device, each fork's prepare) would wait for them.
#[test]
fn a_panic_in_one_of_several_deregistrations_leaves_nothing_behind() {
    let p = Provider::new(None);
    let c = cache(&p);
    for i in 0..2 {
        let (h, o) = c
            .acquire(&request(0x100, 0x10_0000 + i * 0x1_0000, 4096))
            .unwrap();
        assert_eq!(o, Outcome::Miss);
        c.release(h);
    }
    p.panic_dereg.store(true, SeqCst);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.flush_pd(0x100)));
    assert!(r.is_err());
    let t = Instant::now();
    c.flush_all();
    let waited = t.elapsed();
    assert!(
        waited < Duration::from_millis(500),
        "flush_all waited {waited:?} for an MR stranded in in_flight by a panic"
    );
}

/// A provider that reuses the pointer of an MR it just freed: the first deregistration's
/// record must not erase the second's (flush_pd would return while it is in the provider).
struct Reusing {
    live: Mutex<HashSet<usize>>,
    free: Mutex<Vec<usize>>,
    next: AtomicUsize,
    calls: AtomicUsize,
    freed1: Mutex<Option<mpsc::Sender<()>>>,
    gate1: Mutex<Option<mpsc::Receiver<()>>>,
    entered2: Mutex<Option<mpsc::Sender<()>>>,
    gate2: Mutex<Option<mpsc::Receiver<()>>>,
}

impl Registrar for &Reusing {
    fn register(&self, _req: &Request) -> Result<Mr, i32> {
        let ptr = self
            .free
            .lock()
            .unwrap()
            .pop()
            .unwrap_or_else(|| 0x7000_0000 + self.next.fetch_add(1, SeqCst) * 64);
        self.live.lock().unwrap().insert(ptr);
        Ok(Mr {
            ptr,
            via_wrapper: false,
        })
    }
    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        match self.calls.fetch_add(1, SeqCst) {
            0 => {
                // The provider frees its object (malloc may hand it out again at once) and
                // has a few instructions left before returning.
                self.live.lock().unwrap().remove(&mr.ptr);
                self.free.lock().unwrap().push(mr.ptr);
                let _ = self.freed1.lock().unwrap().take().unwrap().send(());
                let g = self.gate1.lock().unwrap().take().unwrap();
                let _ = g.recv();
            }
            1 => {
                // A slow deregistration (the MR is still registered with the PD).
                let _ = self.entered2.lock().unwrap().take().unwrap().send(());
                let g = self.gate2.lock().unwrap().take().unwrap();
                let _ = g.recv();
                self.live.lock().unwrap().remove(&mr.ptr);
            }
            _ => {
                self.live.lock().unwrap().remove(&mr.ptr);
            }
        }
        Ok(())
    }
    fn alloc_shadow(&self) -> Option<usize> {
        Some(0x9000_0000 + self.next.fetch_add(1, SeqCst) * 64)
    }
    fn fill_shadow(&self, _: usize, _: Mr, _: usize, _: usize) -> bool {
        true
    }
}

#[test]
fn flush_pd_waits_for_a_deregistration_of_a_reused_mr_pointer() {
    let (freed1_tx, freed1_rx) = mpsc::channel();
    let (gate1_tx, gate1_rx) = mpsc::channel();
    let (entered2_tx, entered2_rx) = mpsc::channel();
    let (gate2_tx, gate2_rx) = mpsc::channel();
    let p = Reusing {
        live: Mutex::new(HashSet::new()),
        free: Mutex::new(Vec::new()),
        next: AtomicUsize::new(1),
        calls: AtomicUsize::new(0),
        freed1: Mutex::new(Some(freed1_tx)),
        gate1: Mutex::new(Some(gate1_rx)),
        entered2: Mutex::new(Some(entered2_tx)),
        gate2: Mutex::new(Some(gate2_rx)),
    };
    let c = cache(&p);
    let a = request(0x100, 0x10_0000, 4096);
    let b = request(0x100, 0x20_0000, 4096);
    let (ha, o) = c.acquire(&a).unwrap();
    assert_eq!(o, Outcome::Miss);
    c.release(ha);
    std::thread::scope(|s| {
        // The background drain deregisters A (its memory went away).
        let t1 = s.spawn(|| c.invalidate(a.addr, a.addr + a.len));
        freed1_rx.recv().unwrap();
        // Meanwhile B is registered; the provider reuses A's freed object.
        let (hb, o) = c.acquire(&b).unwrap();
        assert_eq!((hb, o), (ha, Outcome::Miss), "pointer reused");
        c.release(hb);
        // B's memory goes too; its deregistration is slow.
        let t2 = s.spawn(|| c.invalidate(b.addr, b.addr + b.len));
        entered2_rx.recv().unwrap();
        // A's deregistration returns: its guard removes in_flight[ptr] -- B's record.
        gate1_tx.send(()).unwrap();
        t1.join().unwrap();
        // ibv_dealloc_pd(0x100): flush must wait for B (same PD) to leave the provider.
        let (done_tx, done_rx) = mpsc::channel();
        let c2 = &c;
        let flusher = s.spawn(move || {
            c2.flush_pd(0x100);
            let _ = done_tx.send(());
        });
        let returned_early = done_rx.recv_timeout(Duration::from_millis(300)).is_ok();
        let still_live = p.live.lock().unwrap().contains(&hb);
        gate2_tx.send(()).unwrap();
        t2.join().unwrap();
        flusher.join().unwrap();
        assert!(
            !(returned_early && still_live),
            "flush_pd(0x100) returned while MR {hb:#x} of PD 0x100 was still being \
             deregistered: ibv_dealloc_pd would fail with EBUSY"
        );
    });
}

/// A provider whose `fill_shadow` can be held: it says when it is inside, and waits to be
/// let go.
struct Refilling {
    inner: Provider,
    hold: AtomicBool,
    inside: Mutex<Option<mpsc::Sender<usize>>>,
    go: Mutex<Option<mpsc::Receiver<()>>>,
}

impl Registrar for &Refilling {
    fn register(&self, req: &Request) -> Result<Mr, i32> {
        (&self.inner).register(req)
    }
    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        (&self.inner).deregister(mr)
    }
    fn alloc_shadow(&self) -> Option<usize> {
        (&self.inner).alloc_shadow()
    }
    fn fill_shadow(&self, slot: usize, _: Mr, _: usize, _: usize) -> bool {
        if self.hold.swap(false, SeqCst) {
            let _ = self.inside.lock().unwrap().take().unwrap().send(slot);
            let g = self.go.lock().unwrap().take().unwrap();
            let _ = g.recv();
        }
        true
    }
}

/// A shadow the app released goes back to the spares; another thread's hit
/// takes it out and refills it without the lock. A second `ibv_dereg_mr` (or an
/// `ibv_rereg_mr`) of the old handle in that moment is a double release: answered as one,
/// never `NotOurs` (the preload would pass a copy of a cached MR to libibverbs), and it
/// takes nothing from the hit that is refilling it.
#[test]
fn a_second_release_of_a_shadow_being_refilled_is_a_double_release() {
    let (inside_tx, inside_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let p = Refilling {
        inner: Provider::new(None),
        hold: AtomicBool::new(false),
        inside: Mutex::new(Some(inside_tx)),
        go: Mutex::new(Some(go_rx)),
    };
    let c = cache(&p);
    let req = request(0x100, 0x10_0000, 8192);
    let (primary, o) = c.acquire(&req).unwrap();
    assert_eq!(o, Outcome::Miss);
    let (shadow, o) = c.acquire(&req).unwrap();
    assert_eq!(o, Outcome::Hit);
    assert_ne!(shadow, primary, "a second user gets a shadow");
    assert_eq!(c.release(shadow), Released::Kept);
    p.hold.store(true, SeqCst);
    std::thread::scope(|s| {
        let refill = s.spawn(|| c.acquire(&req).unwrap());
        let slot = inside_rx.recv().unwrap();
        assert_eq!(slot, shadow, "the spare shadow is being refilled");
        let second = c.release(shadow);
        let rereg = c.detach(shadow);
        go_tx.send(()).unwrap();
        let (again, o) = refill.join().unwrap();
        assert_eq!(
            (second, rereg),
            (Released::DoubleRelease, Detached::Released),
            "ibv_dereg_mr / ibv_rereg_mr of a shadow being refilled by another thread"
        );
        assert_eq!((again, o), (shadow, Outcome::Hit));
    });
    assert_eq!(c.release(shadow), Released::Kept);
    assert_eq!(c.release(primary), Released::Kept);
    assert_eq!(c.release(shadow), Released::DoubleRelease);
    let snap = c.snapshot();
    assert_eq!(
        (snap.entries, snap.idle),
        (1, 1),
        "the entry is idle, held by nobody"
    );
}

/// `ibv_rereg_mr` of the app's only handle after its buffer was unmapped:
/// the entry is dead (drained) or about to be (not drained yet); either way the app holds
/// it alone and gets it back to change it.
#[test]
fn detach_of_the_sole_handle_works_before_and_after_the_drain() {
    for drained in [false, true] {
        let p = Provider::new(None);
        let c = cache(&p);
        let req = request(0x100, 0x10_0000, 8192);
        let (h, o) = c.acquire(&req).unwrap();
        assert_eq!(o, Outcome::Miss);
        c.invalidate_begin(req.addr, req.addr + req.len);
        c.invalidate_end();
        if drained {
            c.drain_pending();
        }
        let d = c.detach(h);
        assert_eq!(
            d,
            Detached::Sole(Mr {
                ptr: h,
                via_wrapper: false
            }),
            "drained: {drained}"
        );
        assert_eq!(c.snapshot().entries, 0, "drained: {drained}");
        assert!(p.live.lock().unwrap().contains(&h), "the app's now");
        c.adopt_uncached(Mr {
            ptr: h,
            via_wrapper: false,
        });
        c.drain_pending();
        assert_eq!(c.release(h), Released::Deregistered);
        assert!(p.live.lock().unwrap().is_empty());
    }
    // A dead entry that another user holds too (through a shadow) stays Shared.
    let p = Provider::new(None);
    let c = cache(&p);
    let req = request(0x100, 0x10_0000, 8192);
    let (h, _) = c.acquire(&req).unwrap();
    let (shadow, _) = c.acquire(&req).unwrap();
    c.invalidate(req.addr, req.addr + req.len);
    assert_eq!(c.detach(h), Detached::Shared);
    assert_eq!(c.release(shadow), Released::Kept);
    assert_eq!(c.release(h), Released::Deregistered);
    assert!(p.live.lock().unwrap().is_empty());
}

/// `ibv_rereg_mr` of handles the app already released is a double release:
/// the provider's pointer of an idle entry, a spare shadow, a deregistered MR. Each entry
/// stays as it was.
#[test]
fn detach_of_a_released_handle_is_a_double_release() {
    let p = Provider::new(None);
    let c = cache(&p);
    let req = request(0x100, 0x10_0000, 8192);
    let (h, _) = c.acquire(&req).unwrap();
    assert_eq!(c.release(h), Released::Kept);
    assert_eq!(c.detach(h), Detached::Released, "an idle entry's MR");
    let (again, o) = c.acquire(&req).unwrap();
    assert_eq!((again, o), (h, Outcome::Hit), "still cached");
    let (shadow, _) = c.acquire(&req).unwrap();
    assert_ne!(shadow, h);
    assert_eq!(c.release(shadow), Released::Kept);
    assert_eq!(c.detach(shadow), Detached::Released, "a spare shadow");
    assert_eq!(
        c.detach(h),
        Detached::Sole(Mr {
            ptr: h,
            via_wrapper: false
        })
    );
    c.adopt_uncached(Mr {
        ptr: h,
        via_wrapper: false,
    });
    assert_eq!(c.release(h), Released::Deregistered);
    assert_eq!(c.detach(h), Detached::Released, "a deregistered MR");
    assert_eq!(c.detach(0x1234_5678), Detached::NotOurs);
}
