//! The entry points the front's slots lead to: the verbs hooks, each a line into `calls`
//! (what the hook does); `dlsym`/`dlvsym` (in `dlsym.rs`); `dlclose` and `_Fork`; the
//! `mrcache info` exports; and `mrcache_engine_attach`, the engine's one export, which fills
//! the slots (the front exports the symbols, under libibverbs' and glibc's versions).
//!
//! Layer: the top. May use every layer below (docs/design/overview.md).

mod dlsym;

use crate::ffi::{IbvContext, IbvMr, IbvPd};
use crate::sys::front_abi::{self, FrontInfo, SLOTS};
use mrcache::trace::Call;
use std::ffi::{CStr, c_int, c_uint, c_void};
use std::sync::atomic::Ordering::Release;

/// For `mrcache info`: run the unmap self-test in this process and write its result (text,
/// one path a line) into `buf`; returns the bytes written.
///
/// # Safety
/// `buf` must be writable for `len` bytes.
unsafe extern "C" fn selftest_report(buf: *mut u8, len: usize) -> usize {
    let text = std::panic::catch_unwind(crate::runtime::init::selftest_report).unwrap_or_default();
    let n = text.len().min(len);
    // SAFETY: the caller passes a writable buffer of len bytes.
    unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), buf, n) };
    n
}

/// The verbs hooks, as `dlsym`/`dlvsym` hand them out in place of libibverbs' functions.
pub(crate) static HOOKED: [crate::monitor::dlsym::Hooked; 9] = [
    hooked(c"ibv_reg_mr", c"IBVERBS_1.1", || {
        reg_mr as *const () as usize
    }),
    hooked(c"ibv_reg_mr_iova", c"IBVERBS_1.7", || {
        reg_mr_iova as *const () as usize
    }),
    hooked(c"ibv_reg_mr_iova2", c"IBVERBS_1.8", || {
        reg_mr_iova2 as *const () as usize
    }),
    hooked(c"ibv_dereg_mr", c"IBVERBS_1.1", || {
        dereg_mr as *const () as usize
    }),
    hooked(c"ibv_rereg_mr", c"IBVERBS_1.1", || {
        rereg_mr as *const () as usize
    }),
    hooked(c"ibv_reg_dmabuf_mr", c"IBVERBS_1.12", || {
        reg_dmabuf_mr as *const () as usize
    }),
    hooked(c"ibv_dealloc_pd", c"IBVERBS_1.1", || {
        dealloc_pd as *const () as usize
    }),
    hooked(c"ibv_close_device", c"IBVERBS_1.1", || {
        close_device as *const () as usize
    }),
    hooked(c"ibv_fork_init", c"IBVERBS_1.1", || {
        fork_init as *const () as usize
    }),
];

const fn hooked(
    name: &'static CStr,
    version: &'static CStr,
    hook: fn() -> usize,
) -> crate::monitor::dlsym::Hooked {
    crate::monitor::dlsym::Hooked {
        name,
        version,
        hook,
    }
}

extern "C" fn reg_mr(pd: *mut IbvPd, addr: *mut c_void, len: usize, access: c_int) -> *mut IbvMr {
    crate::calls::register(pd, addr, len, addr as u64, access as u32, Call::RegMr)
}

