//! The startup self-test: exercise each way memory can go away on scratch memory and record
//! whether the active monitor reported it. Runs once, when the cache is created (the first
//! registration), before any entry exists, so draining the queue here loses nothing.

use crate::monitor::memory::QUEUE;
use std::ffi::{CStr, c_int, c_void};
use std::time::Instant;

pub use mrcache::selftest::{Coverage, Status};

use crate::sys::page_size;

/// libc's function `name` through `handle` (the program's view or libc's own).
///
/// # Safety
/// `F` must be `name`'s C prototype.
unsafe fn sym<F: Copy>(handle: *mut c_void, name: &CStr) -> Option<F> {
    // SAFETY: the caller's contract.
    unsafe { crate::sys::symbol::function(handle, name) }
}

fn scratch(len: usize) -> usize {
    // SAFETY: a fresh anonymous private mapping, by raw syscall (no hook involved).
    let p = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            0usize,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1i64,
            0usize,
        )
    };
    if p < 0 { 0 } else { p as usize }
}

fn release(p: usize, len: usize) {
    // SAFETY: unmaps scratch memory of our own, by raw syscall.
    unsafe { libc::syscall(libc::SYS_munmap, p, len) };
}

/// Whether running `op` reported a range covering `[start, end)`.
fn caught(start: usize, end: usize, op: impl FnOnce()) -> Status {
    QUEUE.drain(|_, _, _| {});
    op();
    let mut seen = false;
    QUEUE.drain(|_, s, e| seen |= s <= start && end <= e);
    if seen { Status::Caught } else { Status::Missed }
}

