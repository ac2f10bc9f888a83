//! Benchmark (not a test): cost of a cache hit (acquire + release of a cached registration)
//! with a provider that does nothing, on 1 and on 2 threads (each its own buffer), and how
//! total throughput scales. `cargo run --release --example hit_path [SECONDS]`.

use mrcache::cache::{Cache, Limits, Mr, Registrar, Request};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

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

fn run(threads: usize, secs: f64) -> f64 {
    let cache = Cache::new(
        NullHca(AtomicUsize::new(0)),
        Limits {
            max_entries: 1024,
            max_bytes: u64::MAX,
            shadow: true,
            remote_superset: false,
        },
    );
    let total = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (cache, total) = (&cache, &total);
            s.spawn(move || {
                let addr = 0x1000_0000 + t * 0x100_0000;
                let req = Request {
                    pd: 1,
                    context: 1,
                    addr,
                    len: 1 << 20,
                    iova: addr as u64,
                    access: 3,
                };
                let end = Instant::now() + Duration::from_secs_f64(secs);
                let mut n = 0;
                while Instant::now() < end {
                    for _ in 0..256 {
                        let (h, _) = cache.acquire(&req).unwrap();
                        cache.release(h);
                    }
                    n += 256;
                }
                total.fetch_add(n, Relaxed);
            });
        }
    });
    total.load(Relaxed) as f64 / secs
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1.0);
    let one = run(1, secs);
    let two = run(2, secs);
    println!("hit path (acquire + release of a cached registration, no provider):");
    println!(
        "  1 thread : {:>12.0} hits/s  ({:.0} ns per hit)",
        one,
        1e9 / one
    );
    println!(
        "  2 threads: {:>12.0} hits/s  ({:.0} ns per hit per thread)",
        two,
        2e9 / two
    );
    println!(
        "  scaling 2 threads / 1 thread: {:.2}x (one mutex guards the cache state; provider calls happen outside it)",
        two / one
    );
}
