//! The unit tests' fake provider: registrations numbered from 0x1000, deregistrations
//! recorded, no shadows.

use crate::cache::*;
use std::sync::Mutex;

#[derive(Default)]
pub(in crate::cache) struct Fake {
    pub(in crate::cache) next: AtomicU64,
    pub(in crate::cache) deregistered: Mutex<Vec<usize>>,
}

impl Registrar for &Fake {
    fn register(&self, _: &Request) -> Result<Mr, i32> {
        Ok(Mr {
            ptr: 0x1000 * (1 + self.next.fetch_add(1, SeqCst) as usize),
            via_wrapper: false,
        })
    }
    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        self.deregistered.lock().unwrap().push(mr.ptr);
        Ok(())
    }
    fn alloc_shadow(&self) -> Option<usize> {
        None
    }
    fn fill_shadow(&self, _: usize, _: Mr, _: usize, _: usize) -> bool {
        false
    }
}

pub(in crate::cache) const LIMITS: Limits = Limits {
    max_entries: usize::MAX,
    max_bytes: u64::MAX,
    shadow: true,
    remote_superset: false,
};

/// A local 4 KiB request at `addr`.
pub(in crate::cache) fn req(addr: usize) -> Request {
    Request {
        pd: 0x10,
        context: 0x20,
        addr,
        len: 0x1000,
        iova: addr as u64,
        access: 1,
    }
}

/// Cache `req(addr)` and leave it idle; its slot id and provider pointer.
pub(in crate::cache) fn idle_entry(cache: &Cache<&Fake>, addr: usize) -> (u32, usize) {
    let (h, o) = cache.acquire(&req(addr)).unwrap();
    assert_eq!(o, Outcome::Miss);
    assert_eq!(cache.release(h), Released::Kept);
    (cache.fast.by_mr(h).unwrap(), h)
}

/// xorshift64: a fixed sequence for the randomised unit tests.
pub(in crate::cache) struct XorShift(pub(in crate::cache) u64);

impl XorShift {
    pub(in crate::cache) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
