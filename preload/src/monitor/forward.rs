//! Where a memory hook sends a call after reporting it.
//!
//! A call that reached our exported symbol (the program's, or any library's, through its
//! PLT) goes to the next definition of the name in the search order when that is another
//! interposer (a profiler, libmemusage, a leak checker listed after us in LD_PRELOAD, the
//! order `mrcache run` builds), as it would without us; the interposer's own call of the
//! function it found with `dlsym(RTLD_NEXT)` then reaches libc's entry, our jump, and comes
//! back here as the same call, which goes on as below. A call that came through our jump
//! at libc's entry (libc's own: free, malloc_trim; or a pointer to libc's entry) never went
//! to an interposer without us and does not now.
//!
//! Another library may hook the same calls by patching libc's entry points (UCX's bistro
//! mode, libfabric's memhooks, Open MPI's patcher), and our exported symbols take the
//! program's calls before libc's entry ever runs: issuing the system call ourselves would
//! hide every such call from it (UCX's start-up test then finds none of its events and gives
//! up). So a hook then calls libc's entry point, whatever sits there now, unless it is our
//! own jump (then the hook issues the system call itself, as the jump brought it here
//! already).
//!
//! `mprotect`, `pkey_mprotect`, `posix_madvise`, `process_madvise` and `remap_file_pages`
//! go to the next interposer the same way (`Entry::unpatched`); without one their hooks
//! issue the system call themselves, as libc's own functions do (libc's `mprotect` entry
//! holds our jump to the same hook; the others are plain system call wrappers).
//!
//! Each entry finds libc's function and the next definition of its name at its first call
//! (`elf::libc_symbol`, `elf::next_after_own`: read from the loader's list and the objects'
//! symbol tables, no lock, no allocation: these run inside allocators and signal
//! handlers), then reads them with one load each. A process that never calls a hook looks
//! nothing up.

use crate::monitor::patch::PatchTarget;
use crate::sys::front::ThreadCell;
use crate::sys::front_abi::TLS_FORWARDING;
use crate::sys::symbol::Symbol;
use std::cell::Cell;
use std::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering::*};

/// How a call reached the hook.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// Our exported symbol: the next interposer in the search order gets it.
    Symbol,
    /// Our jump at libc's entry: libc's own call (or one through a pointer to libc's
    /// entry), which no interposer would have seen.
    Libc,
}

/// Where a call is forwarded, and the stage of the chain that is (for FORWARDING).
#[derive(Clone, Copy)]
pub struct To<F> {
    f: F,
    stage: usize,
}

/// FORWARDING stages, in the low bit of an entry's (aligned) address.
const NEXT: usize = 1;
const LIBC: usize = 0;

/// libc's entry point of one memory call (one the patch monitor may patch), typed `F`, and
/// the next definition of its name after ours when that is not libc's.
pub struct Entry<F> {
    libc: Symbol<F>,
    /// None: a call whose hook issues the system call itself when there is no next
    /// interposer (`unpatched`).
    target: Option<PatchTarget>,
    /// Another interposer's definition, found next after ours (null: none; `UNRESOLVED`:
    /// not looked up yet).
    next: AtomicPtr<c_void>,
}

impl<F: Copy> Entry<F> {
    /// # Safety
    /// `F` must be glibc's prototype of `target`'s function (a variadic one as its
    /// fixed-argument form where the x86-64 calling convention passes the arguments alike).
    const unsafe fn new(target: PatchTarget) -> Self {
        // SAFETY: the caller's contract.
        unsafe { Self::named(target, target.name()) }
    }

    /// The entry exported as `name`, an alias of `target`'s function in libc (mmap64).
    ///
    /// # Safety
    /// As `new`, for `name`.
    const unsafe fn named(target: PatchTarget, name: &'static CStr) -> Self {
        Entry {
            // SAFETY: the caller's contract.
            libc: unsafe { Symbol::next(name) },
            target: Some(target),
            next: AtomicPtr::new(UNRESOLVED),
        }
    }

    /// A call with no `PatchTarget` (mprotect, whose patched libc entry leads to the same
    /// hook, and calls libc never makes itself): only the next interposer is looked for;
    /// without one the hook issues the system call itself.
    ///
    /// # Safety
    /// As `new`, for `name`.
    const unsafe fn unpatched(name: &'static CStr) -> Self {
        Entry {
            // SAFETY: the caller's contract.
            libc: unsafe { Symbol::next(name) },
            target: None,
            next: AtomicPtr::new(UNRESOLVED),
        }
    }

