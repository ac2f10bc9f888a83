//! The cache against a model: random interleavings of register, release, invalidate (with
//! the memory really changing under the range), flush and limits, single- and
//! multi-threaded, with a fake provider that pins "pages" the way an HCA does.
//!
//! Checked on every step: each pointer the app holds resolves to a live provider MR that
//! covers the requested range on the same PD with compatible rights, and that MR pinned
//! the pages that back the range *now* (never stale); limits hold; no MR is deregistered
//! twice or while in use; at the end nothing is leaked.

use mrcache::access::{self, LOCAL_WRITE, REMOTE_READ, REMOTE_WRITE};
use mrcache::cache::{AcquireError, Cache, Limits, Mr, Outcome, Registrar, Released, Request};
use mrcache::stats::Counter;
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};

const PAGE: usize = 4096;
const PAGES: usize = 48;
const BASE: usize = 0x10_0000;

/// A fake provider over fake memory: each page has a generation that changes when the page
/// is replaced (unmap + new mapping). A registration pins the generations it saw.
struct FakeHca {
    gens: Vec<AtomicU64>,
    /// Seqlock over page replacement: odd while pages are being replaced.
    replacing: AtomicU64,
    live: Mutex<HashMap<usize, FakeMr>>,
    shadows: Mutex<HashMap<usize, (usize, usize, usize)>>,
    next: AtomicUsize,
    violations: Mutex<Vec<String>>,
    /// Simulated RLIMIT_MEMLOCK in pages: registration beyond it fails with ENOMEM.
    pin_limit: usize,
    pinned: AtomicUsize,
    registrations: AtomicUsize,
}

#[derive(Clone)]
struct FakeMr {
    req: Request,
    gens: Vec<u64>,
}

impl FakeHca {
    fn new(pin_limit: usize) -> FakeHca {
        FakeHca {
            gens: (0..PAGES).map(|_| AtomicU64::new(0)).collect(),
            replacing: AtomicU64::new(0),
            live: Mutex::new(HashMap::new()),
            shadows: Mutex::new(HashMap::new()),
            next: AtomicUsize::new(1),
            violations: Mutex::new(Vec::new()),
            pin_limit,
            pinned: AtomicUsize::new(0),
            registrations: AtomicUsize::new(0),
        }
    }

    fn pages(addr: usize, len: usize) -> std::ops::Range<usize> {
        (addr - BASE) / PAGE..(addr + len - BASE).div_ceil(PAGE)
    }

    fn violation(&self, s: String) {
        self.violations.lock().unwrap().push(s);
    }

    /// The app unmaps [addr, addr+len) and maps new memory there.
    fn replace_pages(&self, addr: usize, len: usize) {
        self.replacing.fetch_add(1, SeqCst);
        for p in Self::pages(addr, len) {
            self.gens[p].fetch_add(1, SeqCst);
        }
        self.replacing.fetch_add(1, SeqCst);
    }

    /// Check what the app got for `req`. `seq` is the seqlock value read before the
    /// acquire; a check that overlapped a page replacement is inconclusive and skipped.
    fn check(&self, handle: usize, req: &Request, seq: u64) {
        let target = match self.shadows.lock().unwrap().get(&handle) {
            Some(&(mr, addr, len)) => {
                if (addr, len) != (req.addr, req.len) {
                    self.violation(format!(
                        "shadow {handle:#x} says {addr:#x}+{len}, app asked {req:?}"
                    ));
                }
                mr
            }
            None => handle,
        };
        let Some(mr) = self.live.lock().unwrap().get(&target).cloned() else {
            self.violation(format!(
                "handle {handle:#x} for {req:?} resolves to a dead MR {target:#x}"
            ));
            return;
        };
        let r = mr.req;
        if r.pd != req.pd || r.addr > req.addr || r.addr + r.len < req.addr + req.len {
            self.violation(format!("MR {r:?} does not cover request {req:?}"));
        }
        if !access::can_serve(
            r.access,
            (r.addr, r.addr + r.len),
            req.access,
            (req.addr, req.addr + req.len),
            false,
        ) {
            self.violation(format!("MR {r:?} grants other rights than request {req:?}"));
        }
        let first = Self::pages(r.addr, r.len).start;
        let stale =
            Self::pages(req.addr, req.len).any(|p| self.gens[p].load(SeqCst) != mr.gens[p - first]);
        let after = self.replacing.load(SeqCst);
        if stale && seq == after && seq % 2 == 0 {
            self.violation(format!(
                "STALE: handle {handle:#x} for {req:?} pins pages replaced since registration"
            ));
        }
    }
}

