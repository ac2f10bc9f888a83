//! `MRCACHE_*` environment variables: one table, one parser. A bad value yields one line
//! naming the variable, the value and what is allowed; the caller then runs with the cache
//! off, so nothing is silently misconfigured.

use crate::log::LogFormat;
pub use crate::log::LogLevel;
use crate::node::{self, LocalRanks, Memlock, Node};
use std::fmt;

mod values;
use values::OTHER_KNOWN;
pub use values::{Admit, ForkMode, Monitor, RemoteMode, StatsMode};

/// Every variable the library reads. docs/configuration.md is checked against this table.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "MRCACHE_ENABLE",
        default: "1",
        allowed: "1, 0 (also on/off, true/false, yes/no)",
        about: "0 turns the cache off: every call goes straight to libibverbs",
    },
    Variable {
        name: "MRCACHE_MAX_ENTRIES",
        default: "16384",
        allowed: "a positive integer, or unlimited",
        about: "most registrations kept; idle ones beyond it are evicted, least recently used first",
    },
    Variable {
        name: "MRCACHE_MAX_BYTES",
        default: "auto (a quarter of physical memory, divided by the ranks on the node, at most 3/4 of RLIMIT_MEMLOCK)",
        allowed: "bytes with optional K, M, G, T suffix (powers of 1024: 512M, 4G, 1.5G), auto, or unlimited",
        about: "most bytes kept registered (pinned); idle entries beyond it are evicted",
    },
    Variable {
        name: "MRCACHE_SHADOW",
        default: "1",
        allowed: "1 or 0",
        about: "hand each concurrent user of one cached registration its own ibv_mr copy with its own addr/length; 0 shares the provider's object and disables containing-range hits",
    },
    Variable {
        name: "MRCACHE_REMOTE_SUPERSET",
        default: "0",
        allowed: "1 or 0",
        about: "1 lets a request with remote access hit a cached registration of a containing range or with more remote rights (widens what a peer can reach: opt in knowingly)",
    },
    Variable {
        name: "MRCACHE_REMOTE",
        default: "revoke",
        allowed: "revoke, keep, bypass",
        about: "registrations with remote access: revoke = cached, but the app's rkey is a memory window bound at each registration and unbound before ibv_dereg_mr returns, so an old key reaches nothing (a fresh key at every hit); keep = the registration's own rkey stays valid while it is cached (a peer holding it can still write into the memory after ibv_dereg_mr, even after free: only for peers you trust); bypass = not cached, passed to libibverbs",
    },
    Variable {
        name: "MRCACHE_ADMIT",
        default: "auto",
        allowed: "auto, always",
        about: "auto = cache a registration's size class (power of two of its length) and access kind (local, remote under revoke) only while its measured cached round (hit + release, with the window bind and unbind for remote) costs less than the provider's reg + dereg, else pass it through (a cached trial after 32 misses, backing off to 1024, re-measures); and when the cache is full, evict for a new registration only if it was seen more often lately than the victim was used (scan resistance); always = cache every registration, evict least recently used (the figures are still measured and reported)",
    },
    Variable {
        name: "MRCACHE_MONITOR",
        default: "patch",
        allowed: "patch, symbols, none",
        about: "how unmapped memory is seen: patch = symbol hooks plus glibc's internal munmap/madvise/mmap/brk patched at the first registration (sees free(), malloc_trim, arena shrink); symbols = symbol hooks only (misses those, so caching is off); none = nothing (UNSAFE: for tests that must see stale registrations)",
    },
    Variable {
        name: "MRCACHE_PATCH_CHECK",
        default: "watch",
        allowed: "watch, every-hit",
        about: "with MRCACHE_MONITOR=patch, when a hit reads every patched libc entry and hook to see that no other code patcher overwrote one: watch = only while a patched code page may have been made writable, replaced or dropped since the last check (seen by the mprotect, pkey_mprotect and unmap hooks and libc's patched mprotect entry, while every patched page is still the one patched; writers that bypass libc are seen by the background check within 20 ms, see docs/design/monitor.md); every-hit = on every hit (about 290 instructions more per hit pair)",
    },
    Variable {
        name: "MRCACHE_VERIFY",
        default: "off",
        allowed: "off, pfn",
        about: "pfn (root only): on every hit, compare the page frame numbers now backing the range (/proc/self/pagemap) with those recorded at registration; a mismatch is reported loudly and treated as a miss",
    },
    Variable {
        name: "MRCACHE_FORK",
        default: "auto",
        allowed: "auto, keep, flush",
        about: "what to do at fork(): auto = keep everything when the kernel copies pinned pages at fork (Linux >= 5.13), else flush; keep = never flush; flush = deregister idle entries before every fork and, when libibverbs' fork tracking is on, mark ranges in use MADV_DONTFORK for the fork",
    },
    Variable {
        name: "MRCACHE_LOG",
        default: "off",
        allowed: "off, error, warn, info, debug, trace, or tracing-subscriber EnvFilter directives, comma-separated (spaces around each ignored), each with a level (info, mrcache::call=trace; mrcache= with no level is refused)",
        about: "info: decisions the library makes (fork handling, the self-test); trace: also one line per interposed call (call, arguments, result, hit/miss/bypass/invalidate, duration)",
    },
    Variable {
        name: "MRCACHE_LOG_FORMAT",
        default: "text",
        allowed: "text, json",
        about: "json writes each log and trace line as one JSON object (tracing-subscriber's JSON format: level, target, message, and for a traced call its fields: call, outcome, tid, at_ns, dur_ns, result), for tools",
    },
    Variable {
        name: "MRCACHE_TRACE_BUFFER",
        default: "8192",
        allowed: "an integer from 16 to 16777216 (records)",
        about: "size of the trace ring at MRCACHE_LOG=trace; when the writer falls behind, new records are dropped and counted, never waited for",
    },
    Variable {
        name: "MRCACHE_STATS",
        default: "0",
        allowed: "0, 1, json",
        about: "1 prints a summary of the cache's counters on stderr at exit; json writes one JSON object per process (to MRCACHE_STATS_FILE, else MRCACHE_LOG_FILE, else stderr) for `mrcache stats`",
    },
    Variable {
        name: "MRCACHE_STATS_FILE",
        default: "(none)",
        allowed: "a file path; %p is replaced by the pid, %h by the host name",
        about: "where MRCACHE_STATS=json appends its JSON line",
    },
    Variable {
        name: "MRCACHE_LOG_FILE",
        default: "(none: stderr)",
        allowed: "a file path; %p is replaced by the pid, %h by the host name",
        about: "where log and trace lines go (appended); a fork child with %p in the name gets its own file",
    },
];

