//! Our own threads (the drain thread, the trace writer): bare pthreads that have made their
//! first allocation before the caller goes on; and whether the program has started any
//! thread (`program_single_threaded`).

use std::ffi::CStr;
use std::panic::catch_unwind;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};

/// Start one of our threads and wait (at most 100 ms) until it has made its first
/// allocation. glibc gives a thread its own malloc arena at its first allocation, a new
/// 64 MiB reservation whose place the kernel picks then: made later, at the thread's first
/// drain (right after the program freed a block), it could land where the program's next
/// `malloc` would have reused the freed block's address. Made now, it is where it would be
/// without us looking. A bare pthread, not `std::thread`: std's start-up registers a
/// thread-local destructor, which takes the loader lock, so a first registration made in a
/// library constructor (under that lock) waited the whole 100 ms. The wait stays bounded:
/// the new thread may simply not get a CPU for a while.
///
/// The thread starts with every signal blocked: a signal sent to the process is the
/// program's, and its handler runs on one of the program's threads, as without us (a
/// handler that forks on our thread would fork inside our drain, with our locks held).
pub fn spawn_settled(name: &'static CStr, body: fn()) {
    let start = Arc::new(Start {
        body,
        settled: AtomicBool::new(false),
    });
    let arg = Arc::into_raw(start.clone()) as *mut libc::c_void;
    // SAFETY: plain pthread calls on a local attr and local signal sets; `run` takes over
    // `arg`'s reference when the thread starts, and we take it back when it does not.
    let started = unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        // std::thread's default, so the address space looks as it did.
        libc::pthread_attr_setstacksize(&mut attr, 2 << 20);
        // The new thread inherits the creator's mask: all blocked for the call (the few
        // glibc keeps for itself stay open), the caller's restored after.
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut caller: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut caller);
        let mut thread: libc::pthread_t = 0;
        let rc = libc::pthread_create(&mut thread, &attr, run, arg);
        libc::pthread_sigmask(libc::SIG_SETMASK, &caller, std::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
        if rc == 0 {
            libc::pthread_setname_np(thread, name.as_ptr());
        } else {
            drop(Arc::from_raw(arg as *const Start));
        }
        rc == 0
    };
    if !started {
        return;
    }
    let t0 = std::time::Instant::now();
    while !start.settled.load(Acquire) && t0.elapsed() < std::time::Duration::from_millis(100) {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

struct Start {
    body: fn(),
    settled: AtomicBool,
}

extern "C" fn run(arg: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `arg` is the reference spawn_settled made with Arc::into_raw for this thread.
    let start = unsafe { Arc::from_raw(arg as *const Start) };
    std::hint::black_box(Box::new(0u64));
    start.settled.store(true, Release);
    let body = start.body;
    drop(start);
    // Nothing may unwind out of an extern "C" function.
    let _ = catch_unwind(body);
    std::ptr::null_mut()
}

unsafe extern "C" {
    fn pthread_setcancelstate(state: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
}

/// glibc's `PTHREAD_CANCEL_DISABLE` (not in the libc crate for Linux).
const PTHREAD_CANCEL_DISABLE: libc::c_int = 1;

/// This thread's cancellation switched off while it lives, its state before put back on drop.
/// Our code makes calls that are cancellation points (the miss path's `msync`, a log line's
/// `write`, the set-up's file reads): a cancel pending when the program called one of our
/// hooks would act there, and glibc's forced unwind would run through our frames and abort
/// the process. Switched off, it acts at the program's own next cancellation point, as
/// without us. Back on, a deferred cancel does not act.
pub struct NoCancel(libc::c_int);

impl NoCancel {
    pub fn new() -> NoCancel {
        let mut old = PTHREAD_CANCEL_DISABLE;
        // SAFETY: sets this thread's own cancelability; `old` is a valid out-pointer.
        unsafe { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old) };
        NoCancel(old)
    }
}

impl Drop for NoCancel {
    fn drop(&mut self) {
        let mut was = 0;
        // SAFETY: as in `new`.
        unsafe { pthread_setcancelstate(self.0, &mut was) };
    }
}

/// glibc's `__libc_single_threaded` (2.32+): nonzero while the process has started no
/// thread. Looked up once; where it is missing (an older glibc, another libc) the program
/// counts as threaded.
pub fn program_single_threaded() -> bool {
    const UNKNOWN: usize = usize::MAX;
    static FLAG: AtomicUsize = AtomicUsize::new(UNKNOWN);
    let mut p = FLAG.load(Relaxed);
    if p == UNKNOWN {
        p = crate::sys::symbol::address(libc::RTLD_DEFAULT, c"__libc_single_threaded") as usize;
        FLAG.store(p, Relaxed);
    }
    // SAFETY: a nonzero address is glibc's `char __libc_single_threaded`, live for the
    // process; glibc writes it only when a thread starts (and in a fork child).
    p != 0 && unsafe { std::ptr::read_volatile(p as *const u8) } != 0
}
