//! On-Demand Paging (`MRCACHE_ODP`): which of the cache's registrations the device makes
//! ON_DEMAND.
//!
//! An ON_DEMAND registration pins nothing: the kernel's MMU notifier follows every change of
//! its range (an unmap by a raw system call, io_uring, migration, swap), and the device
//! faults in the pages that back the addresses when it uses them. A cached one never points
//! at pages that no longer back its addresses, so it stays correct where the monitor cannot
//! see an unmap. It does not stop a peer's old rkey from reaching whatever lives at the
//! address now: remote access stays revoked per handle (`window`), or is not cached.
//!
//! A device pages on demand what its `odp_caps` say: the RC transport's send, receive,
//! write and read (and atomics, for a registration that grants them) are asked for, as the
//! app may use its MR in any of them.
//!
//! Under `auto`, an on-demand profile (`MRCACHE_ODP_PROFILE`, written by `mrcache bench`)
//! for the device's kind says from which size an on-demand miss costs less than a pinned
//! one, and whether the device's on-demand transfers land where they were sent.

use crate::ffi::{self, IbvContext};
use mrcache::access::{REMOTE, REMOTE_ATOMIC};
use mrcache::cache::Request;
use mrcache::config::{OdpProfile, OnDemand, RemoteMode};
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

/// The cache's on-demand policy (`MRCACHE_ODP`), and what each device context offers.
pub struct Policy {
    mode: OnDemand,
    remote: RemoteMode,
    /// Where `auto` makes entries on demand because it pays, on devices of its kind and
    /// firmware; only a profile measured under the running kernel.
    profile: Option<OdpProfile>,
    /// Why only entries made on demand are cached (the monitor cannot see every unmap),
    /// once that is decided.
    only: OnceLock<String>,
    /// Each device context seen: its ODP capabilities and ids.
    caps: Mutex<Vec<(usize, Device)>>,
}

impl Policy {
    /// The policy of `MRCACHE_ODP=mode`; `profile` is used under `auto` only, and only if
    /// it was measured under the running kernel.
    pub fn new(mode: OnDemand, remote: RemoteMode, profile: Option<OdpProfile>) -> Policy {
        let kernel = mrcache::node::running_kernel();
        Policy {
            mode,
            remote,
            profile: profile.filter(|p| mode == OnDemand::Auto && p.kernel == kernel),
            only: OnceLock::new(),
            caps: Mutex::new(Vec::new()),
        }
    }

    /// The same policy for a fork child's cache (its contexts are asked again).
    pub fn renewed(&self) -> Policy {
        let p = Policy::new(self.mode, self.remote, self.profile.clone());
        if let Some(why) = self.only.get() {
            let _ = p.only.set(why.clone());
        }
        p
    }

    /// Cache only entries the device makes on demand from now on: the monitor cannot see
    /// every unmap (`why`). Call before the cache serves anything. False under
    /// `MRCACHE_ODP=off`: caching must stop instead.
    pub fn only(&self, why: &str) -> bool {
        if self.mode == OnDemand::Off {
            return false;
        }
        let _ = self.only.set(why.to_string());
        true
    }

    /// Why only entries made on demand are cached (None: every kind is).
    pub fn only_why(&self) -> Option<&str> {
        self.only.get().map(String::as_str)
    }

    /// Whether the cache registers `req` (the app's request) on demand: under `on` where
    /// the device pages it so; under `auto` also only where on-demand entries alone are
    /// cached, or where the device kind's profile says an on-demand miss of its length pays
    /// (remote access only under `MRCACHE_REMOTE=revoke`).
    pub fn applies(&self, req: &Request) -> bool {
        match self.mode {
            OnDemand::Off => false,
            OnDemand::On => self.device_pages(req),
            OnDemand::Auto if self.only.get().is_some() => self.device_pages(req),
            OnDemand::Auto => {
                if self.profile.is_none() || !self.revoked_if_remote(req) {
                    return false;
                }
                let device = self.device(req.context);
                self.profile_of(device)
                    .is_some_and(|p| p.pays(req.len as u64))
                    && self.pages(device, req.access)
            }
        }
    }

