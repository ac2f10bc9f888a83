//! `ibv_rereg_mr`: of a handle the cache has (its only one, reserved: the provider is asked;
//! a shared one, a window's, the parent's: refused as libibverbs would refuse it), or of
//! one the cache never made (libibverbs').

use super::*;
use crate::ffi::{self, IbvMr, IbvPd};
use crate::verbs::provider::Provider;
use crate::verbs::real;
use mrcache::cache::Cache;
use std::ffi::c_void;

pub fn rereg_mr(
    mr: *mut IbvMr,
    flags: i32,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: i32,
) -> i32 {
    let t = if trace::enabled() { trace::now_ns() } else { 0 };
    let rc = rereg_inner(mr, flags, pd, addr, len, access);
    if t != 0 {
        let o = if rc == 0 {
            Outcome::Passthrough
        } else {
            Outcome::Failed
        };
        trace::emit(
            Call::ReregMr,
            o,
            [mr as u64, flags as u64, addr as u64, len as u64, 0],
            rc as i64,
            t,
        );
    }
    rc
}

pub(super) fn rereg_inner(
    mr: *mut IbvMr,
    flags: i32,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: i32,
) -> i32 {
    let passthrough = || real::rereg_mr(mr, flags, pd, addr, len, access);
    if mr.is_null() {
        return passthrough();
    }
    with_cache(passthrough, |cache| {
        match cache.detach(mr as usize) {
            Detached::NotOurs if crate::runtime::inherited_mr(mr) => {
                // A fork child's rereg of the parent's cached MR would move the parent's
                // registration (and its other users') onto the child's pages.
                refused(mr, flags, pd, addr, len, access, || {
                    trace::write_line(&format!(
                        "mrcache: ibv_rereg_mr({mr:p}): this registration belongs to the parent process's cache (inherited across fork) and cannot be changed here; returning IBV_REREG_MR_ERR_CMD, EOPNOTSUPP"
                    ))
                })
            }
            Detached::NotOurs => passthrough(),
            Detached::Released => {
                // A use after ibv_dereg_mr: libibverbs would change the cached MR in place
                // (or read a freed one). As libibverbs answers bad input.
                trace::write_line(&format!(
                    "mrcache: ibv_rereg_mr({mr:p}): this registration was already deregistered (ibv_rereg_mr after ibv_dereg_mr of the same MR); returning EINVAL"
                ));
                real::set_errno(libc::EINVAL);
                ffi::IBV_REREG_MR_ERR_INPUT
            }
            Detached::Shared
                if mrcache::access::rereg_args_valid(flags, addr as usize, len, access)
                    && has_rereg_op(mr)
                    && let Some(h) = reserve_sole(cache, mr) =>
            {
                sole_rereg(cache, mr, h, flags, pd, addr, len, access)
            }
            Detached::Shared => refused(mr, flags, pd, addr, len, access, || {
                log(
                    LogLevel::Error,
                    format_args!(
                        "ibv_rereg_mr({mr:p}): this registration is shared with other users through the cache (or its remote key is a memory window's) and cannot be changed in place; returning IBV_REREG_MR_ERR_CMD, EOPNOTSUPP; deregister and register instead, or set MRCACHE_ENABLE=0"
                    ),
                )
            }),
            Detached::Alias(m) => {
                // The app's handle is a copy of m (a shadow or window's handle taken over
                // by an earlier rereg): re-register m, then bring the copy level with it
                // (a refused rereg changed nothing: the copy is as it was).
                let rc = provider_rereg(m.ptr as *mut IbvMr, flags, pd, addr, len, access);
                copy_mr(mr, m);
                rc
            }
            Detached::Sole(m) => {
                // Now the app's own, uncached registration; its dereg takes m's path.
                let rc = if m.via_wrapper {
                    passthrough()
                } else {
                    provider_rereg(mr, flags, pd, addr, len, access)
                };
                cache.adopt_uncached(m);
                rc
            }
        }
    })
}