impl Registrar for &FakeHca {
    fn register(&self, req: &Request) -> Result<Mr, i32> {
        let pages = FakeHca::pages(req.addr, req.len);
        let n = pages.len();
        if self.pinned.fetch_add(n, SeqCst) + n > self.pin_limit {
            self.pinned.fetch_sub(n, SeqCst);
            return Err(12);
        }
        self.registrations.fetch_add(1, SeqCst);
        let gens = pages.map(|p| self.gens[p].load(SeqCst)).collect();
        let ptr = 0x7000_0000 + self.next.fetch_add(1, SeqCst) * 64;
        self.live
            .lock()
            .unwrap()
            .insert(ptr, FakeMr { req: *req, gens });
        Ok(Mr {
            ptr,
            via_wrapper: false,
        })
    }

    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        match self.live.lock().unwrap().remove(&mr.ptr) {
            Some(m) => {
                self.pinned
                    .fetch_sub(FakeHca::pages(m.req.addr, m.req.len).len(), SeqCst);
                Ok(())
            }
            None => {
                self.violation(format!(
                    "deregister of unknown or already deregistered MR {:#x}",
                    mr.ptr
                ));
                Err(22)
            }
        }
    }

    fn alloc_shadow(&self) -> Option<usize> {
        Some(0x9000_0000 + self.next.fetch_add(1, SeqCst) * 64)
    }

    fn fill_shadow(&self, slot: usize, mr: Mr, addr: usize, len: usize) -> bool {
        self.shadows
            .lock()
            .unwrap()
            .insert(slot, (mr.ptr, addr, len));
        true
    }
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        pd: usize,
        page: usize,
        pages: usize,
        access: u32,
    },
    Release(usize),
    /// The app unmaps and remaps a range (the hook invalidates before the change).
    Unmap {
        page: usize,
        pages: usize,
    },
    FlushPd(usize),
}

fn op() -> impl Strategy<Value = Op> {
    op_in(PAGES - 8, 8)
}

/// Operations over `pages` start pages and lengths below `max_len` pages.
fn op_in(pages: usize, max_len: usize) -> impl Strategy<Value = Op> {
    let access = prop::sample::select(vec![
        LOCAL_WRITE,
        0,
        LOCAL_WRITE | REMOTE_WRITE,
        LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ,
    ]);
    prop_oneof![
        6 => (0..2usize, 0..pages, 1..max_len, access).prop_map(|(pd, page, pages, access)| Op::Acquire { pd, page, pages, access }),
        4 => any::<usize>().prop_map(Op::Release),
        2 => (0..pages, 1..max_len).prop_map(|(page, pages)| Op::Unmap { page, pages }),
        1 => (0..2usize).prop_map(Op::FlushPd),
    ]
}

fn limits() -> impl Strategy<Value = Limits> {
    (1..12usize, 2..64u64, any::<bool>()).prop_map(|(e, p, shadow)| Limits {
        max_entries: e,
        max_bytes: p * PAGE as u64,
        shadow,
        remote_superset: false,
    })
}

/// A cache over `hca` with shadows on and room for `max_entries`.
fn cache_of(hca: &FakeHca, max_entries: usize) -> Cache<&FakeHca> {
    Cache::new(
        hca,
        Limits {
            max_entries,
            max_bytes: 1 << 30,
            shadow: true,
            remote_superset: false,
        },
    )
}

fn request(pd: usize, page: usize, pages: usize, access: u32) -> Request {
    // Ranges are not page-aligned at the start half of the time, like real buffers.
    let addr = BASE + page * PAGE + if page % 2 == 1 { 100 } else { 0 };
    Request {
        pd: 0x100 + pd,
        context: 0x50,
        addr,
        len: pages * PAGE - 200,
        iova: addr as u64,
        access,
    }
}

