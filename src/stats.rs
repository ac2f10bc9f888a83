//! The statistics: every counter named once (an enum and its name table, as UCX's stats
//! classes), the atomic counters the cache and the hooks bump, and the per-process report
//! (`MRCACHE_STATS=json`) written by libmrcache.so at exit and read back by `mrcache stats
//! FILES...` to aggregate a job's ranks.

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// An enum whose variants each carry their one name, with `ALL`, `COUNT` and `name()`.
macro_rules! named_enum {
    ($(#[$m:meta])* pub enum $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$vm])* $v,)* }
        impl $name {
            /// Every variant, in order.
            pub const ALL: &[$name] = &[$($name::$v,)*];
            /// How many variants.
            pub const COUNT: usize = Self::ALL.len();
            const NAMES: [&str; Self::COUNT] = [$($s,)*];
            /// The name in reports and JSON.
            pub const fn name(self) -> &'static str {
                Self::NAMES[self as usize]
            }
            #[allow(dead_code, reason = "not every enum's is read outside tests")]
            pub(crate) fn from_name(name: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|c| c.name() == name)
            }
        }
    };
}

named_enum! {
    /// The numeric statistics of one process (the names are the JSON keys).
    pub enum Counter {
        /// Requests served by a cached registration of the same range.
        Hits = "hits",
        /// Requests served by a cached registration of a containing range.
        HitsContaining = "hits_containing",
        /// Registrations made and cached.
        Misses = "misses",
        /// Registrations made and not cached (limits, or invalidated meanwhile).
        Uncached = "uncached",
        /// Idle entries evicted to make room.
        Evictions = "evictions",
        /// Idle entries given back after the provider failed with ENOMEM.
        EvictionsEnomem = "evictions_enomem",
        /// Cached entries dropped because their memory went away.
        Invalidated = "invalidated_entries",
        /// Unmapped ranges merged into one because the invalidation ring was full.
        UnmapsMergedOnOverflow = "unmaps_merged_on_overflow",
        /// Second `ibv_dereg_mr` calls of one handle.
        DoubleDeregs = "double_deregs",
        /// Hits refused by `MRCACHE_VERIFY=pfn` (the pages had changed).
        VerifyMismatches = "verify_mismatches",
        /// Provider deregistrations that failed.
        DeregFailures = "dereg_failures",
        /// Entries still cached at exit.
        EntriesAtExit = "entries_at_exit",
        /// Bytes still cached at exit.
        BytesAtExit = "bytes_at_exit",
        /// Most entries cached at once.
        PeakEntries = "peak_entries",
        /// Most bytes cached at once.
        PeakBytes = "peak_bytes",
        /// Time spent in provider registrations (misses and uncached).
        RegistrationNs = "registration_ns",
        /// `fork()` calls seen.
        Forks = "forks",
        /// Idle entries deregistered before a fork.
        ForkIdleDeregistered = "fork_idle_deregistered",
        /// Ranges in use marked DONTFORK for a fork.
        ForkRangesDontfork = "fork_ranges_dontfork",
        /// Remote keys handed out through windows (`MRCACHE_REMOTE=revoke`).
        RemoteGrants = "remote_grants",
        /// ... and revoked at `ibv_dereg_mr`.
        RemoteRevokes = "remote_revokes",
        /// Trace records dropped because the ring was full.
        TraceRecordsDropped = "trace_records_dropped",
        /// Misses passed through (local: registered uncached; remote: to libibverbs)
        /// because caching their size class did not pay at the measured costs.
        AdmissionPassedCost = "admission_passed_cost",
        /// ... because the cache was full of entries used more often (scan resistance).
        AdmissionPassedScan = "admission_passed_scan",
        /// Cached trials of a passed-through size class (its figures re-measured).
        AdmissionTrials = "admission_trials",
    }
}

impl Counter {
    /// A high-water mark: a job's total is the largest, not the sum.
    pub(crate) fn is_peak(self) -> bool {
        matches!(self, Counter::PeakEntries | Counter::PeakBytes)
    }
}

