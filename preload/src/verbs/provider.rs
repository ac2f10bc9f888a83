//! `Registrar` over the verbs provider: registers through the provider's own ops
//! (`ctx->ops._compat_reg_mr`/`_compat_dereg_mr`), skipping libibverbs' per-registration
//! MADV_DONTFORK bookkeeping, or through the real `ibv_reg_mr_iova2`/`ibv_dereg_mr` when the
//! op is missing or optional access flags need libibverbs' masking. Each MR is deregistered
//! by the path that made it, so libibverbs' fork refcounts stay balanced.

use crate::ffi::{IbvContext, IbvMr, IbvPd, ProviderDeregMr, ProviderRegMr, VERBS_MR_SIZE};
use crate::verbs::odp::Policy;
use crate::verbs::real;
use mrcache::access::{MW_BIND, ON_DEMAND, OPTIONAL_RANGE, REMOTE};
use mrcache::cache::{Mr, Registrar, Request};
use mrcache::config::LogLevel;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

/// Room for one shadow `ibv_mr`: `struct verbs_mr` is copied in, the rest stays zero, so a
/// provider that reads a private field past it (mlx5's bind_mw) reads zeros, not beyond
/// our allocation.
const SHADOW_BYTES: usize = 256;

/// Registers through the provider; with `MRCACHE_VERIFY=pfn` also records, per MR, the
/// page frames its range had at registration.
pub struct Provider {
    pub verify: bool,
    /// Which registrations are made on demand (`MRCACHE_ODP`).
    pub odp: Policy,
    /// Writes one line at or above the configured level (the runtime's `log`): given, as
    /// the layer below the runtime cannot ask it.
    pub log: fn(LogLevel, std::fmt::Arguments<'_>),
    frames: Mutex<HashMap<usize, (usize, Vec<u64>)>>,
    /// Handles of revoked grants, reused for the next grant (never freed).
    spare_grants: Mutex<Vec<usize>>,
}

impl Provider {
    pub fn new(verify: bool, odp: Policy, log: fn(LogLevel, std::fmt::Arguments<'_>)) -> Provider {
        Provider {
            verify,
            odp,
            log,
            frames: Mutex::new(HashMap::new()),
            spare_grants: Mutex::new(Vec::new()),
        }
    }

    /// Register `made`, the cache's form of the app's request `app`: on demand where the
    /// policy says so; and where pinning fails for want of lockable memory (ENOMEM, EAGAIN:
    /// the memlock limit) and `auto` finds the device able, on demand instead, which pins
    /// nothing. A failed second try leaves the first one's errno.
    ///
    /// A device that refuses an on-demand registration its capabilities promised is treated
    /// as one without ODP from then on: the entry is pinned instead where the monitor sees
    /// every unmap, and where it does not (only on-demand entries cached) the error goes
    /// back with the policy now refusing the request, so the cache passes it through to
    /// libibverbs (`Cache::acquire`). The app's registration never fails for the policy.
    /// An on-demand registration refused for want of memory (ENOMEM, EAGAIN) is not such a
    /// refusal: that entry is pinned, where pinned entries are cached.
    fn register_for(&self, app: &Request, made: Request) -> Result<Mr, i32> {
        let on_demand = Request {
            access: made.access | ON_DEMAND,
            ..made
        };
        if self.odp.applies(app) {
            let e = match self.register_as(&on_demand) {
                Err(e) => e,
                ok => return ok,
            };
            // Short of memory for this one (an on-demand registration pins nothing, so the
            // kernel's memory itself): pinned, and the device keeps its standing.
            if matches!(e, libc::ENOMEM | libc::EAGAIN) && self.odp.only_why().is_none() {
                return self.register_as(&made);
            }
            self.odp.refused(app.context);
            (self.log)(
                LogLevel::Info,
                format_args!(
                    "ibv_reg_mr({:#x}, {}): the device refused to register on demand (errno {e}), which it reports it can: its registrations are pinned from now on",
                    app.addr, app.len
                ),
            );
            if self.odp.only_why().is_some() {
                crate::sys::set_errno(e);
                return Err(e);
            }
            return self.register_as(&made);
        }
        match self.register_as(&made) {
            Err(e)
                if matches!(e, libc::ENOMEM | libc::EAGAIN) && self.odp.instead_of_pinning(app) =>
            {
                (self.log)(
                    LogLevel::Debug,
                    format_args!(
                        "ibv_reg_mr({:#x}, {}): pinning failed (errno {e}): registered on demand instead",
                        app.addr, app.len
                    ),
                );
                self.register_as(&on_demand)
                    .inspect_err(|_| crate::sys::set_errno(e))
                    .map_err(|_| e)
            }
            r => r,
        }
    }

    /// Register exactly `req` (its access flags as given) through the provider's op, or
    /// libibverbs' wrapper where the op is missing or optional bits need its masking.
    fn register_as(&self, req: &Request) -> Result<Mr, i32> {
        let pd = req.pd as *mut IbvPd;
        let ctx = req.context as *mut IbvContext;
        let addr = req.addr as *mut c_void;
        // SAFETY: ctx is the live context of the app's PD (the hook read it from pd).
        let op = unsafe { (*ctx).ops._compat_reg_mr };
        let via_wrapper = req.access & OPTIONAL_RANGE != 0 || op.is_null();
        let mr = if via_wrapper {
            real::reg_mr_iova2(pd, addr, req.len, req.iova, req.access)
        } else {
            // SAFETY: the slot holds the provider's reg_mr op (verbs_set_ops mirrors it
            // there since rdma-core v20), with this five-argument prototype. As
            // libibverbs' wrapper does, we then fill the fields the provider leaves to it.
            unsafe {
                let f: ProviderRegMr = std::mem::transmute(op);
                let mr = f(pd, addr, req.len, req.iova, req.access as i32);
                if !mr.is_null() {
                    (*mr).context = ctx;
                    (*mr).pd = pd;
                    (*mr).addr = addr;
                    (*mr).length = req.len;
                }
                mr
            }
        };
        if mr.is_null() {
            return Err(errno());
        }
        let m = Mr {
            ptr: mr as usize,
            via_wrapper,
        };
        // An on-demand MR follows whatever backs its range: its frames may change.
        if req.access & ON_DEMAND == 0 {
            self.record(m, req.addr, req.len);
        }
        Ok(m)
    }

    fn record(&self, mr: Mr, addr: usize, len: usize) {
        if self.verify {
            let page = page_size();
            let first = crate::sys::page_down(addr);
            if let Some(f) = page_frames(first, (addr + len).div_ceil(page) - first / page) {
                self.frames
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(mr.ptr, (first, f));
            }
        }
    }
}

/// The page frame numbers backing `pages` pages from `first` (from /proc/self/pagemap, one
/// entry per page of the kernel's size; 0 for a page not present). None when the file
/// cannot be read.
pub fn page_frames(first: usize, pages: usize) -> Option<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut raw = vec![0u8; pages * 8];
    f.read_exact_at(&mut raw, (first / page_size() * 8) as u64)
        .ok()?;
    Some(
        raw.chunks_exact(8)
            .map(|c| {
                let v = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
                if v >> 63 == 1 { v & ((1 << 55) - 1) } else { 0 }
            })
            .collect(),
    )
}

use crate::sys::{errno, page_size};

impl Registrar for Provider {
    fn refuses(&self, req: &Request) -> Option<mrcache::access::Bypass> {
        self.odp
            .refuses(req)
            .then_some(mrcache::access::Bypass::NotOnDemand)
    }