/// Run `ops` on one thread against `cache`. Returns the handles still held.
fn run_ops(cache: &Cache<&FakeHca>, hca: &FakeHca, ops: &[Op]) -> Vec<usize> {
    let mut held: Vec<(usize, Request)> = Vec::new();
    for op in ops {
        match *op {
            Op::Acquire {
                pd,
                page,
                pages,
                access,
            } => {
                let req = request(pd, page, pages, access);
                let seq = hca.replacing.load(SeqCst);
                match cache.acquire(&req) {
                    Ok((h, _)) => {
                        hca.check(h, &req, seq);
                        held.push((h, req));
                    }
                    // Out of pinnable memory is the app's own failure only when every pinned
                    // page is held by the app: the cache must have given back all idle ones.
                    Err(AcquireError::Failed(12)) if cache.snapshot().idle == 0 => {}
                    Err(e) => hca.violation(format!(
                        "acquire {req:?} failed: {e:?} with {} idle entries",
                        cache.snapshot().idle
                    )),
                }
            }
            Op::Release(i) if !held.is_empty() => {
                let (h, _) = held.swap_remove(i % held.len());
                match cache.release(h) {
                    Released::Kept | Released::Deregistered => {}
                    other => hca.violation(format!("release of held handle {h:#x}: {other:?}")),
                }
            }
            Op::Release(_) => {}
            Op::Unmap { page, pages } => {
                let (a, len) = (BASE + page * PAGE, pages * PAGE);
                cache.invalidate_begin(a, a + len);
                // Widen the window between the hook and the unmap itself, where another
                // thread's registration still pins the old pages.
                std::thread::yield_now();
                hca.replace_pages(a, len);
                cache.invalidate_end();
            }
            Op::FlushPd(pd) => {
                cache.flush_pd(0x100 + pd);
            }
        }
        let s = cache.snapshot();
        let l = cache.limits();
        if s.entries > l.max_entries as u64 || s.bytes > l.max_bytes {
            hca.violation(format!(
                "limits exceeded: {} entries, {} bytes, limits {l:?}",
                s.entries, s.bytes
            ));
        }
    }
    held.into_iter().map(|(h, _)| h).collect()
}

