//! The cache's interface types: requests, provider registrations, the `Registrar` a cache
//! registers through, outcomes, and the statistics counters.

use crate::access::Bypass;
use crate::stats::Counts;

/// What a `Registrar` answers when it cannot revoke remote access (EOPNOTSUPP).
pub const UNSUPPORTED: i32 = 95;

/// A provider registration: the `ibv_mr *` and the path that made it (the deregistration
/// must take the same path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mr {
    /// The provider's `struct ibv_mr *`.
    pub ptr: usize,
    /// Made through libibverbs' `ibv_reg_mr_iova2` (optional access flags, or no provider
    /// entry to call), not the provider's own `reg_mr`.
    pub via_wrapper: bool,
}

/// One registration request, as the app made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Request {
    /// The `struct ibv_pd *`.
    pub pd: usize,
    /// The PD's `struct ibv_context *`.
    pub context: usize,
    /// First byte of the range.
    pub addr: usize,
    /// Length of the range in bytes.
    pub len: usize,
    /// The I/O virtual address the MR is to have (`addr` for plain `ibv_reg_mr`).
    pub iova: u64,
    /// `ibv_access_flags` (`access`).
    pub access: u32,
}

impl Request {
    /// One past the last byte.
    pub fn end(&self) -> usize {
        self.addr + self.len
    }
    pub(crate) fn natural_iova(&self) -> bool {
        self.iova == self.addr as u64
    }
}

/// What the cache needs from the verbs provider.
pub trait Registrar: Sync {
    /// Register exactly the requested range; `Err(errno)` on failure.
    fn register(&self, req: &Request) -> Result<Mr, i32>;
    /// Asked on a miss, before registering (hits never pay it: nothing it refuses is ever
    /// cached): why `req` must not be cached, if it must not (device memory).
    fn uncacheable(&self, _req: &Request) -> Option<crate::access::Bypass> {
        None
    }
    /// As `uncacheable`, for a refusal that costs no system call (the on-demand policy's):
    /// asked on a miss before admission and before room is made, so that a registration
    /// that will not be cached evicts nothing.
    fn refuses(&self, _req: &Request) -> Option<crate::access::Bypass> {
        None
    }
    /// Deregister through the path that registered; `Err(errno)` leaves the MR valid.
    fn deregister(&self, mr: Mr) -> Result<(), i32>;
    /// Memory for one shadow `ibv_mr` (kept and reused by the cache, never freed).
    fn alloc_shadow(&self) -> Option<usize>;
    /// Make `slot` a copy of `mr` whose addr/length are `[addr, addr + len)`.
    fn fill_shadow(&self, slot: usize, mr: Mr, addr: usize, len: usize) -> bool;
    /// A diagnostic check before a hit is handed out (`MRCACHE_VERIFY`): whether `mr`
    /// still pins the pages that back its range now. False makes the hit a miss.
    fn verify(&self, _mr: Mr) -> bool {
        true
    }
    /// Whether `verify` checks anything: hits then take the locked path, which calls it.
    fn verifies(&self) -> bool {
        false
    }
    /// `MRCACHE_REMOTE=revoke`: register `req`'s range with its local rights only, so that
    /// its remote rights can be granted per handle (`grant`). `Err(UNSUPPORTED)` when the
    /// device cannot: the request is then passed through uncached.
    fn register_revocable(&self, _req: &Request) -> Result<Mr, i32> {
        Err(UNSUPPORTED)
    }
    /// A new handle for `req` over `mr` (from `register_revocable`) carrying a remote key
    /// of its own that reaches exactly `req`'s range with `req`'s remote rights, and that
    /// no earlier handle carried.
    fn grant(&self, _mr: Mr, _req: &Request) -> Result<usize, i32> {
        Err(UNSUPPORTED)
    }
    /// The app released `handle` (from `grant`): its key must reach nothing once this
    /// returns. `Err` when that cannot be done; the handle then stays valid.
    fn revoke(&self, _handle: usize) -> Result<(), i32> {
        Ok(())
    }
    /// `handle` (from `grant`), its key revoked already, is free again: the next `grant`
    /// may reuse it (the alias of a sole-grant `ibv_rereg_mr` was deregistered).
    fn recycle_grant(&self, _handle: usize) {}
    /// Whether the kernel charges this process's pins against a limit now (a finite
    /// `RLIMIT_MEMLOCK` without CAP_IPC_LOCK). Asked before a containing-range hit, which
    /// would keep a wider range pinned than the app's handle needs: while pins are charged
    /// a request is served only by an entry of its own range (docs/design/cache.md, "The
    /// locked-memory limit").
    fn pins_charged(&self) -> bool {
        false
    }
}

