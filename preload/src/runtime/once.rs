//! The runtime's one-time set-up, safe across fork.
//!
//! `std::sync::OnceLock` makes every other caller wait while one thread sets up; a fork in
//! that window leaves the child's lock "running" with no thread to finish it, and the
//! child's first verbs call waits forever. Here a caller that finds the set-up in progress
//! in its own process gets `None` (and passes its call through uncached) instead of
//! waiting; a set-up left in progress by the process we were forked from is taken over.

use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering::*};

pub struct InitOnce<T: 'static> {
    value: AtomicPtr<T>,
    /// The pid of the process one of whose threads is setting up (0: nobody yet).
    owner: AtomicI32,
}

impl<T: 'static> InitOnce<T> {
    pub const fn new() -> Self {
        InitOnce {
            value: AtomicPtr::new(std::ptr::null_mut()),
            owner: AtomicI32::new(0),
        }
    }

    /// The value, once set up.
    pub fn get(&self) -> Option<&'static T> {
        let p = self.value.load(Acquire);
        // SAFETY: a non-null value is a leaked Box, never freed or changed.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// The value, set up by `f` if nobody has started; `None` while another thread of this
    /// process (or this thread, re-entered) is setting it up.
    pub fn get_or_init(&self, f: impl FnOnce() -> T) -> Option<&'static T> {
        if let Some(v) = self.get() {
            return Some(v);
        }
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        let mut seen = self.owner.load(Acquire);
        loop {
            if seen == me {
                return self.get();
            }
            // Nobody, or a thread of the process we were forked from (gone here).
            match self.owner.compare_exchange(seen, me, AcqRel, Acquire) {
                Ok(_) => break,
                Err(now) => seen = now,
            }
        }
        if let Some(v) = self.get() {
            return Some(v);
        }
        let v: &'static T = Box::leak(Box::new(f()));
        self.value.store(v as *const T as *mut T, Release);
        Some(v)
    }
}
