//! `ibv_access_flags`: which registrations the cache may serve, and which cached entry may
//! serve a request without widening what the app (or a remote peer) can do with it.

/// `IBV_ACCESS_LOCAL_WRITE`.
pub const LOCAL_WRITE: u32 = 1;
/// `IBV_ACCESS_REMOTE_WRITE`.
pub const REMOTE_WRITE: u32 = 1 << 1;
/// `IBV_ACCESS_REMOTE_READ`.
pub const REMOTE_READ: u32 = 1 << 2;
/// `IBV_ACCESS_REMOTE_ATOMIC`.
pub const REMOTE_ATOMIC: u32 = 1 << 3;
/// `IBV_ACCESS_MW_BIND`.
pub const MW_BIND: u32 = 1 << 4;
pub(crate) const ZERO_BASED: u32 = 1 << 5;
/// `IBV_ACCESS_ON_DEMAND`.
pub const ON_DEMAND: u32 = 1 << 6;
pub(crate) const HUGETLB: u32 = 1 << 7;
pub(crate) const FLUSH_GLOBAL: u32 = 1 << 8;
pub(crate) const FLUSH_PERSISTENT: u32 = 1 << 9;
/// Bits 20..29: "optional" flags (RELAXED_ORDERING is bit 20). libibverbs strips them when
/// the device does not support them, so such registrations go through its wrapper.
pub const OPTIONAL_RANGE: u32 = 0x3ff0_0000;

/// Every remote right: a registration with any of them hands a peer a key.
pub const REMOTE: u32 = REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC;
const CACHEABLE: u32 =
    LOCAL_WRITE | REMOTE | MW_BIND | HUGETLB | FLUSH_GLOBAL | FLUSH_PERSISTENT | OPTIONAL_RANGE;

/// Why a registration is passed to libibverbs untouched instead of being cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bypass {
    /// ON_DEMAND: the device faults pages in itself; nothing is pinned, nothing to cache.
    OnDemand,
    /// ZERO_BASED: the MR's addresses start at 0; the cache keys on virtual addresses.
    ZeroBased,
    /// Bits libibverbs does not define: let it give its own error.
    UnknownFlags,
    /// Zero length or a range that wraps the address space: let libibverbs give its error.
    BadRange,
    /// A registration made while another one is being processed on this thread.
    Nested,
    /// The cache is off (MRCACHE_ENABLE=0 or a configuration error).
    Disabled,
    /// Remote access, and `MRCACHE_REMOTE=bypass` (or revocation is not possible here).
    Remote,
    /// A range the CPU cannot read (device memory of a peer-memory client): its pages can
    /// change with no unmap to see (`Registrar::uncacheable`, asked on a miss only).
    DeviceMemory,
    /// Remote access under `MRCACHE_REMOTE=revoke`, and a cached round (hit, bind, unbind,
    /// release) of its size class measured dearer than a registration (`admission`).
    NotWorthCaching,
    /// Remote access under `MRCACHE_REMOTE=revoke`, the cache full, and the clock's victim
    /// used more often lately than this registration was seen (scan resistance).
    Scan,
    /// Remote access under `MRCACHE_REMOTE=revoke`, a class that caches: one hit now and
    /// then is passed through so that what a miss costs is measured again (`admission`).
    Probe,
    /// The key's cache entry is held as often as a slot counts at once (4,095): this
    /// registration is made as without the cache.
    Saturated,
    /// The monitor cannot see every unmap here, so only registrations the device makes on
    /// demand are cached (`MRCACHE_ODP`), and this one it cannot make so (a device without
    /// On-Demand Paging for what it needs, or remote access not revoked per handle).
    NotOnDemand,
}

/// `ibv_rereg_mr` flags (verbs.h `enum ibv_rereg_mr_flags`).
pub const REREG_CHANGE_TRANSLATION: i32 = 1;
/// `IBV_REREG_MR_CHANGE_PD`.
pub const REREG_CHANGE_PD: i32 = 2;
/// `IBV_REREG_MR_CHANGE_ACCESS`.
pub const REREG_CHANGE_ACCESS: i32 = 4;
/// Every flag above: any other bit is libibverbs' to refuse.
pub const REREG_FLAGS_SUPPORTED: i32 = 7;

/// libibverbs' own argument checks of `ibv_rereg_mr` (it returns IBV_REREG_MR_ERR_INPUT when
/// they fail): no unknown flag, a range when the translation changes, access flags only
/// with CHANGE_ACCESS. No flag at all is not refused: libibverbs passes it to the provider
/// (on rxe: IBV_REREG_MR_ERR_CMD, EOPNOTSUPP).
pub fn rereg_args_valid(flags: i32, addr: usize, len: usize, access: i32) -> bool {
    if flags & !REREG_FLAGS_SUPPORTED != 0 {
        return false;
    }
    if flags & REREG_CHANGE_TRANSLATION != 0 && (addr == 0 || len == 0) {
        return false;
    }
    access == 0 || flags & REREG_CHANGE_ACCESS != 0
}