/// What a cache may hold, and which hits it may serve (`MRCACHE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most entries cached at once (`MRCACHE_MAX_ENTRIES`).
    pub max_entries: usize,
    /// Most bytes cached at once (`MRCACHE_MAX_BYTES`).
    pub max_bytes: u64,
    /// Give concurrent users their own `ibv_mr` copy; allows containing-range hits.
    pub shadow: bool,
    /// A remote request may hit a wider or more-privileged entry (`MRCACHE_REMOTE_SUPERSET`).
    pub remote_superset: bool,
}

/// How `Cache::acquire` served a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The same range was cached.
    Hit,
    /// A cached registration of a containing range (or wider local rights) served it.
    HitContaining,
    /// Registered now and cached.
    Miss,
    /// Registered now, not cached: limits reached with nothing idle to evict, or the range
    /// was invalidated while it was being registered.
    Uncached,
}

/// Why `Cache::acquire` did not hand out a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireError {
    /// Not for the cache: pass the call to libibverbs unchanged.
    Bypass {
        /// Why.
        why: Bypass,
        /// Admission wants libibverbs' registration timed: a sample of what a miss of its
        /// class costs (`Cache::report`, `Sample::Registration`).
        timed: bool,
    },
    /// The provider refused the registration (errno), even after evicting idle entries.
    Failed(i32),
}

/// What `Cache::release` did with the app's `ibv_dereg_mr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The app's reference is gone; the registration stays cached (idle or still in use).
    Kept,
    /// The registration was deregistered (uncached, or invalidated while in use).
    Deregistered,
    /// The pointer is not one the cache handed out: pass it to libibverbs.
    NotOurs,
    /// The pointer was already released: the app's second `ibv_dereg_mr`.
    DoubleRelease,
    /// Deregistration failed with this errno; the handle stays valid.
    Failed(i32),
}

/// Result of taking a registration back from the cache for `ibv_rereg_mr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detached {
    /// The app's handle is the sole user: it is now uncached, the caller owns `Mr`.
    Sole(Mr),
    /// Other users share the provider object; it cannot be changed in place.
    Shared,
    /// A handle the app already released (a spare shadow, refilled or not, a released
    /// grant, the provider's pointer of an entry nobody holds, a deregistered MR): a use
    /// after `ibv_dereg_mr`, answered as a double release, never passed to libibverbs.
    Released,
    /// The app's handle is an alias (`Handle::Alias`) of this MR, its own since a sole
    /// handle's `ibv_rereg_mr`: re-register the MR, then copy its fields to the handle.
    Alias(Mr),
    /// Not a handle the cache handed out: pass the call to libibverbs.
    NotOurs,
}

/// A handle reserved by `Cache::reserve_sole` for the provider's `ibv_rereg_mr` of its
/// entry's MR.
#[derive(Debug, Clone, Copy)]
pub struct SoleHandle {
    /// The entry's provider registration.
    pub mr: Mr,
    /// The rights the handle's own registration asked for.
    pub access: u32,
    /// The rights the entry's MR was registered with (the first registrant's).
    pub entry_access: u32,
    /// A granted handle (its remote key a window's), else a shadow.
    pub grant: bool,
    pub(crate) id: u32,
    pub(crate) was_dead: bool,
}

/// A copy of the cache's counters and its size, for reporting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// The counters.
    pub counts: Counts,
    /// Entries cached.
    pub entries: u64,
    /// Bytes those entries span.
    pub bytes: u64,
    /// Entries no handle holds (the ones eviction may take).
    pub idle: u64,
}

impl AcquireError {
    /// Passed to libibverbs for `why` (`acquire` says whether it is timed).
    pub(crate) fn bypass(why: Bypass) -> AcquireError {
        AcquireError::Bypass { why, timed: false }
    }
}
