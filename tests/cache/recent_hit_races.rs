//! The recent-hit release (`src/cache/recent.rs`): a release that finds its
//! slot through the word a hit left must never give back a holding that is not the
//! caller's. Threads on small, adjacent stacks (so their recent-hit lines collide) hit and
//! release private keys, hand handles to another thread to release, release pointers the
//! cache never handed out and pointers they already released, while another thread
//! invalidates and a small entry limit evicts (slots reused under the words). A wrong
//! release shows as the owner's own release failing (`DoubleRelease`/`NotOurs`), a handle
//! no longer live, or a double deregistration.

use mrcache::cache::{Cache, Detached, Limits, Mr, Registrar, Released, Request};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, mpsc};

struct Fake {
    next: AtomicUsize,
    /// Reuse freed MR pointers (LIFO), as malloc does for `struct ibv_mr`.
    reuse: bool,
    free: Mutex<Vec<usize>>,
    live: Mutex<HashMap<usize, (usize, usize, usize)>>,
    bad_deregs: AtomicUsize,
}

impl Fake {
    fn new(reuse: bool) -> Fake {
        Fake {
            next: AtomicUsize::new(1),
            reuse,
            free: Mutex::new(Vec::new()),
            live: Mutex::new(HashMap::new()),
            bad_deregs: AtomicUsize::new(0),
        }
    }
}

impl Registrar for &Fake {
    fn register(&self, r: &Request) -> Result<Mr, i32> {
        let reused = if self.reuse {
            self.free.lock().unwrap().pop()
        } else {
            None
        };
        let ptr = reused.unwrap_or_else(|| 0x1000 * self.next.fetch_add(1, SeqCst));
        self.live.lock().unwrap().insert(ptr, (r.pd, r.addr, r.len));
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
        self.free.lock().unwrap().push(mr.ptr);
        Ok(())
    }
    fn alloc_shadow(&self) -> Option<usize> {
        Some((1 << 44) + 256 * self.next.fetch_add(1, SeqCst))
    }
    fn fill_shadow(&self, _: usize, _: Mr, _: usize, _: usize) -> bool {
        true
    }
}

/// Counts a hitter out however it leaves (a panic too).
struct Gone<'a>(&'a AtomicUsize);
impl Drop for Gone<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
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

const KEYS: usize = 64;
const THREADS: usize = 4;

fn req(t: usize, k: usize) -> Request {
    let addr = 0x1000_0000 + (t * KEYS + k) * 0x2000;
    Request {
        pd: 0x10,
        context: 0x20,
        addr,
        len: 0x1000,
        iova: addr as u64,
        access: 1,
    }
}

fn live_as(fake: &Fake, h: usize, r: &Request) -> bool {
    fake.live.lock().unwrap().get(&h) == Some(&(r.pd, r.addr, r.len))
}