/// Decide whether a registration request can go through the cache.
#[inline]
pub(crate) fn classify(addr: usize, len: usize, access: u32) -> Result<(), Bypass> {
    if access & ON_DEMAND != 0 {
        return Err(Bypass::OnDemand);
    }
    if access & ZERO_BASED != 0 {
        return Err(Bypass::ZeroBased);
    }
    if access & !CACHEABLE != 0 {
        return Err(Bypass::UnknownFlags);
    }
    if len == 0 || addr.checked_add(len).is_none() {
        return Err(Bypass::BadRange);
    }
    Ok(())
}

/// Whether an entry registered with `have` over `[have_start, have_end)` may serve a request
/// for `want` over `[start, end)`.
///
/// A request that grants remote access gets only an entry of exactly its range and flags
/// (unless `remote_superset`): a containing or wider entry would let a peer reach memory
/// the app never exposed. A local-only request may use a containing entry that grants no
/// remote access and at least its local rights; every other flag must match.
/// Public for the integration tests only.
pub fn can_serve(
    have: u32,
    have_range: (usize, usize),
    want: u32,
    range: (usize, usize),
    remote_superset: bool,
) -> bool {
    let contains = have_range.0 <= range.0 && range.1 <= have_range.1;
    if !contains {
        return false;
    }
    if want & REMOTE != 0 {
        if remote_superset {
            return have & want == want && (have ^ want) & !(REMOTE | LOCAL_WRITE) == 0;
        }
        return have == want && have_range == range;
    }
    have & REMOTE == 0 && have & want == want && (have ^ want) & !LOCAL_WRITE == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_bypasses_what_the_cache_cannot_hold() {
        assert_eq!(classify(0x1000, 4096, LOCAL_WRITE | REMOTE_WRITE), Ok(()));
        assert_eq!(classify(0x1000, 4096, 1 << 20), Ok(()));
        assert_eq!(classify(0x1000, 4096, ON_DEMAND), Err(Bypass::OnDemand));
        assert_eq!(classify(0x1000, 4096, ZERO_BASED), Err(Bypass::ZeroBased));
        assert_eq!(classify(0x1000, 4096, 1 << 12), Err(Bypass::UnknownFlags));
        assert_eq!(classify(0x1000, 4096, 1 << 31), Err(Bypass::UnknownFlags));
        assert_eq!(classify(0x1000, 0, LOCAL_WRITE), Err(Bypass::BadRange));
        assert_eq!(
            classify(usize::MAX - 10, 4096, LOCAL_WRITE),
            Err(Bypass::BadRange)
        );
    }

    #[test]
    fn remote_requests_never_hit_wider_entries() {
        let r = (0x1000, 0x2000);
        let big = (0x0, 0x10000);
        assert!(can_serve(REMOTE_WRITE, r, REMOTE_WRITE, r, false));
        assert!(!can_serve(REMOTE_WRITE, big, REMOTE_WRITE, r, false));
        assert!(!can_serve(
            REMOTE_WRITE | REMOTE_READ,
            r,
            REMOTE_WRITE,
            r,
            false
        ));
        assert!(can_serve(
            REMOTE_WRITE | REMOTE_READ,
            big,
            REMOTE_WRITE,
            r,
            true
        ));
        assert!(!can_serve(
            REMOTE_WRITE | MW_BIND,
            big,
            REMOTE_WRITE,
            r,
            true
        ));
    }

    #[test]
    fn local_requests_hit_containing_local_entries() {
        let r = (0x1000, 0x2000);
        let big = (0x0, 0x10000);
        assert!(can_serve(LOCAL_WRITE, big, LOCAL_WRITE, r, false));
        assert!(can_serve(LOCAL_WRITE, big, 0, r, false));
        assert!(!can_serve(0, big, LOCAL_WRITE, r, false));
        assert!(!can_serve(
            LOCAL_WRITE | REMOTE_READ,
            big,
            LOCAL_WRITE,
            r,
            false
        ));
        assert!(!can_serve(
            LOCAL_WRITE | (1 << 20),
            big,
            LOCAL_WRITE,
            r,
            false
        ));
        assert!(!can_serve(LOCAL_WRITE, r, LOCAL_WRITE, big, false));
    }

    #[test]
    fn rereg_args() {
        assert!(rereg_args_valid(REREG_CHANGE_PD, 0, 0, 0));
        assert!(rereg_args_valid(0, 0, 0, 0));
        assert!(!rereg_args_valid(-1, 0, 0, 0));
        assert!(!rereg_args_valid(8, 0, 0, 0));
        assert!(!rereg_args_valid(REREG_CHANGE_TRANSLATION, 0, 4096, 0));
        assert!(!rereg_args_valid(REREG_CHANGE_TRANSLATION, 0x1000, 0, 0));
        assert!(rereg_args_valid(REREG_CHANGE_TRANSLATION, 0x1000, 4096, 0));
        assert!(!rereg_args_valid(REREG_CHANGE_PD, 0, 0, 1));
        assert!(rereg_args_valid(REREG_CHANGE_ACCESS, 0, 0, 1));
    }
}