    fn uncacheable(&self, req: &Request) -> Option<mrcache::access::Bypass> {
        let why = cpu_unreadable(req.addr, req.len)?;
        (self.log)(
            LogLevel::Debug,
            format_args!(
                "ibv_reg_mr({:#x}, {}): {why}: device memory (a peer-memory client's), passed to libibverbs uncached (bypassed: device-memory)",
                req.addr, req.len
            ),
        );
        Some(mrcache::access::Bypass::DeviceMemory)
    }

    fn register(&self, req: &Request) -> Result<Mr, i32> {
        self.register_for(req, *req)
    }

    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        let p = mr.ptr as *mut IbvMr;
        let rc = if mr.via_wrapper {
            real::dereg_mr(p)
        } else {
            // SAFETY: p is a live MR this library registered through the provider op; its
            // context (set at registration) holds the matching dereg op.
            unsafe {
                let op = (*(*p).context).ops._compat_dereg_mr;
                let f: ProviderDeregMr = std::mem::transmute(op);
                f(p)
            }
        };
        if rc == 0 {
            if self.verify {
                self.frames
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&mr.ptr);
            }
            Ok(())
        } else {
            Err(rc)
        }
    }

    fn pins_charged(&self) -> bool {
        crate::sys::memlock::pins_charged()
    }

    fn verifies(&self) -> bool {
        self.verify
    }

    fn verify(&self, mr: Mr) -> bool {
        if !self.verify {
            return true;
        }
        let Some((first, then)) = self
            .frames
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&mr.ptr)
            .cloned()
        else {
            return true;
        };
        let Some(now) = page_frames(first, then.len()) else {
            return true;
        };
        match then.iter().zip(&now).position(|(a, b)| a != b) {
            None => true,
            Some(i) => {
                // SAFETY: mr is a live MR of ours (the entry holds it).
                let lkey = unsafe { (*(mr.ptr as *const IbvMr)).lkey };
                eprintln!(
                    "mrcache: VERIFY MISMATCH: a cached registration (lkey {lkey:#x}) pins page frame {:#x} at {:#x}, but that address is now backed by frame {:#x}: the cache missed an unmap; treated as a miss",
                    then[i],
                    first + i * page_size(),
                    now[i]
                );
                false
            }
        }
    }

    fn register_revocable(&self, req: &Request) -> Result<Mr, i32> {
        // Remote write or atomic rights without local write: every provider refuses them
        // (the kernel's ib_check_mr_access), ours without them would not, and the window
        // bind of them would fail and break the PD's bind QP for every later remote
        // registration. libibverbs refuses it instead.
        let remote_writes = mrcache::access::REMOTE_WRITE | mrcache::access::REMOTE_ATOMIC;
        if req.access & remote_writes != 0 && req.access & mrcache::access::LOCAL_WRITE == 0 {
            return Err(mrcache::cache::UNSUPPORTED);
        }
        crate::verbs::window::prepare(req.pd, req.context)?;
        // The MR itself grants no remote right: its rkey reaches nothing. Remote access goes
        // through the windows bound for each handle.
        let local = Request {
            access: (req.access & !REMOTE) | MW_BIND,
            ..*req
        };
        let writes = remote_writes | mrcache::access::LOCAL_WRITE;
        let saved = crate::sys::errno();
        // On demand as the app's request allows (its remote atomics need the device's).
        match self.register_for(req, local) {
            // MW_BIND makes the kernel pin the pages writable: read-only memory (a
            // PROT_READ mapping, remote read only) fails with it, not with the app's
            // rights. libibverbs registers it with those instead.
            // Our failed attempt's errno is not the app's: libibverbs' success leaves it.
            Err(e) if e != libc::ENOMEM && req.access & writes == 0 => {
                crate::sys::set_errno(saved);
                Err(mrcache::cache::UNSUPPORTED)
            }
            r => r,
        }
    }

    fn grant(&self, mr: Mr, req: &Request) -> Result<usize, i32> {
        let spare = self
            .spare_grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        let Some(slot) = spare.or_else(|| self.alloc_shadow()) else {
            return Err(libc::ENOMEM);
        };
        let give_back = |e| {
            self.spare_grants
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(slot);
            Err(e)
        };
        if !self.fill_shadow(slot, mr, req.addr, req.len) {
            return give_back(libc::ENOMEM);
        }
        match crate::verbs::window::grant(
            slot,
            req.pd,
            mr.ptr as *mut IbvMr,
            req.iova,
            req.len,
            req.access,
        ) {
            Ok(rkey) => {
                // SAFETY: slot is our shadow copy of the MR, at least an ibv_mr long.
                unsafe { (*(slot as *mut IbvMr)).rkey = rkey };
                Ok(slot)
            }
            Err(e) => give_back(e),
        }
    }

    fn revoke(&self, handle: usize) -> Result<(), i32> {
        crate::verbs::window::revoke(handle)?;
        // The app may still read the released handle by mistake: no live key in it.
        // SAFETY: handle is our shadow slot.
        unsafe { (*(handle as *mut IbvMr)).rkey = 0 };
        self.spare_grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(handle);
        Ok(())
    }

    fn recycle_grant(&self, handle: usize) {
        // Revoked at the rereg; if that failed (logged then), once more now: a slot whose
        // window is still bound is never handed out again (it leaks instead).
        if crate::verbs::window::revoke(handle).is_err() {
            return;
        }
        // SAFETY: handle is our shadow slot, its window revoked.
        unsafe { (*(handle as *mut IbvMr)).rkey = 0 };
        self.spare_grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(handle);
    }

    fn alloc_shadow(&self) -> Option<usize> {
        // SAFETY: plain allocation; the cache keeps and reuses it for the process lifetime.
        let p = unsafe { libc::calloc(1, SHADOW_BYTES) };
        (!p.is_null()).then_some(p as usize)
    }

    fn fill_shadow(&self, slot: usize, mr: Mr, addr: usize, len: usize) -> bool {
        let src = mr.ptr as *const u8;
        // SAFETY: every provider's MR object starts with libibverbs' struct verbs_mr
        // (ibv_cmd_reg_mr requires it), so VERBS_MR_SIZE bytes are readable whatever
        // allocator made it; the slot holds SHADOW_BYTES (zeroed past the copy). We copy
        // that part and set the range the app asked for.
        unsafe {
            std::ptr::copy_nonoverlapping(src, slot as *mut u8, VERBS_MR_SIZE);
            let shadow = slot as *mut IbvMr;
            (*shadow).addr = addr as *mut c_void;
            (*shadow).length = len;
            // A copy that ever reached libibverbs' ibv_dereg_mr (a racing double dereg, a
            // fork child) must fail in the kernel, not deregister the cached MR: no
            // kernel object has this handle.
            (*shadow).handle = u32::MAX;
        }
        true
    }
}

