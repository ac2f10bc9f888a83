//! The values of the `MRCACHE_*` variables that name a mode or a level, each with its
//! parser and its name.

/// Which registrations the cache keeps (`MRCACHE_ADMIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Only the size classes where caching pays, and scan-resistant when full.
    Auto,
    /// Every registration, least recently used evicted (as before admission existed).
    Always,
}

impl Admit {
    pub(crate) fn parse(v: &str) -> Option<Admit> {
        match v {
            "auto" => Some(Admit::Auto),
            "always" => Some(Admit::Always),
            _ => None,
        }
    }
    /// The value as `MRCACHE_ADMIT` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Admit::Auto => "auto",
            Admit::Always => "always",
        }
    }
}

/// What happens at `fork()` (`MRCACHE_FORK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkMode {
    /// Keep registrations when the kernel copies pinned pages at fork (Linux >= 5.13), else flush.
    Auto,
    /// Never flush at fork.
    Keep,
    /// Deregister idle entries before every fork (and DONTFORK ranges in use with fork tracking on).
    Flush,
}

impl ForkMode {
    /// The value as `MRCACHE_FORK` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ForkMode::Auto => "auto",
            ForkMode::Keep => "keep",
            ForkMode::Flush => "flush",
        }
    }
}

/// Whether the cache registers its entries ON_DEMAND (`MRCACHE_ODP`), on a device that
/// pages them on demand (On-Demand Paging: the kernel follows every change of the range).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDemand {
    /// Never: every entry is pinned.
    Off,
    /// Only where the monitor cannot see every unmap: then only entries the device
    /// registers on demand are cached, instead of none.
    Auto,
    /// Every entry the device can register on demand; with the monitor off or blind, only
    /// those are cached.
    On,
}

impl OnDemand {
    pub(crate) fn parse(v: &str) -> Option<OnDemand> {
        match v {
            "off" => Some(OnDemand::Off),
            "auto" => Some(OnDemand::Auto),
            "on" => Some(OnDemand::On),
            _ => None,
        }
    }

    /// The value as `MRCACHE_ODP` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            OnDemand::Off => "off",
            OnDemand::Auto => "auto",
            OnDemand::On => "on",
        }
    }
}

/// What happens to the remote keys of cached registrations (`MRCACHE_REMOTE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteMode {
    /// Remote rights are granted per handle and revoked before `ibv_dereg_mr` returns.
    Revoke,
    /// The registration's own keys stay valid while it is cached (the old behaviour).
    Keep,
    /// Registrations with remote access are not cached.
    Bypass,
}

impl RemoteMode {
    pub(crate) fn parse(v: &str) -> Option<RemoteMode> {
        match v {
            "revoke" => Some(RemoteMode::Revoke),
            "keep" => Some(RemoteMode::Keep),
            "bypass" => Some(RemoteMode::Bypass),
            _ => None,
        }
    }

    /// The value as `MRCACHE_REMOTE` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            RemoteMode::Revoke => "revoke",
            RemoteMode::Keep => "keep",
            RemoteMode::Bypass => "bypass",
        }
    }
}

/// `MRCACHE_STATS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsMode {
    /// No report (0).
    Off,
    /// A summary on stderr at exit (1).
    Summary,
    /// One JSON report per process (json).
    Json,
}

/// How the library learns that memory goes away (`MRCACHE_MONITOR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Monitor {
    /// Symbol hooks, plus glibc's internal unmap entry points patched at load.
    Patch,
    /// Symbol hooks only: glibc-internal unmaps (free, malloc_trim) are not seen.
    Symbols,
    /// Nothing is tracked. Unsafe; for tests that must see stale registrations.
    None,
}

impl Monitor {
    pub(crate) fn parse(v: &str) -> Option<Monitor> {
        match v {
            "patch" => Some(Monitor::Patch),
            "symbols" => Some(Monitor::Symbols),
            "none" => Some(Monitor::None),
            _ => None,
        }
    }

    /// The value as `MRCACHE_MONITOR` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Monitor::Patch => "patch",
            Monitor::Symbols => "symbols",
            Monitor::None => "none",
        }
    }
}

/// Names in the MRCACHE_ namespace that are read elsewhere (launcher, test rig).
pub(super) const OTHER_KNOWN: &[&str] = &[
    "MRCACHE_BIN",
    "MRCACHE_LIB",
    "MRCACHE_TEST_EXPECT_HITS",
    "MRCACHE_TEST_INIT_DELAY_MS",
    "MRCACHE_TEST_COMPLETION_LIMIT_MS",
    "MRCACHE_TEST_NO_MW",
    "MRCACHE_PRELOAD",
    "MRCACHE_VM",
    "MRCACHE_VM_CACHE",
    "MRCACHE_VM_CASES",
    "MRCACHE_VM_INJECT",
    "MRCACHE_SKIP_VM",
    "MRCACHE_VM_RUN",
    "MRCACHE_VM_WORK",
    "MRCACHE_VM_JEMALLOC",
    "MRCACHE_TEST_DEVICE",
    "MRCACHE_TEST_CC",
    "MRCACHE_TEST_A64_TEAR",
    "MRCACHE_TEST_A64_BREAK",
];