/// `reuse`: the provider reuses MR pointers, so a second release can name another thread's
/// entry whatever the cache does: only held handles are checked then.
fn run(reuse: bool, max_entries: usize, seed: u64, rounds: usize) {
    let fake = Fake::new(reuse);
    let cache = Cache::new(
        &fake,
        Limits {
            max_entries,
            max_bytes: u64::MAX,
            shadow: false,
            remote_superset: false,
        },
    );
    let running = AtomicUsize::new(THREADS);
    let wrong = AtomicUsize::new(0);
    std::thread::scope(|s| {
        // Handles released by the next thread: a release on another stack than the hit.
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS)
            .map(|_| mpsc::channel::<(Request, usize)>())
            .unzip();
        let mut rxs: Vec<Option<mpsc::Receiver<(Request, usize)>>> =
            rxs.into_iter().map(Some).collect();
        for t in 0..THREADS {
            let (cache, fake, running, wrong) = (&cache, &fake, &running, &wrong);
            let tx = txs[(t + 1) % THREADS].clone();
            let rx = rxs[t].take().unwrap();
            // 64 KiB stacks: neighbours' stacks share the 64 KiB regions the line is
            // picked by, or hash to one line.
            std::thread::Builder::new()
                .stack_size(64 << 10)
                .spawn_scoped(s, move || {
                    let _gone = Gone(running);
                    let mut rng = Rng(seed * 7919 + t as u64 + 1);
                    let mut held: Vec<(Request, usize)> = Vec::new();
                    let mut released: Vec<usize> = Vec::new();
                    let fail = |what: String| {
                        eprintln!("thread {t}: {what}");
                        wrong.fetch_add(1, SeqCst);
                    };
                    for i in 0..rounds {
                        let r = req(t, rng.next() % KEYS);
                        let h = match cache.try_hit(&r) {
                            Some(h) => h,
                            None => cache.acquire(&r).unwrap().0,
                        };
                        if !live_as(fake, h, &r) {
                            fail(format!("round {i}: handed out {h:#x} not live for {r:?}"));
                        }
                        held.push((r, h));
                        // A pointer never handed out, landing on some thread's words.
                        let foreign = h + 8 + 16 * (rng.next() % 64);
                        let f = cache.release(foreign);
                        if f != Released::NotOurs {
                            fail(format!("foreign {foreign:#x} released: {f:?}"));
                        }
                        if !reuse
                            && let Some(&old) = released.last()
                            && !held.iter().any(|&(_, h)| h == old)
                        {
                            // A second release of a handle already given back.
                            let again = cache.release(old);
                            if matches!(again, Released::Kept | Released::Deregistered) {
                                fail(format!("second release of {old:#x}: {again:?}"));
                            }
                        }
                        // Handed on only when second releases are not tried: a handle
                        // the next thread holds may be this one's again.
                        if reuse && rng.next() % 8 == 0 {
                            let (r, h) = held.swap_remove(rng.next() % held.len());
                            tx.send((r, h)).unwrap();
                        }
                        while let Ok((r, h)) = rx.try_recv() {
                            held.push((r, h));
                        }
                        if !held.is_empty() && (held.len() > 3 || rng.next() % 2 == 0) {
                            let (r, h) = held.swap_remove(rng.next() % held.len());
                            if !live_as(fake, h, &r) {
                                fail(format!("held {h:#x} no longer live for {r:?}"));
                            }
                            let got = match cache.try_release(h) {
                                Some(x) => x,
                                None => cache.release(h),
                            };
                            if !matches!(got, Released::Kept | Released::Deregistered) {
                                fail(format!("release of held {h:#x}: {got:?}"));
                            }
                            released.push(h);
                            if released.len() > 8 {
                                released.remove(0);
                            }
                        }
                    }
                    running.fetch_sub(1, SeqCst);
                    std::mem::forget(_gone);
                    // Take what is still sent to us until everyone stopped sending.
                    while running.load(SeqCst) > 0 {
                        while let Ok(x) = rx.try_recv() {
                            held.push(x);
                        }
                        std::thread::yield_now();
                    }
                    drop(tx);
                    while let Ok(x) = rx.try_recv() {
                        held.push(x);
                    }
                    for (r, h) in held {
                        if !live_as(fake, h, &r) {
                            fail(format!("held {h:#x} no longer live at the end"));
                        }
                        let got = cache.release(h);
                        if !matches!(got, Released::Kept | Released::Deregistered) {
                            fail(format!("final release of held {h:#x}: {got:?}"));
                        }
                    }
                })
                .unwrap();
        }
        drop(txs);
        let mut rng = Rng(seed + 99);
        while running.load(SeqCst) > 0 {
            let r = req(rng.next() % THREADS, rng.next() % KEYS);
            cache.invalidate(r.addr, r.addr + 0x1000);
            for _ in 0..50 {
                std::thread::yield_now();
            }
        }
    });
    assert_eq!(wrong.load(SeqCst), 0, "wrong releases (see stderr)");
    cache.flush_all();
    assert_eq!(fake.bad_deregs.load(SeqCst), 0, "deregistered twice");
    assert_eq!(fake.live.lock().unwrap().len(), 0, "left registered");
}

#[test]
fn recent_hit_releases_under_churn_unique_pointers() {
    for seed in 0..4 {
        run(false, 48, seed, 20_000);
    }
}

#[test]
fn recent_hit_releases_under_churn_reused_pointers() {
    for seed in 0..4 {
        run(true, 48, seed, 20_000);
    }
}

/// `ibv_rereg_mr`'s detach after a lock-free hit: the slot keeps one dead holding of the
/// pointer (the app's now); the recent word names it. The app's later `ibv_dereg_mr` must
/// reach the provider, not be "kept" by the word.
#[test]
fn a_detached_handle_after_a_lock_free_hit_is_the_apps() {
    let fake = Fake::new(false);
    let cache = Cache::new(
        &fake,
        Limits {
            max_entries: 16,
            max_bytes: u64::MAX,
            shadow: false,
            remote_superset: false,
        },
    );
    let r = req(0, 1);
    let (h, _) = cache.acquire(&r).unwrap();
    assert_eq!(cache.release(h), Released::Kept);
    assert_eq!(
        cache.try_hit(&r),
        Some(h),
        "a lock-free hit writes the word"
    );
    let mr = Mr {
        ptr: h,
        via_wrapper: false,
    };
    assert_eq!(cache.detach(h), Detached::Sole(mr));
    assert_eq!(
        cache.try_release(h),
        None,
        "the word released a detached handle"
    );
    cache.adopt_uncached(mr);
    assert_eq!(cache.release(h), Released::Deregistered);
    assert!(fake.live.lock().unwrap().is_empty());
    assert_eq!(cache.release(h), Released::DoubleRelease);
}