    /// Whether `req` is local, or remote with its key revoked at `ibv_dereg_mr`: a kept key
    /// of an on-demand entry would reach whatever lives at the address later.
    fn revoked_if_remote(&self, req: &Request) -> bool {
        req.access & REMOTE == 0 || self.remote == RemoteMode::Revoke
    }

    /// The profile, if it is of `device`'s kind and firmware.
    fn profile_of(&self, device: Device) -> Option<&OdpProfile> {
        self.profile
            .as_ref()
            .filter(|p| p.matches(device.vendor, device.part, device.firmware()))
    }

    /// Under `auto`, a registration of `req` that could not be pinned for want of lockable
    /// memory (ENOMEM, EAGAIN: the memlock limit): whether to make it on demand instead,
    /// which pins nothing.
    pub fn instead_of_pinning(&self, req: &Request) -> bool {
        self.mode == OnDemand::Auto && self.revoked_if_remote(req) && self.device_pages(req)
    }

    /// Whether the device of `req` pages it on demand, as the mode asks.
    fn device_pages(&self, req: &Request) -> bool {
        self.pages(self.device(req.context), req.access)
    }

    /// Whether `device` pages on demand a registration with `access`: what a local one
    /// needs (`pages_on_demand`), and atomics where it grants them.
    fn pages(&self, device: Device, access: u32) -> bool {
        let atomic = access & REMOTE_ATOMIC == 0 || device.rc & ffi::IBV_ODP_SUPPORT_ATOMIC != 0;
        atomic && self.pages_local(device)
    }

    /// Whether the device of `context` pages on demand what a local registration needs:
    /// the RC transport's send, receive, write and read. `auto`, which the user did not ask
    /// for, asks more, as an app may use one MR on any transport (UCX's ud and rc together)
    /// and with shared receive queues: RC's SRQ receive and UD's send and receive too. And
    /// under `auto` not a device whose on-demand transfers misplace data: one whose profile
    /// says so, and without a profile rxe, whose on-demand copy drops the offset within a
    /// page on the kernels tested (docs/design/odp.md, "Devices"); only `on` asks it.
    pub fn pages_on_demand(&self, context: usize) -> bool {
        self.pages_local(self.device(context))
    }

    /// `pages_on_demand` of a device already asked.
    fn pages_local(&self, device: Device) -> bool {
        let need = ffi::IBV_ODP_SUPPORT_SEND
            | ffi::IBV_ODP_SUPPORT_RECV
            | ffi::IBV_ODP_SUPPORT_WRITE
            | ffi::IBV_ODP_SUPPORT_READ;
        if self.mode == OnDemand::Auto {
            let rc = need | ffi::IBV_ODP_SUPPORT_SRQ_RECV;
            let ud = ffi::IBV_ODP_SUPPORT_SEND | ffi::IBV_ODP_SUPPORT_RECV;
            let trusted = match self.profile_of(device) {
                Some(p) => p.offsets_kept,
                None => device.vendor != ffi::RXE_VENDOR_ID,
            };
            return trusted && device.rc & rc == rc && device.ud & ud == ud;
        }
        device.rc & need == need
    }

    /// With only on-demand entries cached: whether `req` must pass through uncached (a
    /// device that cannot page it on demand, or remote access that would keep its key).
    pub fn refuses(&self, req: &Request) -> bool {
        if self.only.get().is_none() {
            return false;
        }
        (req.access & REMOTE != 0 && self.remote != RemoteMode::Revoke) || !self.applies(req)
    }

    /// The device of `context` would not make a registration on demand that its capabilities
    /// say it pages so (a kernel with ODP turned off, or a range ODP cannot follow): it is
    /// treated as a device without ODP from now on.
    pub fn refused(&self, context: usize) {
        let mut caps = self.caps.lock().unwrap_or_else(|e| e.into_inner());
        caps.retain(|(ctx, _)| *ctx != context);
        caps.push((context, Device::default()));
    }

    /// `ibv_close_device` of `context`: its capabilities are asked again if a context opens
    /// at that address (the allocator may put another device's there).
    pub fn forget(&self, context: usize) {
        let mut caps = self.caps.lock().unwrap_or_else(|e| e.into_inner());
        caps.retain(|(ctx, _)| *ctx != context);
    }

