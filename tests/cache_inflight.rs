//! Deregistrations in flight (taken out of the cache, inside the provider): a panic or a
//! reused MR pointer must not make a flush wait for nothing or return too early.

use mrcache::access::LOCAL_WRITE;
use mrcache::cache::{Cache, Limits, Mr, Outcome, Registrar, Request};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

fn limits() -> Limits {
    Limits {
        max_entries: 64,
        max_bytes: 1 << 30,
        shadow: true,
        remote_superset: false,
    }
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

// ---------------------------------------------------------------------------------------
// Finding 1: a panic in the first of several deregistrations strands the rest in in_flight.

struct PanicOnce {
    live: Mutex<HashSet<usize>>,
    next: AtomicUsize,
    panic_next: AtomicBool,
}

impl Registrar for &PanicOnce {
    fn register(&self, _req: &Request) -> Result<Mr, i32> {
        let ptr = 0x7000_0000 + self.next.fetch_add(1, SeqCst) * 64;
        self.live.lock().unwrap().insert(ptr);
        Ok(Mr {
            ptr,
            via_wrapper: false,
        })
    }
    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        if self.panic_next.swap(false, SeqCst) {
            panic!("provider bug inside deregister");
        }
        self.live.lock().unwrap().remove(&mr.ptr);
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
fn a_panic_in_one_of_several_deregistrations_leaves_nothing_behind() {
    let p = PanicOnce {
        live: Mutex::new(HashSet::new()),
        next: AtomicUsize::new(1),
        panic_next: AtomicBool::new(false),
    };
    let c = Cache::new(&p, limits());
    for i in 0..2 {
        let (h, o) = c
            .acquire(&request(0x100, 0x10_0000 + i * 0x1_0000, 4096))
            .unwrap();
        assert_eq!(o, Outcome::Miss);
        c.release(h);
    }
    p.panic_next.store(true, SeqCst);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.flush_pd(0x100)));
    assert!(r.is_err());
    // Every later flush (dealloc_pd, close_device, and flush_all in every fork's prepare
    // handler) now waits FLUSH_WAIT for the MR the panic skipped.
    let t = Instant::now();
    c.flush_all();
    let waited = t.elapsed();
    eprintln!(
        "flush_all after the panic took {waited:?}; provider still holds {} MR(s), cache entries {}",
        p.live.lock().unwrap().len() - 1,
        c.snapshot().entries
    );
    assert!(
        waited < Duration::from_millis(500),
        "flush_all waited {waited:?} for an MR stranded in in_flight by a panic"
    );
}

// ---------------------------------------------------------------------------------------
// Finding 2: in_flight is keyed by MR pointer; a provider that reuses the pointer of an MR
// it just freed lets the first deregistration's guard erase the second's record.

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
    let c = Cache::new(&p, limits());
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