/// `ibv_rereg_mr` of the app's only handle of a registration, a shadow or a revocable
/// registration's handle (its rkey a window's), reserved by `Cache::reserve_sole`. The
/// provider is asked first, on the cached MR, with the handle's own rights (a
/// revocable MR had local rights and MW_BIND only, a shared one its first registrant's:
/// CHANGE_ACCESS with the rights the handle registered with, unless the app changes them
/// itself). Refused: the entry and the handle are as they were, window bound, the
/// provider's answer returned: a failed rereg changes nothing the program can see. Done:
/// the window is revoked, the entry leaves the cache, and the app's handle, a copy, takes
/// the MR's new fields and is the MR's own from then on.
#[allow(clippy::too_many_arguments)]
pub(super) fn sole_rereg(
    cache: &Cache<Provider>,
    mr: *mut IbvMr,
    h: mrcache::cache::SoleHandle,
    flags: i32,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: i32,
) -> i32 {
    let change_access = mrcache::access::REREG_CHANGE_ACCESS;
    let (flags, access) = if flags & change_access != 0 || (!h.grant && h.access == h.entry_access)
    {
        (flags, access)
    } else {
        (flags | change_access, h.access as i32)
    };
    let rc = provider_rereg(h.mr.ptr as *mut IbvMr, flags, pd, addr, len, access);
    if rc != 0 {
        // The provider's errno, not our lock's.
        let e = crate::sys::errno();
        cache.abort_sole(mr as usize, h);
        crate::sys::set_errno(e);
        return rc;
    }
    // The window's key must reach nothing once the handle is the MR's own. Only the
    // window: the registrar's revoke would also hand the slot out again as a spare, and
    // the app keeps it (it goes back at the alias's dereg).
    if h.grant
        && let Err(e) = crate::verbs::window::revoke(mr as usize)
    {
        log(
            LogLevel::Error,
            format_args!(
                "ibv_rereg_mr({mr:p}): re-registered, but the old remote key's memory window could be neither unbound nor deallocated (errno {e}); it stays bound until this handle's ibv_dereg_mr"
            ),
        );
    }
    copy_mr(mr, h.mr);
    cache.commit_sole(mr as usize, h);
    0
}

/// The app's handle `mr`, a copy of the provider's MR `m`, takes m's fields (keys, kernel
/// handle, range, PD).
pub(super) fn copy_mr(mr: *mut IbvMr, m: mrcache::cache::Mr) {
    // SAFETY: both are live MR objects at least VERBS_MR_SIZE long (the copy is a shadow
    // slot, made as such a copy of m), and distinct.
    unsafe {
        std::ptr::copy_nonoverlapping(m.ptr as *const u8, mr as *mut u8, crate::ffi::VERBS_MR_SIZE)
    };
}

/// `Cache::reserve_sole` for the app's handle `mr` over the range it shows.
pub(super) fn reserve_sole(
    cache: &Cache<Provider>,
    mr: *mut IbvMr,
) -> Option<mrcache::cache::SoleHandle> {
    // SAFETY: a handle the cache handed out (a shadow slot), readable.
    let (addr, len) = unsafe { ((*mr).addr as usize, (*mr).length) };
    cache.reserve_sole(mr as usize, addr, len)
}

/// Whether the provider of `mr`'s context has a rereg op of its own (neither none nor
/// libibverbs' placeholder, which answers for it changing nothing).
pub(super) fn has_rereg_op(mr: *mut IbvMr) -> bool {
    // SAFETY: a handle the cache handed out: its context is the app's live context.
    let op = unsafe { (*(*mr).context).ops._compat_rereg_mr };
    !op.is_null() && !libibverbs_placeholder(op)
}

