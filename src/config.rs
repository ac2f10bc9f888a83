//! `MRCACHE_*` environment variables: one table, one parser. A bad value yields one line
//! naming the variable, the value and what is allowed; the caller then runs with the cache
//! off, so nothing is silently misconfigured.

use crate::log::LogFormat;
pub use crate::log::LogLevel;
use crate::node::{self, LocalRanks, Memlock, Node};
use std::fmt;

mod values;
use values::OTHER_KNOWN;
pub use values::{Admit, ForkMode, Monitor, OnDemand, RemoteMode, StatsMode};
mod variables;
pub use variables::{VARIABLES, Variable};
pub mod odp_profile;
pub use odp_profile::OdpProfile;

/// The parsed `MRCACHE_*` variables (docs/configuration.md has each one).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `MRCACHE_ENABLE`, false also after a bad value.
    pub enabled: bool,
    /// `MRCACHE_MAX_ENTRIES`.
    pub max_entries: usize,
    /// `MRCACHE_MAX_BYTES`, or the default derived for this node (`max_bytes_why`).
    pub max_bytes: u64,
    /// `MRCACHE_SHADOW`.
    pub shadow: bool,
    /// `MRCACHE_REMOTE_SUPERSET`.
    pub remote_superset: bool,
    /// `MRCACHE_REMOTE`.
    pub remote: RemoteMode,
    /// `MRCACHE_ADMIT`.
    pub admit: Admit,
    /// `MRCACHE_STATS`.
    pub stats: StatsMode,
    /// `MRCACHE_STATS_FILE`.
    pub stats_file: Option<String>,
    /// `MRCACHE_LOG_FILE`.
    pub log_file: Option<String>,
    /// `MRCACHE_MONITOR`.
    pub monitor: Monitor,
    /// `MRCACHE_ODP`: entries registered on demand where the device pages them so.
    pub odp: OnDemand,
    /// `MRCACHE_ODP_PROFILE`: the file's path.
    pub odp_profile_path: Option<String>,
    /// That file, read when the cache is on under `MRCACHE_ODP=auto`: where `auto` makes
    /// entries on demand.
    pub odp_profile: Option<OdpProfile>,
    /// `MRCACHE_VERIFY=pfn`.
    pub verify_pfn: bool,
    /// `MRCACHE_PATCH_CHECK=every-hit`: every hit reads every patched site (no watch).
    pub patch_check_every_hit: bool,
    /// `MRCACHE_FORK`.
    pub fork: ForkMode,
    /// The most verbose level `MRCACHE_LOG` enables.
    pub log: LogLevel,
    /// `MRCACHE_LOG` as given (a `Targets` filter; see `log::parse_filter`).
    pub log_filter: String,
    /// `MRCACHE_LOG_FORMAT`.
    pub log_format: LogFormat,
    /// `MRCACHE_TRACE_BUFFER`: records the trace ring holds.
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
    pub(crate) fn defaults(physical_memory: u64) -> Config {
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
            odp: OnDemand::Auto,
            odp_profile_path: None,
            odp_profile: None,
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
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// What it accepts.
        allowed: &'static str,
    },
    /// A file a variable names that cannot be read or is not what it must be: the cache
    /// must stay off.
    File {
        /// The variable.
        name: String,
        /// Its value, the file's path.
        value: String,
        /// What is wrong, and what is allowed.
        why: String,
    },
    /// An `MRCACHE_*` name this version does not know (a typo?): reported, not fatal.
    Unknown {
        /// The variable.
        name: String,
    },
}

impl Problem {
    /// Whether the cache must stay off for it (a bad value, not an unknown name).
    pub fn is_fatal(&self) -> bool {
        !matches!(self, Problem::Unknown { .. })
    }

    /// The variable it is about.
    pub fn name(&self) -> &str {
        match self {
            Problem::Invalid { name, .. }
            | Problem::File { name, .. }
            | Problem::Unknown { name } => name,
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
            Problem::File { name, value, why } => write!(
                f,
                "mrcache: {name}={value:?}: {why}; the cache is off for this process"
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
            "MRCACHE_ODP" => OnDemand::parse(value).map(|o| cfg.odp = o),
            "MRCACHE_ODP_PROFILE" => {
                (!value.is_empty()).then(|| cfg.odp_profile_path = Some(value.to_string()))
            }
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
    // Read last, and only where it is used: a cache turned off, or another MRCACHE_ODP,
    // never opens it.
    if let Some(path) = &cfg.odp_profile_path
        && cfg.enabled
        && cfg.odp == OnDemand::Auto
        && !problems.iter().any(Problem::is_fatal)
    {
        match read_profile(path) {
            Ok(p) => cfg.odp_profile = Some(p),
            Err(why) => problems.push(Problem::File {
                name: "MRCACHE_ODP_PROFILE".to_string(),
                value: path.clone(),
                why,
            }),
        }
    }
    if problems.iter().any(Problem::is_fatal) {
        cfg.enabled = false;
    }
    (cfg, problems)
}

/// The on-demand profile at `path`, or what is wrong with it. Only a regular file is read,
/// opened without blocking (a FIFO or a device never holds the caller), and at most
/// `odp_profile::MAX_BYTES` of it.
fn read_profile(path: &str) -> Result<OdpProfile, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let cannot = |e: std::io::Error| format!("cannot read it: {e}");
    if !path.starts_with('/') {
        return Err("a relative path (allowed: an absolute path: the program may change its directory before its first registration)".into());
    }
    // Looked at before it is opened: opening a FIFO or a device node can act on it.
    let not_regular = "not a regular file (allowed: a file mrcache bench --odp-profile wrote)";
    if !std::fs::metadata(path).map_err(cannot)?.is_file() {
        return Err(not_regular.into());
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    if !meta.is_file() {
        return Err(not_regular.into());
    }
    if meta.len() > odp_profile::MAX_BYTES {
        return Err(format!(
            "{} bytes, more than a profile's {} (allowed: a file mrcache bench --odp-profile wrote)",
            meta.len(),
            odp_profile::MAX_BYTES
        ));
    }
    let mut bytes = Vec::new();
    file.take(odp_profile::MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > odp_profile::MAX_BYTES {
        return Err(format!("more than {} bytes", odp_profile::MAX_BYTES));
    }
    let text = String::from_utf8(bytes).map_err(|_| "not text (UTF-8)".to_string())?;
    OdpProfile::parse(&text).map_err(|e| format!("not an on-demand profile: {e}"))
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
            ("MRCACHE_ODP", "implicit"),
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