/// Why the CPU cannot read `[addr, addr + len)`, if it cannot: such a range is not
/// ordinary memory ibv_reg_mr pins with get_user_pages but a peer-memory client's (GPU
/// memory through nvidia-peermem), whose pages can change with no unmap we could see.
/// Only on a miss (`Registrar::uncacheable`; no hit pays): two system calls, about 2 us here
/// (docs/design/monitor.md, "Device memory"). `msync(MS_ASYNC)` walks the VMAs of the whole range
/// and fails with ENOMEM at a hole; `process_vm_readv` of our own first and last byte goes
/// through get_user_pages as the kernel's registration does, and fails at `PROT_NONE` and
/// at `VM_IO`/`VM_PFNMAP` mappings. A VMA strictly inside the range with readable ones on
/// both sides is not seen, nor a range made unreadable after it was cached. Where
/// process_vm_readv is refused (a seccomp filter: ENOSYS or EPERM) the range is taken as
/// readable, as before this check (a filter that kills or traps on it kills the process at
/// its first miss: docs/design/monitor.md, "Device memory").
pub fn cpu_unreadable(addr: usize, len: usize) -> Option<&'static str> {
    if len == 0 || addr.checked_add(len).is_none() {
        return None; // the cache's own checks say what is wrong with it
    }
    let page = crate::sys::page_down(addr);
    let span = (addr + len - page).checked_next_multiple_of(page_size())?;
    // SAFETY: msync with MS_ASYNC changes nothing (a no-op since Linux 2.6.19 beyond the
    // VMA walk); the range is only looked up.
    if unsafe { libc::msync(page as *mut c_void, span, libc::MS_ASYNC) } != 0
        && crate::sys::errno() == libc::ENOMEM
    {
        return Some("nothing is mapped in this range");
    }
    let mut bytes = [0u8; 2];
    let local = [
        libc::iovec {
            iov_base: bytes.as_mut_ptr().cast(),
            iov_len: 1,
        },
        libc::iovec {
            // SAFETY: within `bytes`.
            iov_base: unsafe { bytes.as_mut_ptr().add(1) }.cast(),
            iov_len: 1,
        },
    ];
    let remote = [
        libc::iovec {
            iov_base: addr as *mut c_void,
            iov_len: 1,
        },
        libc::iovec {
            iov_base: (addr + len - 1) as *mut c_void,
            iov_len: 1,
        },
    ];
    let n = if len == 1 { 1 } else { 2 };
    // SAFETY: reads at most one byte at each remote address of our own process (the kernel
    // checks them) into `bytes`, which outlives the call.
    let got = unsafe {
        libc::process_vm_readv(
            libc::getpid(),
            local.as_ptr(),
            n as libc::c_ulong,
            remote.as_ptr(),
            n as libc::c_ulong,
            0,
        )
    };
    if got == n as isize {
        return None;
    }
    // Only EFAULT says the range is unreadable; any other refusal (a seccomp filter's
    // EPERM, ENOSYS or EACCES) leaves it taken as readable, as before this check.
    if got < 0 && crate::sys::errno() != libc::EFAULT {
        return None;
    }
    Some("the CPU cannot read this range (PROT_NONE, or a VM_IO/VM_PFNMAP device mapping)")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider object that malloc did not make (here: the first bytes of a page whose
    /// preceding page is unmapped): a shadow of it is made from the known struct size, never
    /// from malloc's chunk header (reading it would fault here).
    #[test]
    fn shadow_of_an_object_malloc_did_not_make() {
        let page = page_size();
        // SAFETY: a fresh private mapping of two pages; the first is unmapped again so that
        // nothing readable precedes the object.
        let obj = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap(p, page);
            (p as *mut u8).add(page)
        };
        // SAFETY: obj points to a writable page; IbvMr is plain data.
        unsafe {
            let mr = obj as *mut IbvMr;
            (*mr).lkey = 0x1234;
            (*mr).rkey = 0x5678;
        }
        let provider = Provider::new(
            false,
            Policy::new(
                mrcache::config::OnDemand::Off,
                mrcache::config::RemoteMode::Revoke,
                None,
            ),
            |_, _| {},
        );
        let slot = provider.alloc_shadow().unwrap();
        let m = Mr {
            ptr: obj as usize,
            via_wrapper: false,
        };
        assert!(provider.fill_shadow(slot, m, 0x1000, 0x2000));
        // SAFETY: slot is a SHADOW_BYTES allocation holding the copy.
        let shadow = unsafe { &*(slot as *const IbvMr) };
        assert_eq!((shadow.lkey, shadow.rkey), (0x1234, 0x5678));
        assert_eq!((shadow.addr as usize, shadow.length), (0x1000, 0x2000));
    }
}