pub struct Variable {
    pub name: &'static str,
    pub default: &'static str,
    pub allowed: &'static str,
    pub about: &'static str,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub enabled: bool,
    pub max_entries: usize,
    pub max_bytes: u64,
    pub shadow: bool,
    pub remote_superset: bool,
    pub remote: RemoteMode,
    /// `MRCACHE_ADMIT`.
    pub admit: Admit,
    pub stats: StatsMode,
    pub stats_file: Option<String>,
    pub log_file: Option<String>,
    pub monitor: Monitor,
    pub verify_pfn: bool,
    /// `MRCACHE_PATCH_CHECK=every-hit`: every hit reads every patched site (no watch).
    pub patch_check_every_hit: bool,
    pub fork: ForkMode,
    pub log: LogLevel,
    /// `MRCACHE_LOG` as given (an `EnvFilter`; see `log::parse_filter`).
    pub log_filter: String,
    pub log_format: LogFormat,
    pub trace_buffer: usize,
    /// How `max_bytes` was chosen: "MRCACHE_MAX_BYTES" when set, else the derivation of
    /// the default (see `node::auto_max_bytes`).
    pub max_bytes_why: String,
    /// The node-local rank count a launcher set, if any.
    pub local_ranks: Option<LocalRanks>,
    /// The locked-memory limit the process runs under.
    pub memlock: Memlock,
}

impl Config {
    /// The defaults for a machine with `physical_memory` bytes.
    pub fn defaults(physical_memory: u64) -> Config {
        let (max_bytes, max_bytes_why) = node::auto_max_bytes(&Node {
            physical_memory,
            local_ranks: None,
            memlock: Memlock::Unknown,
        });
        Config {
            enabled: true,
            max_entries: 16384,
            max_bytes,
            shadow: true,
            remote_superset: false,
            remote: RemoteMode::Revoke,
            admit: Admit::Auto,
            stats: StatsMode::Off,
            stats_file: None,
            log_file: None,
            monitor: Monitor::Patch,
            verify_pfn: false,
            patch_check_every_hit: false,
            fork: ForkMode::Auto,
            log: LogLevel::Off,
            log_filter: "off".into(),
            log_format: LogFormat::Text,
            trace_buffer: 8192,
            max_bytes_why,
            local_ranks: None,
            memlock: Memlock::Unknown,
        }
    }
}

fn auto_max_bytes(physical_memory: u64) -> u64 {
    if physical_memory == 0 {
        u64::MAX
    } else {
        physical_memory / 4
    }
}

