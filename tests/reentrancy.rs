//! Memory hooks firing inside the cache: the hazards that deadlocked or corrupted other
//! caches.
//!
//! - libfabric #9594: the allocator calls `madvise` while a registration is being made
//!   (and the cache holds its lock while it allocates).
//! - UCX `unmap_dereg_with_lock`: memory is unmapped while the cache lock is held, and a
//!   deregistration itself unmaps memory.
//!
//! This binary's global allocator reports every freed or moved block to the cache's
//! invalidation queue exactly as the preload's munmap/madvise hooks would, from whatever
//! thread and inside whatever lock the free happens. The registrar also allocates inside
//! register and unmaps inside deregister. Any hook path that took the cache lock would
//! deadlock here (the test would hang). Staleness itself is `cache_model.rs`'s subject;
//! here the second test checks that an unmap made by a deregistration is not lost.
//!
//! A test target of its own (not a module of tests/cache/): the global allocator below
//! would put every other test of the process behind the hook path.

use mrcache::access::{LOCAL_WRITE, REMOTE_WRITE};
use mrcache::cache::{Cache, Limits, Mr, Outcome, Registrar, Released, Request};
use mrcache::invalidation::InvalidationQueue;
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};

static QUEUE: InvalidationQueue = InvalidationQueue::new();
/// For the single-threaded test, away from the allocator's traffic on QUEUE.
static QUIET_QUEUE: InvalidationQueue = InvalidationQueue::new();
static HOOKED_FREES: AtomicU64 = AtomicU64::new(0);
static ARMED: AtomicBool = AtomicBool::new(false);

/// An allocator that "madvises" every block it frees, through the hook path.
struct UnmappingAllocator;

// SAFETY: delegates to System; the extra work touches only atomics (no allocation).
unsafe impl GlobalAlloc for UnmappingAllocator {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if ARMED.load(SeqCst) {
            HOOKED_FREES.fetch_add(1, SeqCst);
            QUEUE.begin(p as usize, p as usize + l.size().max(1));
            // SAFETY: forwarded as is.
            unsafe { System.dealloc(p, l) };
            QUEUE.end();
        } else {
            // SAFETY: forwarded as is.
            unsafe { System.dealloc(p, l) }
        }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if ARMED.load(SeqCst) {
            HOOKED_FREES.fetch_add(1, SeqCst);
            QUEUE.begin(p as usize, p as usize + l.size().max(1));
            // SAFETY: forwarded as is.
            let q = unsafe { System.realloc(p, l, new) };
            QUEUE.end();
            q
        } else {
            // SAFETY: forwarded as is.
            unsafe { System.realloc(p, l, new) }
        }
    }
}

#[global_allocator]
static ALLOC: UnmappingAllocator = UnmappingAllocator;

const PAGE: usize = 4096;
const BASE: usize = 0x4000_0000;
const PAGES: usize = 64;

/// Fake HCA over fake pages with generations (see cache_model.rs), which also unmaps a
/// scratch page of the fake address space inside every register and deregister.
struct UnmappingHca {
    queue: &'static InvalidationQueue,
    /// A page (index + 1) that another thread unmaps while a registration is being made.
    during_register: AtomicUsize,
    gens: Vec<AtomicU64>,
    live: Mutex<HashMap<usize, (Request, Vec<u64>)>>,
    next: AtomicUsize,
    double: AtomicU64,
}

impl UnmappingHca {
    fn new(queue: &'static InvalidationQueue) -> UnmappingHca {
        UnmappingHca {
            queue,
            during_register: AtomicUsize::new(0),
            gens: (0..PAGES).map(|_| AtomicU64::new(0)).collect(),
            live: Mutex::new(HashMap::new()),
            next: AtomicUsize::new(1),
            double: AtomicU64::new(0),
        }
    }

    fn pages(addr: usize, len: usize) -> std::ops::Range<usize> {
        (addr - BASE) / PAGE..(addr + len - BASE).div_ceil(PAGE)
    }
    /// The app (or the provider) unmaps a page and maps a new one there.
    fn replace(&self, page: usize) {
        self.queue
            .begin(BASE + page * PAGE, BASE + (page + 1) * PAGE);
        self.gens[page].fetch_add(1, SeqCst);
        self.queue.end();
    }
}

impl Registrar for &UnmappingHca {
    fn register(&self, req: &Request) -> Result<Mr, i32> {
        // libfabric #9594: the allocator madvises in the middle of a registration.
        let scratch: Vec<u8> = vec![0; 4096];
        drop(scratch);
        let page = self.during_register.swap(0, SeqCst);
        if page > 0 {
            self.replace(page - 1);
        }
        let gens = UnmappingHca::pages(req.addr, req.len)
            .map(|p| self.gens[p].load(SeqCst))
            .collect();
        let ptr = 0x7000_0000 + self.next.fetch_add(1, SeqCst) * 64;
        self.live.lock().unwrap().insert(ptr, (*req, gens));
        Ok(Mr {
            ptr,
            via_wrapper: false,
        })
    }
    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        // UCX unmap_dereg_with_lock: deregistration frees (unmaps) memory of its own.
        self.replace(PAGES - 1);
        if self.live.lock().unwrap().remove(&mr.ptr).is_none() {
            self.double.fetch_add(1, SeqCst);
        }
        Ok(())
    }
    fn alloc_shadow(&self) -> Option<usize> {
        Some(0x9000_0000 + self.next.fetch_add(1, SeqCst) * 64)
    }
    fn fill_shadow(&self, _slot: usize, _mr: Mr, _addr: usize, _len: usize) -> bool {
        true
    }
}