    fn device(&self, context: usize) -> Device {
        let mut caps = self.caps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, d)) = caps.iter().find(|(ctx, _)| *ctx == context) {
            return d;
        }
        let d = query_device(context as *mut IbvContext);
        caps.push((context, d));
        d
    }
}

/// What the policy asks of a device.
#[derive(Clone, Copy)]
struct Device {
    /// The RC transport's ODP capabilities (0: no ODP).
    rc: u32,
    /// The UD transport's.
    ud: u32,
    vendor: u32,
    /// The vendor part id.
    part: u32,
    /// Its firmware version (`fw_ver`), NUL-terminated if shorter than the field.
    fw: [u8; ffi::FW_VER_LEN],
}

impl Default for Device {
    fn default() -> Device {
        Device {
            rc: 0,
            ud: 0,
            vendor: 0,
            part: 0,
            fw: [0; ffi::FW_VER_LEN],
        }
    }
}

impl Device {
    /// The firmware version as text, as a profile holds it: up to its NUL (all 64 bytes
    /// without one), without surrounding blanks ("" where it is not text).
    fn firmware(&self) -> &str {
        let n = self
            .fw
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(self.fw.len());
        std::str::from_utf8(&self.fw[..n]).unwrap_or("").trim()
    }
}

type QueryDeviceEx = unsafe extern "C" fn(*mut IbvContext, *const c_void, *mut u8, usize) -> i32;

/// The RC and UD transports' ODP capabilities of `ctx` (0: no ODP) and its ids, from the provider's
/// `query_device_ex` op as libibverbs' inline `ibv_query_device_ex` finds it: in the
/// `struct verbs_context` that ends with the `struct ibv_context`, when the context is an
/// extended one and the provider's `verbs_context` reaches back to the op.
fn query_device(ctx: *mut IbvContext) -> Device {
    if ctx.is_null() {
        return Device::default();
    }
    // SAFETY: ctx is the live context of the app's PD; abi_compat is a field of it.
    if unsafe { (*ctx).abi_compat } as usize != usize::MAX {
        return Device::default();
    }
    let base = ctx as *const u8;
    // SAFETY: an extended context (abi_compat says so) sits at the end of a `struct
    // verbs_context`, whose `sz` is the word right before it and says how far back its
    // fields reach; the op is read only when it lies within.
    let op = unsafe {
        let sz = std::ptr::read_unaligned(base.sub(ffi::VCTX_SZ_BACK) as *const usize);
        if sz < ffi::VCTX_QUERY_DEVICE_EX_BACK + std::mem::size_of::<IbvContext>() {
            return Device::default();
        }
        std::ptr::read_unaligned(base.sub(ffi::VCTX_QUERY_DEVICE_EX_BACK) as *const *mut c_void)
    };
    if op.is_null() {
        return Device::default();
    }
    let mut attr = [0u64; ffi::DEVICE_ATTR_EX_SIZE / 8];
    // SAFETY: the provider's query_device_ex op, of this prototype; attr is zeroed, 8-byte
    // aligned and as large as the size passed.
    let rc = unsafe {
        let f = std::mem::transmute::<*mut c_void, QueryDeviceEx>(op);
        f(
            ctx,
            std::ptr::null(),
            attr.as_mut_ptr() as *mut u8,
            ffi::DEVICE_ATTR_EX_SIZE,
        )
    };
    if rc != 0 {
        return Device::default();
    }
    let word = |at: usize| (attr[at / 8] >> ((at % 8) * 8)) as u32;
    let vendor = word(ffi::DEVICE_ATTR_EX_VENDOR_ID);
    let part = word(ffi::DEVICE_ATTR_EX_VENDOR_PART_ID);
    let mut fw = [0u8; ffi::FW_VER_LEN];
    for (i, b) in fw.iter_mut().enumerate() {
        *b = (attr[i / 8] >> ((i % 8) * 8)) as u8;
    }
    if attr[ffi::DEVICE_ATTR_EX_ODP / 8] & ffi::IBV_ODP_SUPPORT == 0 {
        return Device {
            vendor,
            part,
            fw,
            ..Device::default()
        };
    }
    Device {
        rc: word(ffi::DEVICE_ATTR_EX_ODP_RC),
        ud: word(ffi::DEVICE_ATTR_EX_ODP_UD),
        vendor,
        part,
        fw,
    }
}

#[cfg(test)]
mod tests;