named_enum! {
    /// Why a registration was passed to libibverbs untouched (`Report::bypassed` keys).
    pub enum Bypassed {
        /// ON_DEMAND: nothing is pinned, nothing to cache.
        OnDemand = "on-demand",
        /// ZERO_BASED: the cache keys on virtual addresses.
        ZeroBased = "zero-based",
        /// Access bits libibverbs does not define.
        UnknownFlags = "unknown-access-flags",
        /// Zero length, or a range that wraps the address space.
        BadRange = "bad-range",
        /// Made inside one of our own calls (by the provider or the cache).
        Nested = "nested",
        /// `MRCACHE_ENABLE=0`, or set-up failed.
        Disabled = "disabled",
        /// libibverbs' own behaviour for a NULL pd.
        NullPd = "null-pd",
        /// A bug: the cache panicked, the call fell back.
        Panic = "panic",
        /// Remote access under `MRCACHE_REMOTE=bypass`, or revocation not possible here.
        RemoteAccess = "remote-access",
        /// Another thread sets the library up, replaces a fork child's cache, or forks.
        SettingUp = "setting-up",
        /// The CPU cannot read the range: nothing mapped there, `PROT_NONE` (how CUDA
        /// reserves device memory's addresses), or a device mapping (`VM_IO`/`VM_PFNMAP`)
        /// that get_user_pages refuses: a peer-memory client's (GPU memory), which can
        /// change behind an address without any unmap we could see.
        DeviceMemory = "device-memory",
        /// In a fork child, a verbs context the parent opened (the child's command fd is
        /// the parent's open file): what the child registers there is an object of the
        /// parent's kernel context and, kept idle, would outlive the child.
        ParentsContext = "parents-context",
        /// Caching its size class does not pay at the measured costs (`admission`).
        NotWorthCaching = "not-worth-caching",
        /// The cache was full of entries used more often (scan resistance).
        Scan = "scan",
        /// A cached remote class's hit passed through to re-measure a miss's cost.
        Probe = "admission-probe",
        /// The key's entry already held 4,095 times at once.
        Saturated = "references-full",
        /// The monitor is blind here and the device cannot register this one on demand
        /// (`MRCACHE_ODP`).
        NotOnDemand = "not-on-demand",
    }
}

impl From<crate::access::Bypass> for Bypassed {
    fn from(b: crate::access::Bypass) -> Self {
        use crate::access::Bypass;
        match b {
            Bypass::OnDemand => Bypassed::OnDemand,
            Bypass::ZeroBased => Bypassed::ZeroBased,
            Bypass::UnknownFlags => Bypassed::UnknownFlags,
            Bypass::BadRange => Bypassed::BadRange,
            Bypass::Nested => Bypassed::Nested,
            Bypass::Disabled => Bypassed::Disabled,
            Bypass::Remote => Bypassed::RemoteAccess,
            Bypass::DeviceMemory => Bypassed::DeviceMemory,
            Bypass::NotWorthCaching => Bypassed::NotWorthCaching,
            Bypass::Scan => Bypassed::Scan,
            Bypass::Probe => Bypassed::Probe,
            Bypass::Saturated => Bypassed::Saturated,
            Bypass::NotOnDemand => Bypassed::NotOnDemand,
        }
    }
}

named_enum! {
    /// The memory hook that reported an unmap (`Report::unmaps_by_source` keys).
    pub enum UnmapSource {
        /// `munmap`.
        Munmap = "munmap",
        /// `madvise` that frees pages (`MADV_DONTNEED`, `MADV_FREE`, ...).
        Madvise = "madvise",
        /// `mremap`.
        Mremap = "mremap",
        /// `mmap` with `MAP_FIXED` over existing memory.
        MmapFixed = "mmap-fixed",
        /// `brk` that shrinks the heap.
        Brk = "brk",
        /// `sbrk` with a negative increment.
        Sbrk = "sbrk",
        /// `shmat` with `SHM_REMAP` over existing memory.
        ShmatRemap = "shmat-remap",
        /// `shmdt`.
        Shmdt = "shmdt",
        /// glibc's `realloc` of an mmapped chunk (moved by its internal `__mremap`).
        Realloc = "realloc",
        /// A protection change that takes access away (not an unmap, reported as one).
        Mprotect = "mprotect",
    }
}

/// Lock-free counters indexed by an enum made with `named_enum!` (no allocation: usable
/// in a `static` and from memory hooks).
pub struct Tally<const N: usize>([AtomicU64; N]);

impl<const N: usize> Tally<N> {
    /// All zero.
    pub const fn new() -> Self {
        Tally([const { AtomicU64::new(0) }; N])
    }
    /// Add `n` to counter `i`.
    #[inline]
    pub fn add(&self, i: usize, n: u64) {
        self.0[i].fetch_add(n, Relaxed);
    }
    #[inline]
    pub(crate) fn max(&self, i: usize, v: u64) {
        self.0[i].fetch_max(v, Relaxed);
    }
    /// Counter `i` now.
    pub fn get(&self, i: usize) -> u64 {
        self.0[i].load(Relaxed)
    }
    pub(crate) fn values(&self) -> [u64; N] {
        std::array::from_fn(|i| self.get(i))
    }
}

impl<const N: usize> Default for Tally<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// The cache's and the shell's counters.
#[derive(Default)]
pub struct Counters(Tally<{ Counter::COUNT }>);

