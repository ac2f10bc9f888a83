//! Benchmark (not a test): the core alone (no LD_PRELOAD, a provider that does nothing):
//! `acquire` + `release` of n cached 4 KiB buffers a gap page apart, visited in random or
//! sequential order, on 1 or more threads with private buffers or all on one shared set.
//! Each figure is the median of 201 batches of 1,000 pairs, in ns per pair (the slowest
//! thread's), after every buffer was registered once; plus the cache's lookup metadata per
//! entry.
//!
//!   cargo run --release --example hit_path -- [-t THREADS] [-o random|seq] [-s] N...
//!
//! `-s`: the threads share one set of buffers (contention on the same entries).
//! Prints one line per N: regions, order, threads, shared, ns per pair, bytes per entry.

use mrcache::cache::{Cache, Limits, Mr, Registrar, Request};
use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

struct NullHca(AtomicUsize);

impl Registrar for NullHca {
    fn register(&self, _: &Request) -> Result<Mr, i32> {
        Ok(Mr {
            ptr: 64 * (1 + self.0.fetch_add(1, Relaxed)),
            via_wrapper: false,
        })
    }
    fn deregister(&self, _: Mr) -> Result<(), i32> {
        Ok(())
    }
    fn alloc_shadow(&self) -> Option<usize> {
        Some((1 << 40) | (64 * self.0.fetch_add(1, Relaxed)))
    }
    fn fill_shadow(&self, _: usize, _: Mr, _: usize, _: usize) -> bool {
        true
    }
}

const BUF: usize = 4096;
const STRIDE: usize = 2 * BUF;
const BATCH: usize = 1000;
const BATCHES: usize = 201;

fn request(base: usize, i: usize) -> Request {
    let addr = base + i * STRIDE;
    Request {
        pd: 0x5000,
        context: 0x6000,
        addr,
        len: BUF,
        iova: addr as u64,
        access: 1,
    }
}

fn order(n: usize, random: bool, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    if random {
        let mut x = 88172645463325252u64 ^ seed;
        for i in (1..n).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.swap(i, x as usize % (i + 1));
        }
    }
    v
}

/// Median ns per pair (the slowest thread's) and metadata bytes per entry.
fn measure(n: usize, threads: usize, random: bool, shared: bool) -> (f64, f64) {
    let cache = Cache::new(
        NullHca(AtomicUsize::new(0)),
        Limits {
            max_entries: usize::MAX,
            max_bytes: u64::MAX,
            shadow: !shared,
            remote_superset: false,
        },
    );
    let barrier = Barrier::new(threads);
    let medians: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (cache, barrier) = (&cache, &barrier);
                s.spawn(move || {
                    let base = 0x1000_0000_0000 + if shared { 0 } else { t << 36 };
                    let reqs: Vec<Request> = order(n, random, t as u64)
                        .into_iter()
                        .map(|i| request(base, i))
                        .collect();
                    for r in &reqs {
                        let (h, _) = cache.acquire(r).unwrap();
                        cache.release(h);
                    }
                    barrier.wait();
                    let mut times = Vec::with_capacity(BATCHES);
                    let mut k = 0;
                    for _ in 0..BATCHES {
                        let t0 = Instant::now();
                        for _ in 0..BATCH {
                            let (h, _) = cache.acquire(&reqs[k % n]).unwrap();
                            cache.release(h);
                            k += 1;
                        }
                        times.push(t0.elapsed().as_nanos() as f64 / BATCH as f64);
                    }
                    times.sort_by(f64::total_cmp);
                    times[BATCHES / 2]
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let entries = cache.snapshot().entries.max(1) as f64;
    let worst = medians.into_iter().fold(0.0, f64::max);
    (worst, cache.metadata_bytes() as f64 / entries)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut threads, mut random, mut shared, mut sizes) = (1, true, false, Vec::new());
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "-t" => {
                i += 1;
                threads = args.get(i).and_then(|a| a.parse().ok()).unwrap_or(1);
            }
            "-o" => {
                i += 1;
                random = args.get(i).is_none_or(|a| a != "seq");
            }
            "-s" => shared = true,
            a => sizes.extend(a.parse::<usize>().ok()),
        }
        i += 1;
    }
    if sizes.is_empty() {
        sizes = vec![1, 1000];
    }
    println!(
        "{:>10} {:>6} {:>7} {:>7} {:>10} {:>15}",
        "regions", "order", "threads", "buffers", "core_ns", "bytes_per_entry"
    );
    for n in sizes {
        let (ns, bytes) = measure(n, threads.max(1), random, shared);
        println!(
            "{n:>10} {:>6} {threads:>7} {:>7} {ns:>10.1} {bytes:>15.0}",
            if random { "random" } else { "seq" },
            if shared { "shared" } else { "private" }
        );
    }
}
