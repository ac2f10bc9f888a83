//! The entry points: every symbol libmrcache.so exports for the verbs calls it replaces,
//! each a line into `calls` (what the hook does); `dlsym`/`dlvsym` (in `dlsym.rs`);
//! `dlclose` and `_Fork`; the `mrcache info` exports and the constructor. The hooks are exported under libibverbs'
//! own symbol versions (`libmrcache.map`), defined here with `global_asm!` so that rustc's
//! version script (which exports everything unversioned) does not claim them. (The memory
//! hooks -- munmap, madvise, mmap, brk, ... -- are exported by `monitor::memory`, whose
//! patching and watch need their own addresses.)
//!
//! Layer: the top. May use every layer below (docs/design/overview.md).

mod dlsym;

use crate::ffi::{IbvContext, IbvMr, IbvPd};
use mrcache::trace::Call;
use std::ffi::{CStr, c_int, c_uint, c_void};

/// Exported so that tools (and tests) can tell the library is loaded: `dlsym(RTLD_DEFAULT,
/// "mrcache_version")` returns a NUL-terminated version string.
#[unsafe(no_mangle)]
pub static mrcache_version: [u8; mrcache::VERSION.len() + 1] = {
    let mut out = [0u8; mrcache::VERSION.len() + 1];
    let v = mrcache::VERSION.as_bytes();
    let mut i = 0;
    while i < v.len() {
        out[i] = v[i];
        i += 1;
    }
    out
};

/// For `mrcache info`: run the unmap self-test in this process and write its result (text,
/// one path a line) into `buf`; returns the bytes written.
///
/// # Safety
/// `buf` must be writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mrcache_selftest_report(buf: *mut u8, len: usize) -> usize {
    let text = std::panic::catch_unwind(crate::runtime::init::selftest_report).unwrap_or_default();
    let n = text.len().min(len);
    // SAFETY: the caller passes a writable buffer of len bytes.
    unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), buf, n) };
    n
}

/// Export `$name` (a C symbol) as an alias of the Rust function `$f`.
macro_rules! export {
    ($name:literal = $f:path) => {
        std::arch::global_asm!(
            concat!(".globl ", $name),
            concat!(".type ", $name, ", @function"),
            concat!(".set ", $name, ", {f}"),
            f = sym $f,
        );
    };
}

export!("ibv_reg_mr" = reg_mr);
export!("ibv_reg_mr_iova" = reg_mr_iova);
export!("ibv_reg_mr_iova2" = reg_mr_iova2);
export!("ibv_dereg_mr" = dereg_mr);
export!("ibv_rereg_mr" = rereg_mr);
export!("ibv_reg_dmabuf_mr" = reg_dmabuf_mr);
export!("ibv_dealloc_pd" = dealloc_pd);
export!("ibv_close_device" = close_device);
export!("ibv_fork_init" = fork_init);

/// The hooks above as `dlsym`/`dlvsym` hand them out in place of libibverbs' functions.
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
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    crate::monitor::dl::dlclose(handle)
}

/// `_Fork()`: skips the atfork handlers; async-signal-safe (`runtime::fork`).
#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_snake_case)] // glibc's name
pub extern "C" fn _Fork() -> libc::pid_t {
    crate::runtime::fork::signal_safe_fork()
}

/// Constructor: read `MRCACHE_MONITOR` and `MRCACHE_ENABLE` and note our hooks' first bytes
/// (`load::install`). It never loads or looks up libibverbs (its functions are looked up at
/// first use), allocates nothing, prints nothing and patches nothing (libc's entries are
/// patched at the first registration: `load::patch_libc`); the hooks look up libc's
/// functions and the next definitions at their first call (`monitor::forward`), so a process
/// that never registers memory runs as without us.
extern "C" fn init() {
    crate::monitor::load::install();
}

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;
