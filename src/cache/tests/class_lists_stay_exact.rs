//! The per-class lists stay exact (every present entry of a class on
//! its list once, nothing else, no cycle) through concurrent misses, hits, releases,
//! evictions (a small max_entries), invalidations and flushes; checked by walking each
//! class's list (`evict_idle_class`, examined count) against a scan of every slot.

use crate::cache::*;
use std::collections::HashSet;
use std::sync::Mutex;

#[derive(Default)]
struct Fake {
    next: AtomicU64,
    live: Mutex<HashSet<usize>>,
}

impl Registrar for &Fake {
    fn register(&self, _: &Request) -> Result<Mr, i32> {
        let ptr = 0x1000 * (1 + self.next.fetch_add(1, SeqCst) as usize);
        self.live.lock().unwrap().insert(ptr);
        Ok(Mr {
            ptr,
            via_wrapper: false,
        })
    }
    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        assert!(self.live.lock().unwrap().remove(&mr.ptr), "double dereg");
        Ok(())
    }
    fn alloc_shadow(&self) -> Option<usize> {
        None
    }
    fn fill_shadow(&self, _: usize, _: Mr, _: usize, _: usize) -> bool {
        false
    }
}

/// A small entry limit, so that the concurrent test evicts.
const LIMITS: Limits = Limits {
    max_entries: 40,
    max_bytes: u64::MAX,
    shadow: true,
    remote_superset: false,
};

const LENS: [usize; 3] = [0x1000, 0x10000, 0x100000];

fn req(slot: usize, len_i: usize, pd: usize) -> Request {
    let addr = 0x1000_0000 + slot * 0x20_0000;
    Request {
        pd,
        context: 0x20,
        addr,
        len: LENS[len_i],
        iova: addr as u64,
        access: 1,
    }
}

#[test]
fn class_lists_stay_exact_under_concurrency() {
    let fake = Fake::default();
    let limits = LIMITS;
    let cache = Cache::new(&fake, limits);
    for round in 0..20u64 {
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let cache = &cache;
                s.spawn(move || {
                    let mut x = round * 1000 + t * 7 + 1;
                    for _ in 0..3000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let slot = (x % 97) as usize;
                        let len_i = ((x >> 8) % 3) as usize;
                        let pd = 0x10 + ((x >> 12) % 2) as usize;
                        match (x >> 16) % 16 {
                            0 => {
                                let r = req(slot, len_i, pd);
                                cache.invalidate(r.addr, r.addr + r.len);
                            }
                            1 if t == 0 => {
                                cache.flush_pd(pd);
                            }
                            _ => {
                                if let Ok((h, _)) = cache.acquire(&req(slot, len_i, pd)) {
                                    cache.release(h);
                                }
                            }
                        }
                    }
                });
            }
        });
        // Every entry is idle now. Per class: the list holds exactly the present entries.
        let mut st = cache.lock();
        let ids = st.ids(&cache.fast);
        let mut total = 0;
        for len in LENS {
            let class = admission::size_class(len);
            let want: HashSet<u32> = ids
                .iter()
                .copied()
                .filter(|&id| {
                    st.entry(&cache.fast, id)
                        .is_some_and(|e| admission::size_class(e.req.len) == class)
                })
                .collect();
            let before = st.examined;
            // Walk without evicting anything (a predicate that refuses all).
            let none = st.evict_idle_class(&cache.fast, class, false, |_| false);
            assert!(none.is_empty());
            let walked = st.examined - before;
            assert_eq!(
                walked,
                want.len(),
                "round {round}: class {class:#x}: its list walked {walked} entries, {} present",
                want.len()
            );
            assert_eq!(
                st.evict_idle_class(&cache.fast, class, true, |_| false)
                    .len(),
                0
            );
            total += want.len();
        }
        assert_eq!(total, ids.len(), "round {round}: entries of no list");
    }
}

/// A pass-through sample more than half off the class's figure (either way) means the cost
/// is changing: every pass-through is timed until samples agree again (the figure's own
/// movement, a 1/8 step, would only show a sample above 3x the figure).
#[test]
fn a_sample_half_off_the_figure_counts_as_moving() {
    let fake = Fake::default();
    let limits = LIMITS;
    for (x, want) in [
        (0.1, true),
        (0.5, true),
        (0.8, false),
        (1.2, false),
        (1.4, false),
        (2.0, true),
        (4.0, true),
    ] {
        let cache = Cache::new(&fake, limits);
        let r = req(1, 1, 0x10);
        for _ in 0..8 {
            cache.report(Sample::Registration(&r, 0), 100_000);
        }
        cache.report(Sample::Registration(&r, 0), (100_000.0 * x) as u64);
        let f = *cache.admission().get(Access::Local, r.len);
        assert_eq!(
            f.pass_moving, want,
            "steady 100 us, then one sample of {x}x"
        );
        // A doubled cost keeps every pass-through timed until the figure follows it.
        if x == 2.0 {
            let mut timed = 1;
            while cache.admission().get(Access::Local, r.len).pass_moving && timed < 64 {
                cache.report(Sample::Registration(&r, 0), 200_000);
                timed += 1;
            }
            let f = *cache.admission().get(Access::Local, r.len);
            assert!(
                f.pass_reg.value > 140_000.0,
                "{timed} timed: figure {}",
                f.pass_reg.value
            );
        }
    }
}

/// A class list broken into a cycle (or pointing past its links) is walked at most once per
/// link: the flip that walks it under the cache lock ends instead of hanging the hook.
#[test]
fn a_class_list_cycle_ends_the_walk() {
    let fake = Fake::default();
    let limits = LIMITS;
    let cache = Cache::new(&fake, limits);
    for slot in 0..3 {
        let (h, _) = cache.acquire(&req(slot, 0, 0x10)).unwrap();
        cache.release(h);
    }
    let class = admission::size_class(LENS[0]);
    let mut st = cache.lock();
    let links = st.break_class_list(class, false, None);
    let before = st.examined;
    assert!(
        st.evict_idle_class(&cache.fast, class, false, |_| false)
            .is_empty()
    );
    let walked = st.examined - before;
    assert!(
        walked <= links,
        "{walked} entries walked over {links} links"
    );
    // A link past the end.
    st.break_class_list(class, false, Some(u32::MAX - 1));
    assert!(
        st.evict_idle_class(&cache.fast, class, false, |_| false)
            .is_empty()
    );
}