impl Counters {
    /// All zero.
    pub const fn new() -> Self {
        Counters(Tally::new())
    }
    /// Add `n` to `c`.
    #[inline]
    pub fn add(&self, c: Counter, n: u64) {
        self.0.add(c as usize, n);
    }
    #[inline]
    pub(crate) fn max(&self, c: Counter, v: u64) {
        self.0.max(c as usize, v);
    }
    /// `c` now.
    pub fn get(&self, c: Counter) -> u64 {
        self.0.get(c as usize)
    }
    /// A copy of every counter.
    pub fn counts(&self) -> Counts {
        Counts(self.0.values())
    }
}

/// A plain copy of the counters; serialised as one JSON key per counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts(pub [u64; Counter::COUNT]);

impl Default for Counts {
    fn default() -> Self {
        Counts([0; Counter::COUNT])
    }
}

impl std::ops::Index<Counter> for Counts {
    type Output = u64;
    fn index(&self, c: Counter) -> &u64 {
        &self.0[c as usize]
    }
}

impl std::ops::IndexMut<Counter> for Counts {
    fn index_mut(&mut self, c: Counter) -> &mut u64 {
        &mut self.0[c as usize]
    }
}

impl Serialize for Counts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(Counter::COUNT))?;
        for &c in Counter::ALL {
            m.serialize_entry(c.name(), &self[c])?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for Counts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Counts;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of counters")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Counts, A::Error> {
                let mut out = Counts::default();
                while let Some(key) = map.next_key::<String>()? {
                    match Counter::from_name(&key) {
                        Some(c) => out[c] = map.next_value()?,
                        None => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(V)
    }
}

/// One process's statistics, as `MRCACHE_STATS=json` writes them and `mrcache stats` reads them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The library's version.
    pub version: String,
    /// The process.
    pub pid: u32,
    /// The host name.
    pub host: String,
    /// Every counter, flattened into the object by its name.
    #[serde(flatten)]
    pub counts: Counts,
    /// Registrations passed to libibverbs untouched, by `Bypassed` name.
    pub bypassed: BTreeMap<String, u64>,
    /// Unmaps reported by the memory hooks, by `UnmapSource` name.
    pub unmaps_by_source: BTreeMap<String, u64>,
    /// What happens at fork, and why.
    pub fork_decision: String,
    /// `MRCACHE_MONITOR` in force.
    pub monitor: String,
    /// Why caching was turned off in this process (empty: it was not).
    #[serde(default)]
    pub caching_off: String,
    /// Why only registrations the device makes on demand are cached in this process
    /// (`MRCACHE_ODP`; empty: every kind is).
    #[serde(default)]
    pub on_demand_only: String,
    /// `MRCACHE_REMOTE`: revoke, keep or bypass.
    #[serde(default)]
    pub remote_keys: String,
    /// The byte cap in force, and how it was chosen (`MRCACHE_MAX_BYTES`, or the default:
    /// a quarter of memory / node-local ranks, capped under RLIMIT_MEMLOCK).
    #[serde(default)]
    pub max_bytes: u64,
    /// How `max_bytes` was chosen.
    #[serde(default)]
    pub max_bytes_why: String,
    /// The node-local rank count a launcher set (0: none).
    #[serde(default)]
    pub local_ranks: u64,
    /// RLIMIT_MEMLOCK as it applies to pinning ("unlimited", "N bytes", ...).
    #[serde(default)]
    pub memlock: String,
    /// How long the startup self-test took, in microseconds.
    pub selftest_us: u64,
    /// The self-test's status of each way memory goes away.
    pub selftest: BTreeMap<String, String>,
    /// `MRCACHE_ADMIT`: auto or always.
    #[serde(default)]
    pub admit: String,
    /// What admission decided per size class and access kind, and on which figures.
    #[serde(default)]
    pub admission: Vec<AdmissionClass>,
}

/// One size class's admission decision and the measured figures it rests on (ns per
/// operation; decaying means).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AdmissionClass {
    /// "local" or "remote".
    pub access: String,
    /// The power of two at or above the lengths: "4KiB", "64KiB", ...
    pub class: String,
    /// "cache" or "pass-through".
    pub verdict: String,
    /// What a registration costs without the cache: reg + dereg.
    pub miss_ns: f64,
    /// The provider's registration.
    pub reg_ns: f64,
    /// The provider's deregistration.
    pub dereg_ns: f64,
    /// A cached round: hit and release (with bind and unbind for remote).
    pub cached_ns: f64,
    /// Where `cached_ns` comes from: "lock-free round" (local, timed by the cache on a new
    /// entry), "locked rounds" (hits and releases timed whole, with bind and unbind for
    /// remote), or "none yet".
    pub cached_from: String,
    /// One eviction's bookkeeping beyond its deregistration.
    pub evict_ns: f64,
    /// Samples behind reg_ns, dereg_ns and cached_ns.
    pub samples: [u64; 3],
    /// Registrations of the class passed through uncached.
    pub passed: u64,
    /// Registrations of the class cached on trial (or probed) to measure it again.
    pub trials: u64,
}

