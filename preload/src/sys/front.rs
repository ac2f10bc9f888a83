//! The front (libmrcache.so) that attached this engine: its place in the loader's list and
//! its span, and a call made from its code (`FrontInfo`, noted once by `attach`).

use super::front_abi::{ABI, FrontInfo};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::*};

/// The front's base, dynamic section, span and `call_from_front` (all 0 until attached).
static BASE: AtomicUsize = AtomicUsize::new(0);
static DYNAMIC: AtomicUsize = AtomicUsize::new(0);
static LO: AtomicUsize = AtomicUsize::new(0);
static HI: AtomicUsize = AtomicUsize::new(0);
static CALL: AtomicUsize = AtomicUsize::new(0);

/// The front's place and span.
#[derive(Clone, Copy)]
pub struct Front {
    pub base: usize,
    pub dynamic: usize,
    pub lo: usize,
    pub hi: usize,
}

/// Note the front that attaches us; false (nothing noted) when it is of another build.
pub fn attach(info: &FrontInfo) -> bool {
    if info.abi != ABI || info.slots.is_null() {
        return false;
    }
    super::link_map::note_start_up(info.last_at_start);
    BASE.store(info.base, Relaxed);
    DYNAMIC.store(info.dynamic, Relaxed);
    LO.store(info.lo, Relaxed);
    CALL.store(info.call_from_front as usize, Relaxed);
    TLS.store(info.tls as usize, Relaxed);
    HI.store(info.hi, Release);
    true
}

/// The front, once it attached us.
pub fn attached() -> Option<Front> {
    let hi = HI.load(Acquire);
    (hi != 0).then(|| Front {
        base: BASE.load(Relaxed),
        dynamic: DYNAMIC.load(Relaxed),
        lo: LO.load(Relaxed),
        hi,
    })
}

/// `f(a, b, c)` called from the front's code (None before the front attached us): libc's
/// `dlsym(RTLD_NEXT)` from there answers the definition after the front.
pub fn call(f: usize, a: usize, b: usize, c: usize) -> Option<usize> {
    if HI.load(Acquire) == 0 {
        return None;
    }
    let call = CALL.load(Relaxed);
    type CallFn = unsafe extern "C" fn(usize, usize, usize, usize) -> usize;
    // SAFETY: the front's call_from_front, of this prototype; f is the caller's function of
    // three register-sized arguments.
    Some(unsafe { std::mem::transmute::<usize, CallFn>(call)(f, a, b, c) })
}

/// This thread's words in the front's static TLS block (`front_abi::TLS_WORDS`), 0 before
/// the front attached us.
static TLS: AtomicUsize = AtomicUsize::new(0);

/// A thread-local `Cell<T>` for what the hooks keep per thread, held in the front's static
/// TLS block (`at`: its first word): the engine is loaded with `dlopen`, and glibc allocates
/// a dlopened object's TLS with `malloc` at a thread's first access, which in a hook called
/// inside the allocator (malloc's own `mmap`, a fork in a signal handler) waits for the
/// allocator's lock its own thread holds. The front is loaded at start-up: its block is
/// part of every thread's. Before a front attached us (unit tests), std's `thread_local`.
/// `T` must be valid as all zeroes (the block's start).
pub struct ThreadCell<T: 'static> {
    at: usize,
    fallback: &'static std::thread::LocalKey<Cell<T>>,
}

impl<T: Copy> ThreadCell<T> {
    pub const fn new(at: usize, fallback: &'static std::thread::LocalKey<Cell<T>>) -> Self {
        ThreadCell { at, fallback }
    }

    /// `f` on this thread's cell (Err: the thread's std thread-locals are gone).
    pub fn try_with<R>(&'static self, f: impl FnOnce(&Cell<T>) -> R) -> Result<R, ()> {
        const {
            assert!(size_of::<T>() <= 16 && align_of::<T>() <= 8);
        };
        let tls = TLS.load(Relaxed);
        if tls == 0 {
            return self.fallback.try_with(f).map_err(|_| ());
        }
        type TlsFn = unsafe extern "C" fn() -> *mut usize;
        // SAFETY: the front's tls function (no argument, clobbers nothing else) returns this
        // thread's TLS_WORDS words, 16-byte aligned and zero at the thread's start; `at`
        // plus T's words lie within them (checked where the cells are declared: `at + 2 <=
        // TLS_WORDS`), and T is valid as zeroes (the declaring site's promise). Cell<T> is
        // T's layout; only this thread reads or writes its block.
        Ok(unsafe {
            let words = std::mem::transmute::<usize, TlsFn>(tls)();
            f(&*(words.add(self.at) as *const Cell<T>))
        })
    }
}
