// Candidate concurrent maps for the exact-key hit path: a lookup plus a compare-and-swap
// on the entry state under whatever read guard the map gives; 1 and 2 threads, n keys each.
#[allow(dead_code)]
#[path = "../../../src/cache/shards.rs"]
mod shards;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::time::Instant;
type Key = (usize, usize, usize, u32, u64);
fn key(i: usize) -> Key {
    let a = 0x7f00_0000_0000 + i * 8192;
    (0x5555_0000, a, 4096, 1, a as u64)
}

struct Spin<T> {
    locked: AtomicBool,
    v: std::cell::UnsafeCell<T>,
}
// SAFETY: the value is only reached through `with`, which holds the lock.
unsafe impl<T: Send> Sync for Spin<T> {}
impl<T> Spin<T> {
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        while self.locked.swap(true, Acquire) {
            while self.locked.load(Relaxed) {
                std::hint::spin_loop()
            }
        }
        // SAFETY: the lock is held: no other reference to the value exists.
        let r = f(unsafe { &mut *self.v.get() });
        self.locked.store(false, Release);
        r
    }
}
#[repr(align(128))]
struct P<T>(T);

/// Median ns per operation over 201 batches of 2,000 (the slowest thread's): batches a
/// busy machine preempted fall out of the median.
fn bench(name: &str, n: usize, threads: usize, op: &(dyn Fn(usize) -> u64 + Sync)) {
    let medians: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut x = 88172645463325252u64 ^ t as u64;
                    let mut acc = 0;
                    let mut times = Vec::new();
                    for _ in 0..201 {
                        let t0 = Instant::now();
                        for _ in 0..2000 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            acc += op(t * n + (x as usize % n));
                        }
                        times.push(t0.elapsed().as_nanos() as f64 / 2000.0);
                    }
                    std::hint::black_box(acc);
                    times.sort_by(f64::total_cmp);
                    times[100]
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ns = medians.into_iter().fold(0.0, f64::max);
    println!("{name:<14} n={n:<8} threads={threads} {ns:6.1} ns/op (median, slowest thread)");
}

fn main() {
    let states: Vec<AtomicU64> = (0..2_000_000).map(|_| AtomicU64::new(0)).collect();
    let claim = |id: u32| {
        let s = &states[id as usize];
        s.fetch_add(1, AcqRel);
        s.fetch_sub(1, AcqRel)
    };
    for &n in &[1usize, 1000, 100_000, 1_000_000] {
        for &th in &[1usize, 2] {
            let m: shards::Shards<Key, u32> = shards::Shards::default();
            for i in 0..n * th {
                m.insert(key(i), i as u32);
            }
            bench("mutex-shards", n, th, &|i| {
                m.with(&key(i), |v| v.map(|&id| claim(id)).unwrap_or(0)).0
            });
            drop(m);
            let sp: Vec<
                P<Spin<std::collections::HashMap<shards::Hashed<Key>, u32, shards::PassThrough>>>,
            > = (0..64)
                .map(|_| {
                    P(Spin {
                        locked: AtomicBool::new(false),
                        v: Default::default(),
                    })
                })
                .collect();
            let loc: shards::Shards<Key, u32> = shards::Shards::default();
            for i in 0..n * th {
                let (k, s) = loc.locate(&key(i));
                sp[s].0.with(|m| m.insert(k, i as u32));
            }
            bench("spin-shards", n, th, &|i| {
                let (k, s) = loc.locate(&key(i));
                sp[s]
                    .0
                    .with(|m| m.get(&k).map(|&id| claim(id)).unwrap_or(0))
            });
            drop(sp);
            let d: dashmap::DashMap<Key, u32> = dashmap::DashMap::new();
            for i in 0..n * th {
                d.insert(key(i), i as u32);
            }
            bench("dashmap", n, th, &|i| {
                d.get(&key(i)).map(|r| claim(*r)).unwrap_or(0)
            });
            drop(d);
            let p: papaya::HashMap<Key, u32> = papaya::HashMap::new();
            {
                let g = p.pin();
                for i in 0..n * th {
                    g.insert(key(i), i as u32);
                }
            }
            bench("papaya", n, th, &|i| {
                let g = p.pin();
                g.get(&key(i)).map(|&id| claim(id)).unwrap_or(0)
            });
        }
    }
}