/// A rereg the cache cannot hand to the provider for this handle (the registration is
/// shared, the handle's remote key is a window's, or it is the parent's in a fork child),
/// answered as libibverbs answers it: its argument checks first
/// (`IBV_REREG_MR_ERR_INPUT`, EINVAL); then, when the provider has no rereg op of its own
/// (libibverbs' placeholder is in the op table: rxe, siw), that op's own answer, which
/// changes nothing (`IBV_REREG_MR_ERR_CMD`, EOPNOTSUPP); otherwise `why` is told and the
/// answer is the same `IBV_REREG_MR_ERR_CMD` with EOPNOTSUPP: this MR cannot be
/// re-registered here, a program falls back to deregister and register. Never a stale errno.
pub(super) fn refused(
    mr: *mut IbvMr,
    flags: i32,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: i32,
    why: impl FnOnce(),
) -> i32 {
    if !mrcache::access::rereg_args_valid(flags, addr as usize, len, access) {
        real::set_errno(libc::EINVAL);
        return ffi::IBV_REREG_MR_ERR_INPUT;
    }
    // SAFETY: mr is a handle the cache handed out (or the parent's, copied at fork): its
    // context is the app's live context.
    let op = unsafe { (*(*mr).context).ops._compat_rereg_mr };
    if !op.is_null() && libibverbs_placeholder(op) {
        // SAFETY: libibverbs' placeholder rereg op (dummy_ops.c): it reads none of its
        // arguments, sets errno and fails.
        let rc = unsafe {
            let f: ffi::ProviderReregMr = std::mem::transmute(op);
            f(mr, flags, pd, addr, len, access)
        };
        if rc != 0 {
            return ffi::IBV_REREG_MR_ERR_CMD;
        }
    }
    why();
    real::set_errno(libc::EOPNOTSUPP);
    ffi::IBV_REREG_MR_ERR_CMD
}

/// Whether a context's rereg op is libibverbs' own placeholder (the provider has none): it
/// lives in the object `ibv_rereg_mr` itself lives in, a shared libibverbs, while a
/// provider's op lives in the provider's library. Where libibverbs and its providers are
/// linked into one object (static builds) nothing tells them apart: not a placeholder.
pub(super) fn libibverbs_placeholder(op: *mut c_void) -> bool {
    let Some(wrapper) = real::REREG_MR.get() else {
        return false;
    };
    let object = |p: *const c_void| {
        // SAFETY: Dl_info is plain data, written by dladdr on success.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads the loader's tables.
        if unsafe { libc::dladdr(p, &mut info) } == 0 || info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: dli_fname is the loader's NUL-terminated name of the object.
        let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
        Some((
            info.dli_fbase as usize,
            name.to_bytes().windows(10).any(|w| w == b"libibverbs"),
        ))
    };
    match (object(op), object(wrapper as *const c_void)) {
        (Some((a, true)), Some((b, _))) => a == b,
        _ => false,
    }
}

/// `ibv_rereg_mr` for an MR made through the provider op: libibverbs' checks, then the
/// provider's rereg op, without the fork bookkeeping (the MR never had any).
pub(super) fn provider_rereg(
    mr: *mut IbvMr,
    flags: i32,
    pd: *mut IbvPd,
    addr: *mut c_void,
    len: usize,
    access: i32,
) -> i32 {
    if !mrcache::access::rereg_args_valid(flags, addr as usize, len, access) {
        real::set_errno(libc::EINVAL);
        return ffi::IBV_REREG_MR_ERR_INPUT;
    }
    // SAFETY: mr is a live provider-registered MR; the op has the provider rereg prototype.
    unsafe {
        let op = (*(*mr).context).ops._compat_rereg_mr;
        if op.is_null() {
            real::set_errno(libc::EOPNOTSUPP);
            return ffi::IBV_REREG_MR_ERR_INPUT;
        }
        let f: ffi::ProviderReregMr = std::mem::transmute(op);
        if f(mr, flags, pd, addr, len, access) != 0 {
            return ffi::IBV_REREG_MR_ERR_CMD;
        }
        if flags & mrcache::access::REREG_CHANGE_PD != 0 {
            (*mr).pd = pd;
        }
        if flags & mrcache::access::REREG_CHANGE_TRANSLATION != 0 {
            (*mr).addr = addr;
            (*mr).length = len;
        }
    }
    0
}