fn finish(cache: &Cache<&FakeHca>, hca: &FakeHca, held: Vec<usize>) -> Result<(), TestCaseError> {
    for h in held {
        let r = cache.release(h);
        prop_assert!(
            matches!(r, Released::Kept | Released::Deregistered),
            "final release: {:?}",
            r
        );
    }
    cache.flush_all();
    let v = hca.violations.lock().unwrap().clone();
    prop_assert!(v.is_empty(), "violations:\n{}", v.join("\n"));
    let live = hca.live.lock().unwrap().len();
    prop_assert_eq!(
        live,
        0,
        "MRs leaked after releasing everything and flushing"
    );
    prop_assert_eq!(cache.snapshot().entries, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn single_thread_matches_the_model(limits in limits(), pin_limit in 8..200usize, ops in prop::collection::vec(op(), 1..120)) {
        let hca = FakeHca::new(pin_limit);
        let cache = Cache::new(&hca, limits);
        let held = run_ops(&cache, &hca, &ops);
        finish(&cache, &hca, held)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn four_threads_never_see_a_stale_or_dead_registration(
        limits in limits(),
        // A small key space, so that a wrongly cached registration is hit again.
        ops in prop::collection::vec(prop::collection::vec(op_in(12, 3), 200..400), 4),
    ) {
        let hca = FakeHca::new(usize::MAX / 2);
        let cache = Cache::new(&hca, limits);
        let held: Vec<usize> = std::thread::scope(|s| {
            let threads: Vec<_> = ops.iter().map(|o| s.spawn(|| run_ops(&cache, &hca, o))).collect();
            threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
        });
        finish(&cache, &hca, held)?;
    }
}

#[test]
fn repeated_registration_of_one_buffer_hits() {
    let hca = FakeHca::new(1000);
    let cache = cache_of(&hca, 8);
    let req = request(0, 2, 4, LOCAL_WRITE | REMOTE_WRITE);
    let (h, o) = cache.acquire(&req).unwrap();
    assert_eq!(o, Outcome::Miss);
    assert_eq!(cache.release(h), Released::Kept);
    for _ in 0..1000 {
        let (h2, o) = cache.acquire(&req).unwrap();
        assert_eq!(
            (h2, o),
            (h, Outcome::Hit),
            "an idle exact hit returns the provider's own pointer"
        );
        assert_eq!(cache.release(h2), Released::Kept);
    }
    assert_eq!(hca.registrations.load(SeqCst), 1);
    assert_eq!(cache.release(h), Released::DoubleRelease);
}

#[test]
fn two_live_users_get_distinct_pointers_and_release_in_any_order() {
    for first_primary in [true, false] {
        let hca = FakeHca::new(1000);
        let cache = cache_of(&hca, 8);
        let req = request(0, 2, 4, LOCAL_WRITE);
        let (a, _) = cache.acquire(&req).unwrap();
        let (b, o) = cache.acquire(&req).unwrap();
        assert_eq!(o, Outcome::Hit);
        assert_ne!(a, b, "the second concurrent user gets a shadow");
        let (x, y) = if first_primary { (a, b) } else { (b, a) };
        assert_eq!(cache.release(x), Released::Kept);
        assert_eq!(cache.release(y), Released::Kept);
        assert_eq!(cache.release(y), Released::DoubleRelease);
        assert_eq!(cache.snapshot().entries, 1);
        assert_eq!(cache.flush_all(), 1);
        assert!(hca.live.lock().unwrap().is_empty());
    }
}

#[test]
fn invalidation_while_in_use_defers_the_deregistration() {
    let hca = FakeHca::new(1000);
    let cache = cache_of(&hca, 8);
    let req = request(0, 2, 4, LOCAL_WRITE);
    let (h, _) = cache.acquire(&req).unwrap();
    cache.invalidate(req.addr + 5000, req.addr + 5001);
    assert_eq!(cache.snapshot().counts[Counter::Invalidated], 1);
    assert_eq!(
        hca.live.lock().unwrap().len(),
        1,
        "in use: not deregistered yet"
    );
    let (h2, o) = cache.acquire(&req).unwrap();
    assert_eq!(o, Outcome::Miss, "an invalidated entry is never hit");
    assert_eq!(cache.release(h), Released::Deregistered);
    assert_eq!(cache.release(h2), Released::Kept);
}

#[test]
fn a_registration_that_races_an_invalidation_is_not_cached() {
    let hca = FakeHca::new(1000);
    let cache = cache_of(&hca, 8);
    let req = request(0, 2, 4, LOCAL_WRITE);
    // An unmap hook has begun (entries dropped) but the syscall has not happened yet: a
    // registration now pins the old pages.
    cache.invalidate_begin(req.addr, req.addr + req.len);
    let (h, o) = cache.acquire(&req).unwrap();
    assert_eq!(o, Outcome::Uncached);
    cache.invalidate_end();
    assert_eq!(cache.release(h), Released::Deregistered);
    assert_eq!(cache.snapshot().entries, 0);
}

#[test]
fn enomem_evicts_idle_entries_and_retries() {
    let hca = FakeHca::new(8);
    let cache = cache_of(&hca, 100);
    let a = request(0, 0, 4, LOCAL_WRITE);
    let b = request(0, 10, 4, LOCAL_WRITE);
    let (h, _) = cache.acquire(&a).unwrap();
    cache.release(h);
    let (h2, _) = cache.acquire(&b).unwrap();
    cache.release(h2);
    // 8 pages pinned by two idle entries; a third needs room.
    let c = request(0, 20, 4, LOCAL_WRITE);
    let (h3, o) = cache.acquire(&c).unwrap();
    assert_eq!(o, Outcome::Miss);
    assert_eq!(cache.snapshot().counts[Counter::EvictionsEnomem], 2);
    cache.release(h3);
    // With everything in use, the provider's error reaches the app.
    let (h4, _) = cache.acquire(&a).unwrap();
    let (h5, _) = cache.acquire(&b).unwrap();
    assert_eq!(cache.acquire(&c).err(), Some(AcquireError::Failed(12)));
    cache.release(h4);
    cache.release(h5);
}

#[test]
fn full_cache_of_busy_entries_registers_uncached() {
    let hca = FakeHca::new(1000);
    let cache = cache_of(&hca, 1);
    let (h, _) = cache.acquire(&request(0, 0, 2, LOCAL_WRITE)).unwrap();
    let (h2, o) = cache.acquire(&request(0, 10, 2, LOCAL_WRITE)).unwrap();
    assert_eq!(o, Outcome::Uncached);
    assert_eq!(cache.release(h2), Released::Deregistered);
    assert_eq!(cache.release(h), Released::Kept);
}

#[test]
fn remote_requests_never_hit_a_larger_entry_and_pds_never_share() {
    let hca = FakeHca::new(1000);
    let cache = cache_of(&hca, 8);
    let big = request(0, 0, 8, LOCAL_WRITE | REMOTE_WRITE);
    let (h, _) = cache.acquire(&big).unwrap();
    let small = Request {
        addr: big.addr + PAGE,
        len: PAGE,
        iova: (big.addr + PAGE) as u64,
        ..big
    };
    let (h2, o) = cache.acquire(&small).unwrap();
    assert_eq!(
        o,
        Outcome::Miss,
        "remote access: containing entry must not serve"
    );
    let local = Request {
        access: LOCAL_WRITE,
        ..small
    };
    let local_big = Request {
        access: LOCAL_WRITE,
        ..big
    };
    let (h3, _) = cache.acquire(&local_big).unwrap();
    let (h4, o) = cache.acquire(&local).unwrap();
    assert_eq!(o, Outcome::HitContaining);
    let other_pd = Request {
        pd: big.pd + 1,
        ..big
    };
    let (h5, o) = cache.acquire(&other_pd).unwrap();
    assert_eq!(o, Outcome::Miss, "another PD never shares an MR");
    for x in [h, h2, h3, h4, h5] {
        cache.release(x);
    }
}

#[test]
fn fork_child_forgets_everything_without_deregistering() {
    let hca = FakeHca::new(1000);
    let cache = cache_of(&hca, 8);
    let a = request(0, 0, 2, LOCAL_WRITE);
    let b = request(0, 10, 2, LOCAL_WRITE | REMOTE_WRITE);
    let (ha, _) = cache.acquire(&a).unwrap();
    cache.release(ha);
    let (hb, _) = cache.acquire(&b).unwrap();
    let in_use = cache.fork_ranges();
    assert_eq!(
        in_use,
        vec![(b.addr, b.len)],
        "only entries in use need DONTFORK"
    );
    // The child replaces the inherited cache (never touched again: its lock may be held by
    // a thread the child does not have).
    let cache = cache.renewed(&hca);
    assert_eq!(
        hca.live.lock().unwrap().len(),
        2,
        "the child never deregisters the parent's MRs"
    );
    assert_eq!(cache.snapshot().entries, 0);
    assert_eq!(
        cache.release(hb),
        Released::NotOurs,
        "the parent's handles are unknown in the child"
    );
    let (h, o) = cache.acquire(&a).unwrap();
    assert_eq!(o, Outcome::Miss, "the child registers its own");
    cache.release(h);
}

#[test]
fn a_fork_childs_cache_keeps_the_parents_settings() {
    let hca = FakeHca::new(1000);
    let parent = cache_of(&hca, 8).with_remote(mrcache::config::RemoteMode::Bypass);
    let child = parent.renewed(&hca);
    assert_eq!(child.remote(), mrcache::config::RemoteMode::Bypass);
    assert_eq!(child.limits().max_entries, 8);
    assert_eq!(child.caching_stopped(), None);
    parent.stop_caching("test: blind monitor");
    let child = parent.renewed(&hca);
    assert_eq!(
        child.caching_stopped(),
        Some("test: blind monitor"),
        "a parent that stopped caching must not have a child that caches"
    );
    let (h, o) = child.acquire(&request(0, 0, 2, LOCAL_WRITE)).unwrap();
    assert_eq!(o, Outcome::Uncached);
    child.release(h);
}

#[test]
fn a_second_release_after_the_cache_deregistered_is_still_a_double_release() {
    let hca = FakeHca::new(1000);
    let cache = cache_of(&hca, 8);
    let req = request(0, 2, 4, LOCAL_WRITE);
    let (h, _) = cache.acquire(&req).unwrap();
    assert_eq!(cache.release(h), Released::Kept);
    cache.invalidate(req.addr, req.addr + req.len); // the memory went: the entry is deregistered
    assert!(hca.live.lock().unwrap().is_empty());
    assert_eq!(
        cache.release(h),
        Released::DoubleRelease,
        "must not reach libibverbs with a freed MR"
    );
    // A new registration at the same address (allocator reuse) is live again.
    cache.note_foreign(h);
    assert_eq!(cache.release(h), Released::NotOurs);
}