/// Physical memory in bytes (from /proc/meminfo), 0 when unknown.
pub fn physical_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

/// A problem with one variable.
#[derive(Debug, Clone, PartialEq)]
pub enum Problem {
    /// A bad value: the cache must stay off.
    Invalid {
        name: String,
        value: String,
        allowed: &'static str,
    },
    /// An `MRCACHE_*` name this version does not know (a typo?): reported, not fatal.
    Unknown { name: String },
}

impl Problem {
    pub fn is_fatal(&self) -> bool {
        matches!(self, Problem::Invalid { .. })
    }

    /// The variable it is about.
    pub fn name(&self) -> &str {
        match self {
            Problem::Invalid { name, .. } | Problem::Unknown { name } => name,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Invalid {
                name,
                value,
                allowed,
            } => write!(
                f,
                "mrcache: {name}={value:?} is not valid (allowed: {allowed}); the cache is off for this process"
            ),
            Problem::Unknown { name } => write!(
                f,
                "mrcache: unknown variable {name} ignored (known: {})",
                VARIABLES
                    .iter()
                    .map(|v| v.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// Parse the `MRCACHE_*` variables among `vars`, with no locked-memory limit known. With
/// any fatal problem the returned config has `enabled = false`.
pub fn parse<I, K, V>(vars: I, physical_memory: u64) -> (Config, Vec<Problem>)
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    parse_on(vars, physical_memory, Memlock::Unknown)
}

/// Parse the `MRCACHE_*` variables among `vars` (the whole environment: a launcher's
/// node-local rank count divides the default byte cap) for a process with `memlock`.
pub fn parse_on<I, K, V>(vars: I, physical_memory: u64, memlock: Memlock) -> (Config, Vec<Problem>)
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    let mut cfg = Config::defaults(physical_memory);
    let mut problems = Vec::new();
    let mut launcher: [Option<String>; node::LAUNCHER_VARIABLES.len()] = Default::default();
    let mut explicit_bytes = false;
    for (k, v) in vars {
        let (name, value) = (k.as_ref(), v.as_ref().trim());
        if let Some(i) = node::LAUNCHER_VARIABLES.iter().position(|l| *l == name) {
            launcher[i] = Some(value.to_string());
        }
        if !name.starts_with("MRCACHE_") {
            continue;
        }
        let Some(var) = VARIABLES.iter().find(|var| var.name == name) else {
            // Variables the launcher, tests and later versions use are not ours to judge.
            if !OTHER_KNOWN.contains(&name) {
                problems.push(Problem::Unknown {
                    name: name.to_string(),
                });
            }
            continue;
        };
        let ok = match name {
            "MRCACHE_ENABLE" => parse_bool(value).map(|b| cfg.enabled = b),
            "MRCACHE_MAX_ENTRIES" => parse_count(value).map(|n| cfg.max_entries = n),
            "MRCACHE_MAX_BYTES" if value.eq_ignore_ascii_case("auto") => Some(()),
            "MRCACHE_MAX_BYTES" => parse_bytes(value, physical_memory).map(|n| {
                cfg.max_bytes = n;
                explicit_bytes = true;
            }),
            "MRCACHE_SHADOW" => parse_bool(value).map(|b| cfg.shadow = b),
            "MRCACHE_REMOTE_SUPERSET" => parse_bool(value).map(|b| cfg.remote_superset = b),
            "MRCACHE_STATS" => match value {
                "json" => Some(StatsMode::Json),
                v => parse_bool(v).map(|on| {
                    if on {
                        StatsMode::Summary
                    } else {
                        StatsMode::Off
                    }
                }),
            }
            .map(|m| cfg.stats = m),
            "MRCACHE_STATS_FILE" => {
                (!value.is_empty()).then(|| cfg.stats_file = Some(value.to_string()))
            }
            "MRCACHE_LOG_FILE" => {
                (!value.is_empty()).then(|| cfg.log_file = Some(value.to_string()))
            }
            "MRCACHE_REMOTE" => RemoteMode::parse(value).map(|m| cfg.remote = m),
            "MRCACHE_MONITOR" => Monitor::parse(value).map(|m| cfg.monitor = m),
            "MRCACHE_PATCH_CHECK" => match value {
                "watch" => Some(false),
                "every-hit" => Some(true),
                _ => None,
            }
            .map(|v| cfg.patch_check_every_hit = v),
            "MRCACHE_ADMIT" => Admit::parse(value).map(|a| cfg.admit = a),
            "MRCACHE_VERIFY" => match value {
                "off" => Some(false),
                "pfn" => Some(true),
                _ => None,
            }
            .map(|v| cfg.verify_pfn = v),
            "MRCACHE_FORK" => match value {
                "auto" => Some(ForkMode::Auto),
                "keep" => Some(ForkMode::Keep),
                "flush" => Some(ForkMode::Flush),
                _ => None,
            }
            .map(|m| cfg.fork = m),
            "MRCACHE_LOG" => crate::log::parse_filter(value).map(|(_, l)| {
                cfg.log = l;
                cfg.log_filter = value.to_string();
            }),
            "MRCACHE_LOG_FORMAT" => LogFormat::parse(value).map(|f| cfg.log_format = f),
            "MRCACHE_TRACE_BUFFER" => value
                .parse::<usize>()
                .ok()
                .filter(|n| (16..=1 << 24).contains(n))
                .map(|n| cfg.trace_buffer = n),
            _ => None,
        };
        if ok.is_none() {
            problems.push(Problem::Invalid {
                name: name.to_string(),
                value: value.to_string(),
                allowed: var.allowed,
            });
        }
    }
    cfg.local_ranks = node::local_ranks(|name| {
        let i = node::LAUNCHER_VARIABLES.iter().position(|l| *l == name)?;
        launcher[i].as_deref()
    });
    cfg.memlock = memlock;
    if explicit_bytes {
        cfg.max_bytes_why = "MRCACHE_MAX_BYTES".to_string();
    } else {
        (cfg.max_bytes, cfg.max_bytes_why) = node::auto_max_bytes(&Node {
            physical_memory,
            local_ranks: cfg.local_ranks,
            memlock,
        });
    }
    if problems.iter().any(Problem::is_fatal) {
        cfg.enabled = false;
    }
    (cfg, problems)
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Some(true),
        "0" | "off" | "false" | "no" => Some(false),
        _ => None,
    }
}

fn parse_count(v: &str) -> Option<usize> {
    if v.eq_ignore_ascii_case("unlimited") {
        return Some(usize::MAX);
    }
    v.parse::<usize>().ok().filter(|&n| n > 0)
}

/// `4G`, `512M`, `64k`, `1048576`, `1.5G` (binary multiples), `auto`, `unlimited`.
pub fn parse_bytes(v: &str, physical_memory: u64) -> Option<u64> {
    match v.to_ascii_lowercase().as_str() {
        "unlimited" => return Some(u64::MAX),
        "auto" => return Some(auto_max_bytes(physical_memory)),
        _ => {}
    }
    let v = v.strip_suffix(['b', 'B']).unwrap_or(v);
    let v = v.strip_suffix(['i']).unwrap_or(v);
    let (num, mult) = match v.char_indices().last()? {
        (i, 'k' | 'K') => (&v[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&v[..i], 1 << 20),
        (i, 'g' | 'G') => (&v[..i], 1 << 30),
        (i, 't' | 'T') => (&v[..i], 1 << 40),
        _ => (v, 1),
    };
    if num.is_empty() || !num.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    let bytes = if num.contains('.') {
        let f: f64 = num.parse().ok()?;
        let b = f * mult as f64;
        (b.is_finite() && b >= 1.0 && b < u64::MAX as f64).then_some(b as u64)?
    } else {
        num.parse::<u64>().ok()?.checked_mul(mult)?
    };
    (bytes > 0).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn defaults_without_variables() {
        let (cfg, problems) = parse(Vec::<(String, String)>::new(), 16 * GIB);
        assert!(problems.is_empty());
        assert_eq!(cfg, Config::defaults(16 * GIB));
        assert_eq!(cfg.max_bytes, 4 * GIB);
    }

    #[test]
    fn default_bytes_per_rank_and_under_memlock() {
        let four_ranks = [("OMPI_COMM_WORLD_LOCAL_SIZE", "4"), ("PATH", "/bin")];
        let (cfg, problems) = parse(four_ranks, 16 * GIB);
        assert!(problems.is_empty());
        assert_eq!(cfg.max_bytes, GIB);
        assert_eq!(cfg.local_ranks.map(|r| r.count), Some(4));
        // `auto` spelled out is the same default; an explicit size is taken as given.
        let (cfg, _) = parse([four_ranks[0], ("MRCACHE_MAX_BYTES", "auto")], 16 * GIB);
        assert_eq!(cfg.max_bytes, GIB);
        let (cfg, _) = parse([four_ranks[0], ("MRCACHE_MAX_BYTES", "8G")], 16 * GIB);
        assert_eq!(
            (cfg.max_bytes, cfg.max_bytes_why.as_str()),
            (8 * GIB, "MRCACHE_MAX_BYTES")
        );
        let hydra = [("MPI_LOCALNRANKS", "8")];
        let (cfg, _) = parse_on(hydra, 16 * GIB, Memlock::Limit(64 << 20));
        assert_eq!(cfg.max_bytes, 48 << 20);
        assert!(
            cfg.max_bytes_why.contains("RLIMIT_MEMLOCK"),
            "{}",
            cfg.max_bytes_why
        );
        assert_eq!(cfg.memlock, Memlock::Limit(64 << 20));
        let (cfg, _) = parse_on(hydra, 16 * GIB, Memlock::CapIpcLock);
        assert_eq!(cfg.max_bytes, 512 << 20);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("4G", 0), Some(4 * GIB));
        assert_eq!(parse_bytes("512M", 0), Some(512 << 20));
        assert_eq!(parse_bytes("512MiB", 0), Some(512 << 20));
        assert_eq!(parse_bytes("64k", 0), Some(64 << 10));
        assert_eq!(parse_bytes("1.5G", 0), Some(3 * GIB / 2));
        assert_eq!(parse_bytes("1048576", 0), Some(1 << 20));
        assert_eq!(parse_bytes("unlimited", 0), Some(u64::MAX));
        assert_eq!(parse_bytes("auto", 8 * GIB), Some(2 * GIB));
        for bad in [
            "",
            "G",
            "-1G",
            "4X",
            "0",
            "1e9",
            "4 G",
            "99999999999999999999",
        ] {
            assert_eq!(parse_bytes(bad, 0), None, "{bad:?} must be rejected");
        }
    }

    #[test]
    fn every_bad_value_turns_the_cache_off_with_one_line() {
        let cases = [
            ("MRCACHE_ENABLE", "maybe"),
            ("MRCACHE_MAX_ENTRIES", "0"),
            ("MRCACHE_MAX_ENTRIES", "-3"),
            ("MRCACHE_MAX_ENTRIES", "lots"),
            ("MRCACHE_MAX_BYTES", "4X"),
            ("MRCACHE_SHADOW", "2"),
            ("MRCACHE_REMOTE_SUPERSET", "yes please"),
            ("MRCACHE_MONITOR", "uffd"),
            ("MRCACHE_REMOTE", "revoked"),
            ("MRCACHE_STATS", "verbose"),
            ("MRCACHE_VERIFY", "always"),
            ("MRCACHE_FORK", "sometimes"),
            ("MRCACHE_LOG", "loud"),
            ("MRCACHE_LOG", "mrcache=chatty"),
            ("MRCACHE_TRACE_BUFFER", "8"),
        ];
        for (name, value) in cases {
            let (cfg, problems) = parse([(name, value)], 8 * GIB);
            assert!(!cfg.enabled, "{name}={value} must turn the cache off");
            assert_eq!(problems.len(), 1);
            let line = problems[0].to_string();
            assert!(!line.contains('\n'));
            assert!(
                line.contains(name) && line.contains(value) && line.contains("allowed"),
                "{line}"
            );
        }
    }

    #[test]
    fn good_values_apply() {
        let (cfg, problems) = parse(
            [
                ("MRCACHE_MAX_ENTRIES", "8"),
                ("MRCACHE_MAX_BYTES", "512M"),
                ("MRCACHE_SHADOW", "off"),
                ("MRCACHE_REMOTE_SUPERSET", "1"),
                ("PATH", "/bin"),
            ],
            8 * GIB,
        );
        assert!(problems.is_empty());
        assert!(cfg.enabled && !cfg.shadow && cfg.remote_superset);
        assert_eq!((cfg.max_entries, cfg.max_bytes), (8, 512 << 20));
    }

    #[test]
    fn unknown_names_warn_but_keep_the_cache_on() {
        let (cfg, problems) = parse([("MRCACHE_MAX_ENTRIS", "8")], 8 * GIB);
        assert!(cfg.enabled);
        assert_eq!(
            problems,
            vec![Problem::Unknown {
                name: "MRCACHE_MAX_ENTRIS".into()
            }]
        );
    }

    #[test]
    fn configuration_reference_lists_every_variable() {
        let doc = include_str!("../docs/configuration.md");
        for v in VARIABLES {
            assert!(
                doc.contains(&format!("`{}`", v.name)),
                "docs/configuration.md lacks {}",
                v.name
            );
            assert!(
                doc.contains(v.default),
                "docs/configuration.md lacks the default of {}",
                v.name
            );
        }
    }
}

/// The reference's names against the table.
#[cfg(test)]
#[path = "config/documented_test.rs"]
mod documented_test;
