//! Where a memory hook sends a call after reporting it. Another library may hook the same
//! calls by patching libc's entry points (UCX's bistro mode, libfabric's memhooks, Open
//! MPI's patcher), and our exported symbols take the program's calls before libc's entry
//! ever runs: issuing the system call ourselves would hide every such call from it (UCX's
//! start-up test then finds none of its events and gives up). So a hook calls libc's entry
//! point, whatever sits there now, unless it is our own jump (then the hook issues the
//! system call itself, as the jump brought it here already).
//!
//! Resolved in the constructor from libc's handle; read with one load. No allocation, no
//! lock: these run inside allocators.

use crate::patch::PatchTarget;
use crate::real::Symbol;
use std::cell::Cell;
use std::ffi::{CStr, c_int, c_void};

/// libc's entry point of one memory call (one the patch monitor may patch), typed `F`.
pub struct Entry<F>(Symbol<F>, PatchTarget);

impl<F: Copy> Entry<F> {
    /// # Safety
    /// `F` must be glibc's prototype of `target`'s function (a variadic one as its
    /// fixed-argument form where the x86-64 calling convention passes the arguments alike).
    const unsafe fn new(target: PatchTarget) -> Self {
        // SAFETY: the caller's contract.
        Entry(unsafe { Symbol::next(target.name()) }, target)
    }

    fn name(&self) -> &'static CStr {
        self.0.name()
    }

    /// Where to send the call whose first argument is `key`: the other patcher's hook our
    /// jump took libc's entry from; else libc's entry point, unless it holds our own jump.
    /// None: issue the system call.
    pub fn target(&self, key: usize) -> Option<F> {
        // The same call again from inside the one we forwarded (the other library's hook
        // calls the function it found with dlsym(RTLD_NEXT), which is ours): the system call
        // now. Any other call made in there (its handler releasing memory) is forwarded like
        // one from the program, or the other library would not see it.
        if FORWARDING
            .try_with(Cell::get)
            .map_or(true, |f| f == (self.tag(), key))
        {
            return None;
        }
        let at = match crate::patch::site(self.1) {
            crate::patch::Site::Chained(t) => t as *mut c_void,
            crate::patch::Site::Ours => return None,
            crate::patch::Site::Other => {
                let mut at = self.0.address();
                if at.is_null() {
                    // Before our constructor (another library's constructor calls us): from
                    // libc's symbol table, without dlsym or allocation.
                    at = crate::dlsym::libc_symbol(self.name());
                    self.0.store(at);
                }
                if at.is_null() {
                    return None;
                }
                at
            }
        };
        const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
        // SAFETY: F is a function pointer type (same size, checked above) with the entry's
        // prototype (new's contract); `at` is libc's entry or the hook that replaced it,
        // which takes the same arguments.
        Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&at) })
    }

    /// Run `call` (the forwarded call whose first argument is `key`), marking the thread as
    /// inside it.
    pub fn guarded<T>(&self, key: usize, call: impl FnOnce() -> T) -> T {
        let outer = FORWARDING.try_with(|f| f.replace((self.tag(), key)));
        let r = call();
        if let Ok(outer) = outer {
            let _ = FORWARDING.try_with(|f| f.set(outer));
        }
        r
    }

    /// Which entry this is (its address), for FORWARDING.
    fn tag(&self) -> usize {
        self as *const Self as usize
    }

    fn resolve_in(&self, libc_handle: *mut c_void) {
        self.0.resolve_in(libc_handle);
    }
}

thread_local! {
    /// The call a hook of this thread is forwarding: (entry, first argument); (0, 0): none.
    static FORWARDING: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

pub type MunmapFn = unsafe extern "C" fn(*mut c_void, usize) -> c_int;
pub type MadviseFn = unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int;
pub type MremapFn =
    unsafe extern "C" fn(*mut c_void, usize, usize, c_int, *mut c_void) -> *mut c_void;
pub type MmapFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, i64) -> *mut c_void;
pub type ShmatFn = unsafe extern "C" fn(c_int, *const c_void, c_int) -> *mut c_void;
pub type ShmdtFn = unsafe extern "C" fn(*const c_void) -> c_int;
pub type BrkFn = unsafe extern "C" fn(*mut c_void) -> c_int;
pub type SbrkFn = unsafe extern "C" fn(isize) -> *mut c_void;

// SAFETY (each): glibc's prototype; mremap is variadic, and on x86-64 its fifth argument
// travels in its register either way.
pub static MUNMAP: Entry<MunmapFn> = unsafe { Entry::new(PatchTarget::Munmap) };
pub static MADVISE: Entry<MadviseFn> = unsafe { Entry::new(PatchTarget::Madvise) };
pub static MREMAP: Entry<MremapFn> = unsafe { Entry::new(PatchTarget::Mremap) };
pub static MMAP: Entry<MmapFn> = unsafe { Entry::new(PatchTarget::Mmap) };
pub static SHMAT: Entry<ShmatFn> = unsafe { Entry::new(PatchTarget::Shmat) };
pub static SHMDT: Entry<ShmdtFn> = unsafe { Entry::new(PatchTarget::Shmdt) };
pub static BRK: Entry<BrkFn> = unsafe { Entry::new(PatchTarget::Brk) };
pub static SBRK: Entry<SbrkFn> = unsafe { Entry::new(PatchTarget::Sbrk) };

/// Find libc's entry points (constructor, before any patch of ours).
pub fn resolve(libc_handle: *mut c_void) {
    MUNMAP.resolve_in(libc_handle);
    MADVISE.resolve_in(libc_handle);
    MREMAP.resolve_in(libc_handle);
    MMAP.resolve_in(libc_handle);
    SHMAT.resolve_in(libc_handle);
    SHMDT.resolve_in(libc_handle);
    BRK.resolve_in(libc_handle);
    SBRK.resolve_in(libc_handle);
}