    fn name(&self) -> &'static CStr {
        self.libc.name()
    }

    /// Where to send the call whose first argument is `key`, which reached us `via`: the
    /// next interposer (a call through our symbol); else the other patcher's hook our jump
    /// took libc's entry from; else libc's entry point, unless it holds our own jump.
    /// None: issue the system call.
    #[inline(always)]
    pub fn target(&self, key: usize, via: Via) -> Option<To<F>> {
        // The same call again from inside one we forwarded (the other library's hook calls
        // the function it found with dlsym(RTLD_NEXT): libc's entry, our jump, us; or our
        // symbol): from the next interposer, on to libc's entry; from libc's entry (the
        // other patcher's hook), the system call now. Any other call made in there (its
        // handler releasing memory) is forwarded like one from the program, or the other
        // library would not see it.
        let Ok((inside, k)) = FORWARDING.try_with(Cell::get) else {
            return None;
        };
        // The stage of this very call we are inside, if any.
        let back = (k == key && inside & !NEXT == self.tag()).then_some(inside & NEXT);
        if back == Some(LIBC) {
            return None;
        }
        if via == Via::Symbol && back.is_none() {
            let next = self.next();
            if !next.is_null() {
                return Some(To {
                    f: Self::typed(next),
                    stage: NEXT,
                });
            }
        }
        // An unpatched entry: the hook issues the system call.
        let at = match crate::monitor::patch::site(self.target?) {
            crate::monitor::patch::Site::Chained(t) => t as *mut c_void,
            crate::monitor::patch::Site::Ours => return None,
            crate::monitor::patch::Site::Other => {
                let mut at = self.libc.address();
                if at.is_null() {
                    // The first call: from libc's symbol table, without dlsym or allocation.
                    at = crate::sys::elf::libc_symbol(self.name());
                    self.libc.store(at);
                }
                if at.is_null() {
                    return None;
                }
                at
            }
        };
        Some(To {
            f: Self::typed(at),
            stage: LIBC,
        })
    }

    fn typed(at: *mut c_void) -> F {
        const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
        // SAFETY: F is a function pointer type (same size, checked above) with the entry's
        // prototype (new's contract); `at` is libc's entry, the hook that replaced it, or
        // the next definition of the same name, which all take the same arguments.
        unsafe { std::mem::transmute_copy::<*mut c_void, F>(&at) }
    }

    /// Run `call` with the function of `to` (the forwarded call whose first argument is
    /// `key`), marking the thread as inside it.
    #[inline(always)]
    pub fn run<T>(&self, key: usize, to: To<F>, call: impl FnOnce(F) -> T) -> T {
        let outer = FORWARDING.try_with(|f| f.replace((self.tag() | to.stage, key)));
        let r = call(to.f);
        if let Ok(outer) = outer {
            let _ = FORWARDING.try_with(|f| f.set(outer));
        }
        r
    }

    /// Whether this thread is inside the call `key` of this entry that it forwarded to the
    /// next interposer: the call coming back, whose range the outer call reported already.
    pub fn returning(&self, key: usize) -> bool {
        FORWARDING.try_with(Cell::get).ok() == Some((self.tag() | NEXT, key))
    }

    /// Which entry this is (its address, aligned: the low bit holds the stage).
    fn tag(&self) -> usize {
        self as *const Self as usize
    }

    /// The next definition of the name after ours when that is not libc's entry (null:
    /// none), looked up at the first call.
    fn next(&self) -> *mut c_void {
        let next = self.next.load(Acquire);
        if next != UNRESOLVED {
            return next;
        }
        let found = crate::sys::elf::next_after_own(self.name());
        let libc = crate::sys::elf::libc_symbol(self.name());
        let next = if !found.is_null() && !libc.is_null() && found != libc {
            found
        } else {
            std::ptr::null_mut()
        };
        self.next.store(next, Release);
        next
    }
}

/// `Entry::next` before its lookup (no function is at address 1).
const UNRESOLVED: *mut c_void = std::ptr::dangling_mut::<c_void>();

thread_local! {
    static FORWARDING_STD: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}
/// The call a hook of this thread is forwarding: (entry | stage, first argument); (0, 0):
/// none. In the front's static TLS (hooks run inside allocators).
static FORWARDING: ThreadCell<(usize, usize)> = ThreadCell::new(TLS_FORWARDING, &FORWARDING_STD);

pub type MunmapFn = unsafe extern "C" fn(*mut c_void, usize) -> c_int;
pub type MadviseFn = unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int;
pub type MremapFn =
    unsafe extern "C" fn(*mut c_void, usize, usize, c_int, *mut c_void) -> *mut c_void;
pub type MmapFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, i64) -> *mut c_void;
pub type ShmatFn = unsafe extern "C" fn(c_int, *const c_void, c_int) -> *mut c_void;
pub type ShmdtFn = unsafe extern "C" fn(*const c_void) -> c_int;
pub type BrkFn = unsafe extern "C" fn(*mut c_void) -> c_int;
pub type SbrkFn = unsafe extern "C" fn(isize) -> *mut c_void;
pub type MprotectFn = unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int;
pub type PkeyMprotectFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int) -> c_int;
pub type ProcessMadviseFn =
    unsafe extern "C" fn(c_int, *const libc::iovec, usize, c_int, libc::c_uint) -> isize;