/// Run every probe. `libc_handle` is libc's own (its functions as glibc calls them inside).
pub fn run(libc_handle: *mut c_void, glibc_malloc: bool, brk_patched: bool) -> Coverage {
    let t0 = Instant::now();
    let app = libc::RTLD_DEFAULT; // what a program's call through its PLT reaches
    let mut r: Vec<(&'static str, Status)> = Vec::new();

    type Munmap = unsafe extern "C" fn(*mut c_void, usize) -> c_int;
    type Madvise = unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int;
    type Mremap =
        unsafe extern "C" fn(*mut c_void, usize, usize, c_int, *mut c_void) -> *mut c_void;
    type Mmap = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, i64) -> *mut c_void;
    type Shmat = unsafe extern "C" fn(c_int, *const c_void, c_int) -> *mut c_void;
    type Shmdt = unsafe extern "C" fn(*const c_void) -> c_int;

    // SAFETY: (whole block) each function is looked up with its C prototype and called on
    // scratch memory this function owns.
    unsafe {
        for (label, handle) in [
            ("munmap (program call)", app),
            ("munmap inside libc (free of an mmapped block)", libc_handle),
        ] {
            let f = sym::<Munmap>(handle, c"munmap");
            let p = scratch(2 * page_size());
            let (Some(f), true) = (f, p != 0) else {
                r.push((label, Status::NotRun("not found")));
                continue;
            };
            r.push((
                label,
                caught(p, p + 2 * page_size(), || {
                    f(p as *mut c_void, 2 * page_size());
                }),
            ));
        }
        for (label, handle) in [
            ("madvise DONTNEED (program call)", app),
            (
                "madvise inside libc (malloc_trim, arena shrink)",
                libc_handle,
            ),
        ] {
            let f = sym::<Madvise>(handle, c"madvise");
            let p = scratch(2 * page_size());
            let (Some(f), true) = (f, p != 0) else {
                r.push((label, Status::NotRun("not found")));
                continue;
            };
            r.push((
                label,
                caught(p, p + 2 * page_size(), || {
                    f(p as *mut c_void, 2 * page_size(), libc::MADV_DONTNEED);
                }),
            ));
            release(p, 2 * page_size());
        }
        let f = sym::<Mremap>(app, c"mremap");
        let p = scratch(page_size());
        if let (Some(f), true) = (f, p != 0) {
            let mut q = 0usize;
            r.push((
                "mremap (program call)",
                caught(p, p + page_size(), || {
                    q = f(
                        p as *mut c_void,
                        page_size(),
                        64 * page_size(),
                        libc::MREMAP_MAYMOVE,
                        std::ptr::null_mut(),
                    ) as usize;
                }),
            ));
            if q != usize::MAX {
                release(q, 64 * page_size());
            }
        }
        for (label, handle) in [
            ("mmap MAP_FIXED over a mapping (program call)", app),
            (
                "mmap MAP_FIXED inside libc (arena shrink with vm.overcommit_memory=2)",
                libc_handle,
            ),
        ] {
            let f = sym::<Mmap>(handle, c"mmap");
            let p = scratch(2 * page_size());
            let (Some(f), true) = (f, p != 0) else {
                r.push((label, Status::NotRun("not found")));
                continue;
            };
            r.push((
                label,
                caught(p, p + 2 * page_size(), || {
                    f(
                        p as *mut c_void,
                        2 * page_size(),
                        libc::PROT_NONE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                        -1,
                        0,
                    );
                }),
            ));
            release(p, 2 * page_size());
        }
        // glibc's own malloc and free, called through libc's handle: another library may
        // have pointed our symbol references at its allocator since (UCX's malloc hooks
        // in reloc mode), and glibc's realloc must only see glibc's blocks.
        let malloc = sym::<unsafe extern "C" fn(usize) -> *mut c_void>(libc_handle, c"malloc");
        let free = sym::<unsafe extern "C" fn(*mut c_void)>(libc_handle, c"free");
        if let (true, Some(malloc), Some(free)) = (glibc_malloc, malloc, free) {
            // Above glibc's largest dynamic mmap threshold (32 MiB), so always mmapped.
            let big = 40 << 20;
            let p = malloc(big) as usize;
            if p != 0 {
                r.push((
                    "free() of an mmapped block",
                    caught(p, p + big, || free(p as *mut c_void)),
                ));
            }
            let realloc =
                sym::<unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void>(app, c"realloc");
            let p = malloc(big) as usize;
            if let (Some(realloc), true) = (realloc, p != 0) {
                let mut q = 0usize;
                r.push((
                    "realloc() moving an mmapped block",
                    caught(p, p + big, || {
                        q = realloc(p as *mut c_void, 2 * big) as usize;
                    }),
                ));
                free(if q != 0 { q } else { p } as *mut c_void);
            }
        } else {
            r.push(("free()/realloc() of an mmapped block", Status::NotRun("not glibc's malloc: the allocator's own munmap/madvise calls go through the symbol hooks")));
        }
        r.push((
            "brk/sbrk shrink",
            if brk_patched {
                Status::NotRun("libc brk patched; not exercised at startup (shrinking the heap under a running allocator is unsafe)")
            } else {
                Status::NotRun("only sbrk/brk calls through the symbol hooks are seen (libc's own brk is not patched)")
            },
        ));
        let (shmat, shmdt) = (sym::<Shmat>(app, c"shmat"), sym::<Shmdt>(app, c"shmdt"));
        let id = libc::shmget(libc::IPC_PRIVATE, page_size(), libc::IPC_CREAT | 0o600);
        if let (Some(shmat), Some(shmdt), true) = (shmat, shmdt, id >= 0) {
            let p = shmat(id, std::ptr::null(), 0) as usize;
            if p != usize::MAX {
                r.push((
                    "shmdt (program call)",
                    caught(p, p + page_size(), || {
                        shmdt(p as *const c_void);
                    }),
                ));
            }
            libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
        } else {
            r.push((
                "shmdt (program call)",
                Status::NotRun("System V shared memory unavailable"),
            ));
        }
    }
    QUEUE.drain(|_, _, _| {});
    Coverage {
        results: r,
        nanos: t0.elapsed().as_nanos() as u64,
    }
}