extern "C" fn reg_mr_iova(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut IbvMr {
    crate::calls::register(pd, addr, len, iova, access as u32, Call::RegMrIova)
}

extern "C" fn reg_mr_iova2(
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut IbvMr {
    crate::calls::register(pd, addr, len, iova, access, Call::RegMrIova2)
}

extern "C" fn dereg_mr(mr: *mut IbvMr) -> c_int {
    crate::calls::dereg_mr(mr)
}

extern "C" fn rereg_mr(
    mr: *mut IbvMr,
    flags: c_int,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> c_int {
    crate::calls::rereg_mr(mr, flags, pd, addr, len, access)
}

extern "C" fn reg_dmabuf_mr(
    pd: *mut IbvPd,
    offset: u64,
    len: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut IbvMr {
    // dma-buf memory is not process memory: nothing to cache or invalidate.
    crate::calls::reg_dmabuf_mr(pd, offset, len, iova, fd, access)
}

extern "C" fn dealloc_pd(pd: *mut IbvPd) -> c_int {
    crate::calls::dealloc_pd(pd)
}

extern "C" fn close_device(ctx: *mut IbvContext) -> c_int {
    crate::calls::close_device(ctx)
}

extern "C" fn fork_init() -> c_int {
    crate::calls::fork_init()
}

/// `dlclose`: the loader unmaps the object with its own munmap, which no memory hook sees
/// (`monitor::dl`).
extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    crate::monitor::dl::dlclose(handle)
}

/// `_Fork()`: skips the atfork handlers; async-signal-safe (`runtime::fork`).
extern "C" fn underscore_fork() -> libc::pid_t {
    crate::runtime::fork::signal_safe_fork()
}

/// The engine's entry point for the front's slot named `name`.
fn entry(name: &[u8]) -> Option<usize> {
    use crate::monitor::memory as m;
    let at = match name {
        b"munmap" => m::munmap as *const () as usize,
        b"madvise" => m::madvise as *const () as usize,
        b"mremap" => m::mremap as *const () as usize,
        b"mmap" => m::mmap as *const () as usize,
        b"mmap64" => m::mmap64 as *const () as usize,
        b"brk" => m::brk as *const () as usize,
        b"sbrk" => m::sbrk as *const () as usize,
        b"shmat" => m::shmat as *const () as usize,
        b"shmdt" => m::shmdt as *const () as usize,
        b"realloc" => m::realloc as *const () as usize,
        b"mprotect" => m::mprotect as *const () as usize,
        b"pkey_mprotect" => m::pkey_mprotect as *const () as usize,
        b"posix_madvise" => m::posix_madvise as *const () as usize,
        b"process_madvise" => m::process_madvise as *const () as usize,
        b"remap_file_pages" => m::remap_file_pages as *const () as usize,
        b"dlclose" => dlclose as *const () as usize,
        b"_Fork" => underscore_fork as *const () as usize,
        b"mrcache_selftest_report" => selftest_report as *const () as usize,
        b"mrcache_patch_watch_clean" => {
            crate::monitor::patch::mrcache_patch_watch_clean as *const () as usize
        }
        b"dlsym" => dlsym::entries().0,
        b"dlvsym" => dlsym::entries().1,
        _ => {
            return HOOKED
                .iter()
                .find(|h| h.name.to_bytes() == name)
                .map(|h| (h.hook)());
        }
    };
    Some(at)
}

/// The engine's one export: the front (`front_abi::FrontInfo`) attaches it at the first
/// verbs call. Sets the monitor up as the library's constructor did (`load::install`:
/// getenv only, nothing printed or allocated, libc patched here only where it must be
/// patched with one thread), then fills every slot with the engine's entry point. Returns
/// 1, or 0 (nothing filled) for a front of another build.
///
/// # Safety
/// `info` must point to the front's `FrontInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mrcache_engine_attach(info: *const FrontInfo) -> c_int {
    // SAFETY: the caller's promise.
    let Some(info) = (unsafe { info.as_ref() }) else {
        return 0;
    };
    let entries: Option<Vec<usize>> = (0..SLOTS)
        .map(|i| entry(front_abi::slot(i).0.to_bytes()))
        .collect();
    let Some(entries) = entries else { return 0 };
    if !crate::sys::front::attach(info) {
        return 0;
    }
    crate::monitor::load::install();
    // SAFETY: the front's SLOTS slots.
    let slots = unsafe { std::slice::from_raw_parts(info.slots, SLOTS) };
    for (slot, at) in slots.iter().zip(entries) {
        slot.store(at, Release);
    }
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every slot of the front has an entry point here, and each verbs slot's version is
    /// the one the engine's `dlsym` answers for: a slot added on one side only would leave
    /// the front calling through an empty slot, or attach refusing every front.
    #[test]
    fn every_slot_of_the_front_has_an_entry_point() {
        for i in 0..SLOTS {
            let (name, kind) = front_abi::slot(i);
            assert!(
                entry(name.to_bytes()).is_some(),
                "no entry point for {name:?}"
            );
            if kind == front_abi::Kind::Verbs {
                let hooked = HOOKED.iter().find(|h| h.name == name).unwrap();
                assert_eq!(hooked.version, front_abi::verbs_version(i), "{name:?}");
            }
        }
        assert_eq!(
            HOOKED.len(),
            (0..SLOTS)
                .filter(|&i| front_abi::slot(i).1 == front_abi::Kind::Verbs)
                .count()
        );
    }
}