pub type RemapFilePagesFn = unsafe extern "C" fn(*mut c_void, usize, c_int, usize, c_int) -> c_int;

// SAFETY: glibc's munmap has this prototype.
pub static MUNMAP: Entry<MunmapFn> = unsafe { Entry::new(PatchTarget::Munmap) };
// SAFETY: glibc's madvise has this prototype.
pub static MADVISE: Entry<MadviseFn> = unsafe { Entry::new(PatchTarget::Madvise) };
// SAFETY: glibc's mremap prototype; mremap is variadic, and on x86-64 its fifth argument
// travels in its register either way.
pub static MREMAP: Entry<MremapFn> = unsafe { Entry::new(PatchTarget::Mremap) };
// SAFETY: glibc's mmap has this prototype.
pub static MMAP: Entry<MmapFn> = unsafe { Entry::new(PatchTarget::Mmap) };
// SAFETY: glibc's mmap64 has this prototype.
/// libc's mmap64 is its mmap; an interposer may define either.
pub static MMAP64: Entry<MmapFn> = unsafe { Entry::named(PatchTarget::Mmap, c"mmap64") };
// SAFETY: glibc's shmat has this prototype.
pub static SHMAT: Entry<ShmatFn> = unsafe { Entry::new(PatchTarget::Shmat) };
// SAFETY: glibc's shmdt has this prototype.
pub static SHMDT: Entry<ShmdtFn> = unsafe { Entry::new(PatchTarget::Shmdt) };
// SAFETY: glibc's brk has this prototype.
pub static BRK: Entry<BrkFn> = unsafe { Entry::new(PatchTarget::Brk) };
// SAFETY: glibc's sbrk has this prototype.
pub static SBRK: Entry<SbrkFn> = unsafe { Entry::new(PatchTarget::Sbrk) };
// SAFETY: glibc's mprotect has this prototype.
pub static MPROTECT: Entry<MprotectFn> = unsafe { Entry::unpatched(c"mprotect") };
// SAFETY: glibc's pkey_mprotect has this prototype.
pub static PKEY_MPROTECT: Entry<PkeyMprotectFn> = unsafe { Entry::unpatched(c"pkey_mprotect") };
// SAFETY: glibc's posix_madvise has this prototype.
pub static POSIX_MADVISE: Entry<MadviseFn> = unsafe { Entry::unpatched(c"posix_madvise") };
// SAFETY: glibc's process_madvise has this prototype.
pub static PROCESS_MADVISE: Entry<ProcessMadviseFn> =
    unsafe { Entry::unpatched(c"process_madvise") };
// SAFETY: glibc's remap_file_pages has this prototype.
pub static REMAP_FILE_PAGES: Entry<RemapFilePagesFn> =
    unsafe { Entry::unpatched(c"remap_file_pages") };

/// The interposer found next after us for the memory function `name` (null: none). `dlsym`
/// answers it where the loader's answer would be our own hook: without us the caller (an
/// interposer before ours, or a lookup from the program) would get that definition.
pub fn next_definition(name: &CStr) -> *mut c_void {
    let nexts: [(&CStr, &dyn Fn() -> *mut c_void); 9] = [
        (MUNMAP.name(), &|| MUNMAP.next()),
        (MADVISE.name(), &|| MADVISE.next()),
        (MREMAP.name(), &|| MREMAP.next()),
        (MMAP.name(), &|| MMAP.next()),
        (MMAP64.name(), &|| MMAP64.next()),
        (SHMAT.name(), &|| SHMAT.next()),
        (SHMDT.name(), &|| SHMDT.next()),
        (BRK.name(), &|| BRK.next()),
        (SBRK.name(), &|| SBRK.next()),
    ];
    nexts
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(std::ptr::null_mut(), |(_, next)| next())
}

/// Look up every entry's next definition now (the constructor, where the lookups are
/// libc's `dlsym`: `elf::walks_answer`).
pub fn resolve_all() {
    for next in [
        MUNMAP.next(),
        MADVISE.next(),
        MREMAP.next(),
        MMAP.next(),
        MMAP64.next(),
        SHMAT.next(),
        SHMDT.next(),
        BRK.next(),
        SBRK.next(),
        MPROTECT.next(),
        PKEY_MPROTECT.next(),
        POSIX_MADVISE.next(),
        PROCESS_MADVISE.next(),
        REMAP_FILE_PAGES.next(),
    ] {
        let _ = next;
    }
}