impl std::ops::Index<Counter> for Report {
    type Output = u64;
    fn index(&self, c: Counter) -> &u64 {
        &self.counts[c]
    }
}

impl Report {
    /// Hits of the same range and of a containing one.
    pub fn hits_total(&self) -> u64 {
        self[Counter::Hits] + self[Counter::HitsContaining]
    }

    /// Hits over all cacheable registrations (0 when none).
    pub fn hit_rate(&self) -> f64 {
        let all = self.hits_total() + self[Counter::Misses] + self[Counter::Uncached];
        if all == 0 {
            0.0
        } else {
            self.hits_total() as f64 / all as f64
        }
    }

    /// Sum of the counters over `reports` (pid 0, host "total"; peaks: the largest).
    pub fn total(reports: &[Report]) -> Report {
        let mut t = Report {
            host: "total".into(),
            ..Report::default()
        };
        for r in reports {
            for &c in Counter::ALL {
                t.counts[c] = if c.is_peak() {
                    t.counts[c].max(r[c])
                } else {
                    t.counts[c] + r[c]
                };
            }
            for (k, v) in &r.bypassed {
                *t.bypassed.entry(k.clone()).or_default() += v;
            }
            for (k, v) in &r.unmaps_by_source {
                *t.unmaps_by_source.entry(k.clone()).or_default() += v;
            }
            t.max_bytes = t.max_bytes.saturating_add(r.max_bytes);
        }
        let mut modes: Vec<&str> = reports.iter().map(|r| r.remote_keys.as_str()).collect();
        modes.sort_unstable();
        modes.dedup();
        t.remote_keys = modes.join("+");
        t
    }

    /// One JSON object on one line.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parse every JSON object line of `text` (other lines, e.g. a trace, are skipped).
    pub fn parse_lines(text: &str) -> Result<Vec<Report>, String> {
        text.lines()
            .enumerate()
            .filter(|(_, l)| l.trim_start().starts_with('{'))
            .map(|(n, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", n + 1)))
            .collect()
    }
}

/// Expand `%p` (pid) and `%h` (host name) in a file name pattern.
pub fn expand_path(pattern: &str, pid: u32, host: &str) -> String {
    pattern.replace("%p", &pid.to_string()).replace("%h", host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_total() {
        let mut a = Report {
            pid: 1,
            host: "n1".into(),
            ..Report::default()
        };
        a.counts[Counter::Hits] = 10;
        a.counts[Counter::Misses] = 2;
        a.bypassed.insert("on-demand".into(), 1);
        let mut b = Report {
            pid: 2,
            host: "n2".into(),
            ..Report::default()
        };
        b.counts[Counter::Hits] = 5;
        b.counts[Counter::Misses] = 3;
        b.counts[Counter::PeakEntries] = 7;
        let text = format!(
            "trace line\n{}\n{}\n",
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
        let parsed = Report::parse_lines(&text).unwrap();
        assert_eq!(parsed, vec![a.clone(), b.clone()]);
        let t = Report::total(&parsed);
        assert_eq!(
            (
                t[Counter::Hits],
                t[Counter::Misses],
                t[Counter::PeakEntries]
            ),
            (15, 5, 7)
        );
        assert_eq!(t.bypassed["on-demand"], 1);
        assert!((a.hit_rate() - 10.0 / 12.0).abs() < 1e-9);
        assert_eq!(
            expand_path("/tmp/mrc.%h.%p.json", 42, "n1"),
            "/tmp/mrc.n1.42.json"
        );
    }

    /// The JSON keys are the counters' names, and a report from an older version (a key
    /// missing, an unknown one) still reads.
    #[test]
    fn counter_names_are_the_json_keys() {
        let mut r = Report::default();
        r.counts[Counter::Invalidated] = 3;
        let json = r.to_json();
        for &c in Counter::ALL {
            assert!(json.contains(&format!("\"{}\":", c.name())), "{json}");
        }
        assert!(json.contains("\"invalidated_entries\":3"), "{json}");
        let old = r#"{"version":"0","pid":1,"host":"h","hits":4,"gone":1,"bypassed":{},"unmaps_by_source":{},"fork_decision":"","monitor":"patch","selftest_us":0,"selftest":{}}"#;
        let parsed = Report::parse_lines(old).unwrap();
        assert_eq!(parsed[0][Counter::Hits], 4);
        assert_eq!(parsed[0][Counter::Misses], 0);
        let names: std::collections::HashSet<&str> =
            Counter::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), Counter::COUNT);
        assert_eq!(Bypassed::from_name("null-pd"), Some(Bypassed::NullPd));
        assert_eq!(
            Bypassed::from_name("device-memory"),
            Some(Bypassed::DeviceMemory)
        );
        assert_eq!(UnmapSource::Realloc.name(), "realloc");
    }
}
