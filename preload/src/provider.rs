//! `Registrar` over the verbs provider: registers through the provider's own ops
//! (`ctx->ops._compat_reg_mr`/`_compat_dereg_mr`), skipping libibverbs' per-registration
//! MADV_DONTFORK bookkeeping, or through the real `ibv_reg_mr_iova2`/`ibv_dereg_mr` when the
//! op is missing or optional access flags need libibverbs' masking. Each MR is deregistered
//! by the path that made it, so libibverbs' fork refcounts stay balanced.

use crate::ffi::{IbvContext, IbvMr, IbvPd, ProviderDeregMr, ProviderRegMr, VERBS_MR_SIZE};
use crate::real;
use mrcache::access::OPTIONAL_RANGE;
use mrcache::cache::{Mr, Registrar, Request};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

/// Room for one shadow `ibv_mr`: the provider's whole object (rxe, mlx5, efa allocate a
/// few dozen bytes; mlx5 reads a private field after `struct verbs_mr` in bind_mw).
const SHADOW_BYTES: usize = 256;

/// Registers through the provider; with `MRCACHE_VERIFY=pfn` also records, per MR, the
/// page frames its range had at registration.
pub struct Provider {
    pub verify: bool,
    frames: Mutex<HashMap<usize, (usize, Vec<u64>)>>,
}

impl Provider {
    pub fn new(verify: bool) -> Provider {
        Provider {
            verify,
            frames: Mutex::new(HashMap::new()),
        }
    }

    fn record(&self, mr: Mr, addr: usize, len: usize) {
        if self.verify {
            let first = addr & !(PAGE - 1);
            if let Some(f) = page_frames(first, (addr + len).div_ceil(PAGE) - first / PAGE) {
                self.frames
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(mr.ptr, (first, f));
            }
        }
    }
}

const PAGE: usize = 4096;

/// The page frame numbers backing `pages` pages from `first` (from /proc/self/pagemap; 0
/// for a page not present). None when the file cannot be read.
pub fn page_frames(first: usize, pages: usize) -> Option<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut raw = vec![0u8; pages * 8];
    f.read_exact_at(&mut raw, (first / PAGE * 8) as u64).ok()?;
    Some(
        raw.chunks_exact(8)
            .map(|c| {
                let v = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
                if v >> 63 == 1 { v & ((1 << 55) - 1) } else { 0 }
            })
            .collect(),
    )
}

fn errno() -> i32 {
    // SAFETY: __errno_location always returns this thread's errno.
    unsafe { *libc::__errno_location() }
}

impl Registrar for Provider {
    fn register(&self, req: &Request) -> Result<Mr, i32> {
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
        self.record(m, req.addr, req.len);
        Ok(m)
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
                    first + i * PAGE,
                    now[i]
                );
                false
            }
        }
    }

    fn alloc_shadow(&self) -> Option<usize> {
        // SAFETY: plain allocation; the cache keeps and reuses it for the process lifetime.
        let p = unsafe { libc::calloc(1, SHADOW_BYTES) };
        (!p.is_null()).then_some(p as usize)
    }

    fn fill_shadow(&self, slot: usize, mr: Mr, addr: usize, len: usize) -> bool {
        let src = mr.ptr as *mut c_void;
        // SAFETY: providers allocate their MR object with calloc (struct verbs_mr first), so
        // malloc_usable_size tells its size; we copy it whole into our slot and set the
        // range the app asked for.
        unsafe {
            let size = libc::malloc_usable_size(src).max(VERBS_MR_SIZE);
            if size > SHADOW_BYTES {
                return false;
            }
            std::ptr::copy_nonoverlapping(src as *const u8, slot as *mut u8, size);
            let shadow = slot as *mut IbvMr;
            (*shadow).addr = addr as *mut c_void;
            (*shadow).length = len;
        }
        true
    }
}