#[test]
fn hooks_inside_the_cache_never_deadlock_or_lose_an_invalidation() {
    let hca = UnmappingHca::new(&QUEUE);
    let cache = Cache::with_queue(
        &hca,
        Limits {
            max_entries: 16,
            max_bytes: 1 << 30,
            shadow: true,
            remote_superset: false,
        },
        &QUEUE,
    );
    ARMED.store(true, SeqCst);
    let misses = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..4usize {
            let (cache, hca, misses) = (&cache, &hca, &misses);
            s.spawn(move || {
                let mut x = 0x9E37_79B9u32.wrapping_mul(t as u32 + 1);
                let mut rnd = move || {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as usize
                };
                for _ in 0..5000 {
                    let page = rnd() % (PAGES - 8);
                    let n = 1 + rnd() % 4;
                    let access = if rnd() % 2 == 0 {
                        LOCAL_WRITE
                    } else {
                        LOCAL_WRITE | REMOTE_WRITE
                    };
                    let addr = BASE + page * PAGE;
                    let req = Request {
                        pd: 1,
                        context: 1,
                        addr,
                        len: n * PAGE,
                        iova: addr as u64,
                        access,
                    };
                    let (h, o) = cache.acquire(&req).expect("acquire");
                    if o == Outcome::Miss {
                        misses.fetch_add(1, SeqCst);
                    }
                    if rnd() % 5 == 0 {
                        hca.replace(rnd() % (PAGES - 1));
                    }
                    assert!(matches!(
                        cache.release(h),
                        Released::Kept | Released::Deregistered
                    ));
                }
            });
        }
    });
    ARMED.store(false, SeqCst);
    cache.flush_all();
    assert!(
        HOOKED_FREES.load(SeqCst) > 1000,
        "the allocator hook must have fired inside the cache"
    );
    assert_eq!(hca.double.load(SeqCst), 0, "an MR was deregistered twice");
    assert!(hca.live.lock().unwrap().is_empty(), "MRs leaked");
    assert!(misses.load(SeqCst) > 0);
}

/// After a deregistration unmapped memory that another cached entry covers, that entry
/// must not be hit.
#[test]
fn an_unmap_inside_a_deregistration_invalidates_other_entries() {
    let hca = UnmappingHca::new(&QUIET_QUEUE);
    let cache = Cache::with_queue(
        &hca,
        Limits {
            max_entries: 1,
            max_bytes: 1 << 30,
            shadow: true,
            remote_superset: false,
        },
        &QUIET_QUEUE,
    );
    let last = BASE + (PAGES - 1) * PAGE;
    let a = Request {
        pd: 1,
        context: 1,
        addr: last,
        len: PAGE,
        iova: last as u64,
        access: LOCAL_WRITE,
    };
    let b = Request {
        addr: BASE,
        iova: BASE as u64,
        ..a
    };
    let (h, _) = cache.acquire(&a).unwrap();
    cache.release(h);
    // Evicting `a` to make room for `b` deregisters it, which unmaps the last page: the
    // page `a` covered. A new registration of `a` must not come from anything stale.
    let (h, ob) = cache.acquire(&b).unwrap();
    assert_eq!(
        ob,
        Outcome::Miss,
        "an unmap elsewhere during a registration must not stop it being cached"
    );
    cache.release(h);
    let (h, o) = cache.acquire(&a).unwrap();
    // Registering `a` again evicts `b`, whose deregistration unmaps `a`'s page once more,
    // before `a` is registered: a new registration, of the new page.
    assert_ne!(o, Outcome::Hit);
    let (r, gens) = hca.live.lock().unwrap().get(&h).cloned().unwrap();
    assert_eq!(r, a);
    assert_eq!(gens, vec![hca.gens[PAGES - 1].load(SeqCst)]);
    cache.release(h);
    cache.flush_all();
}

/// An unmap of the registered range while the registration pins pages: the result may hold
/// the old pages, so it must not be cached; an unmap elsewhere changes nothing.
#[test]
fn an_unmap_during_a_registration_keeps_only_that_range_out_of_the_cache() {
    static Q: InvalidationQueue = InvalidationQueue::new();
    let hca = UnmappingHca::new(&Q);
    let cache = Cache::with_queue(
        &hca,
        Limits {
            max_entries: 8,
            max_bytes: 1 << 30,
            shadow: true,
            remote_superset: false,
        },
        &Q,
    );
    let a = Request {
        pd: 1,
        context: 1,
        addr: BASE + 4 * PAGE,
        len: 2 * PAGE,
        iova: (BASE + 4 * PAGE) as u64,
        access: LOCAL_WRITE,
    };
    hca.during_register.store(5 + 1, SeqCst); // page 5: inside `a`
    let (h, o) = cache.acquire(&a).unwrap();
    assert_eq!(
        o,
        Outcome::Uncached,
        "pinned while its pages were being replaced"
    );
    cache.release(h);
    hca.during_register.store(20 + 1, SeqCst); // page 20: elsewhere
    let (h, o) = cache.acquire(&a).unwrap();
    assert_eq!(o, Outcome::Miss);
    cache.release(h);
    cache.flush_all();
}
