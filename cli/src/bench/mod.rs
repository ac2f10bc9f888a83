//! `mrcache bench`: will the cache help on this device? Measures, in one process, on real
//! memory through the real provider, `ibv_reg_mr` + `ibv_dereg_mr` by libibverbs alone and
//! through the cache (hit and release, a miss, the window bind and unbind of
//! `MRCACHE_REMOTE=revoke`), local and remote, in alternating rounds, and says what the
//! default (the cost-aware admission) would do for each size on these figures.
//!
//! How it is one process (docs/design/bench.md): the launcher re-executes
//! itself with libmrcache.so preloaded; there the global libibverbs answers `ibv_reg_mr`
//! with the cache's hook, and a second copy of libibverbs loaded with `dlmopen` into a
//! link-map namespace of its own, which no preload reaches, is libibverbs alone.

mod admission;
mod control;
mod measure;
mod odp;
mod preload;
mod proc;
mod report;
mod timing;
mod units;
mod verbs;

use mrcache::node::Memlock;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The command line of `mrcache bench`, as given (validated here, with one line per error).
/// Each option as often as it was given (clap takes them all, dash-led values included, so
/// that a repeated or a dash-led one gets the bench's one line, not clap's usage text).
pub struct Options {
    pub device: Vec<String>,
    pub sizes: Vec<String>,
    pub seconds: Vec<String>,
    pub json: bool,
    pub odp_profile: Vec<PathBuf>,
    pub lib: Option<PathBuf>,
}

/// The sizes of a run without --sizes.
pub const DEFAULT_SIZES: &str = "4k,64k,1m,16m,64m";

/// Set in the re-executed bench so it never executes itself again.
/// Not an `MRCACHE_*` name: the library reports those it does not know.
pub const CHILD_MARK: &str = "_MRCACHE_BENCH_CHILD";
/// Its value when the bench set `MRCACHE_ADMIT=always` itself.
pub const ADMIT_SET: &str = "admit";
/// Its value in the control process (libibverbs without the preload, `control`).
pub const CONTROL_MARK: &str = "control";
/// Its value in the co-process of the on-demand rows' cached figures (`MRCACHE_ODP=on`,
/// `odp::serve_cached`).
pub const ON_DEMAND_MARK: &str = "on-demand";
/// The largest size the bench registers (it pins about twice that at once).
pub const MAX_SIZE: usize = 1 << 30;
const MAX_SIZES: usize = 16;
/// The hit-path figures' regions: this many 4 KiB buffers, a gap page apart.
pub const HIT_REGIONS: usize = 1000;
pub const HIT_REGION_BYTES: usize = 4096;
const PAGE: usize = 4096;

/// The device's max_mw, or 0 with `MRCACHE_TEST_NO_MW=1` (tests only: a device without
/// memory windows, as the library then takes it; the test guest's kernel has no siw).
pub fn max_mw_seen(max_mw: i32) -> i32 {
    if std::env::var_os("MRCACHE_TEST_NO_MW").is_some_and(|v| v == "1") {
        0
    } else {
        max_mw
    }
}

/// What the bench runs with, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub device: Option<String>,
    pub sizes: Vec<usize>,
    pub seconds: f64,
    pub json: bool,
    /// Where to write the on-demand profile (`--odp-profile`).
    pub odp_profile: Option<PathBuf>,
}

/// `4k,64k,1m,16m,64m`: sizes of 1 byte to 1 GiB, binary multiples (k, m, g).
pub fn parse_sizes(v: &str) -> Result<Vec<usize>, String> {
    let bad = |what: &str| {
        format!(
            "--sizes \"{v}\" is not valid ({what}); allowed: a comma-separated list of 1 to {MAX_SIZES} sizes from 1 to 1g, e.g. 4k,64k,1m,16m,64m"
        )
    };
    let mut sizes = Vec::new();
    for part in v.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(bad("an empty size"));
        }
        let b = mrcache::config::parse_bytes(part, 0)
            .filter(|&b| b != u64::MAX && !part.eq_ignore_ascii_case("auto"))
            .ok_or_else(|| bad(&format!("\"{part}\" is not a size")))?;
        if b > MAX_SIZE as u64 {
            return Err(bad(&format!("{part} is larger than 1g")));
        }
        if sizes.contains(&(b as usize)) {
            return Err(bad(&format!("{part} is given twice")));
        }
        sizes.push(b as usize);
    }
    if sizes.len() > MAX_SIZES {
        return Err(bad(&format!("{} sizes", sizes.len())));
    }
    Ok(sizes)
}

/// Seconds per size: a number from 0.1 to 600.
pub fn parse_seconds(v: &str) -> Result<f64, String> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && (0.1..=600.0).contains(s))
        .ok_or_else(|| format!("--seconds \"{v}\" is not valid; allowed: a number of seconds per size from 0.1 to 600"))
}

/// The one value of an option given at most once (`default` when not given).
fn once<'a>(
    name: &str,
    given: &'a [String],
    default: Option<&'a str>,
) -> Result<Option<&'a str>, String> {
    match given {
        [] => Ok(default),
        [v] => Ok(Some(v)),
        _ => Err(format!(
            "--{name} is given {} times; allowed: once{}",
            given.len(),
            if name == "sizes" {
                " (several sizes go in one, comma-separated)"
            } else {
                ""
            }
        )),
    }
}

pub fn plan(o: &Options) -> Result<Plan, String> {
    let device = once("device", &o.device, None)?;
    let sizes = once("sizes", &o.sizes, Some(DEFAULT_SIZES))?.unwrap_or(DEFAULT_SIZES);
    let seconds = once("seconds", &o.seconds, Some("1"))?.unwrap_or("1");
    if let Some(d) = device
        && (d.is_empty() || d.len() > 64 || !d.chars().all(|c| c.is_ascii_graphic()))
    {
        return Err(format!(
            "--device \"{d}\" is not valid; allowed: an RDMA device name as ibv_devices lists it (e.g. mlx5_0, rxe0)"
        ));
    }
    let odp_profile = match &o.odp_profile[..] {
        [] => None,
        [p] if p.as_os_str().is_empty() => {
            return Err(
                "--odp-profile \"\" is not valid; allowed: the path of the file to write".into(),
            );
        }
        [p] => Some(p.clone()),
        many => {
            return Err(format!(
                "--odp-profile is given {} times; allowed: once",
                many.len()
            ));
        }
    };
    Ok(Plan {
        device: device.map(str::to_string),
        sizes: parse_sizes(sizes)?,
        seconds: parse_seconds(seconds)?,
        json: o.json,
        odp_profile,
    })
}

/// `--odp-profile FILE`, refused before measuring where it could not be written: a
/// directory, in a directory that does not exist, or one where the temporary file the
/// profile is written under cannot be created.
pub fn check_profile_dir(path: &std::path::Path) -> Result<(), String> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !dir.is_dir() {
        return Err(format!(
            "--odp-profile {}: {} is not a directory; allowed: a file in an existing directory",
            path.display(),
            dir.display()
        ));
    }
    if path.is_dir() || path.as_os_str().to_string_lossy().ends_with('/') {
        return Err(format!(
            "--odp-profile {}: a directory; allowed: a file in an existing directory",
            path.display()
        ));
    }
    // The file is written under a temporary name beside it and renamed: that must work.
    let tmp = odp::profile::temporary(path);
    odp::profile::create_new(&tmp)
        .and_then(|_| std::fs::remove_file(&tmp))
        .map_err(|e| {
            format!(
                "--odp-profile {}: cannot write in {}: {e}",
                path.display(),
                dir.display()
            )
        })
}

fn page_round(n: usize) -> usize {
    n.div_ceil(PAGE) * PAGE
}

/// The bytes the bench may have pinned at once, charged against `RLIMIT_MEMLOCK`: a size's
/// cached entry plus one more registration of the same size (libibverbs alone, or a miss),
/// and the cache's byte cap is 3/4 of the limit without CAP_IPC_LOCK, so it must hold two
/// entries of the largest size; one more of the largest whose memory went away but which
/// is deregistered only at the process's next registration through the cache (the bench
/// starts no thread, so the cache drains inline, not on a thread of its own, and libibverbs
/// alone registers in between); and the hit-path regions.
pub fn memlock_needed(sizes: &[usize]) -> u64 {
    let largest = sizes.iter().copied().map(page_round).max().unwrap_or(0) as u64;
    let hit = (HIT_REGIONS * HIT_REGION_BYTES) as u64;
    // 2 entries under a 3/4 cap (8/3 of the largest) and one awaiting its deregistration;
    // rounded up to whole MiB.
    let bytes = (largest * 8).div_ceil(3) + largest + hit + (1 << 20);
    bytes.div_ceil(1 << 20) << 20
}

/// Refuse to start when `RLIMIT_MEMLOCK` would fail the largest size's registrations.
pub fn check_memlock(sizes: &[usize], memlock: Memlock) -> Result<(), String> {
    let need = memlock_needed(sizes);
    match memlock {
        Memlock::Limit(have) if have < need => Err(format!(
            "RLIMIT_MEMLOCK is {have} bytes (ulimit -l {}); mrcache bench --sizes up to {} needs {need} bytes (ulimit -l {}): raise it or give smaller --sizes",
            have / 1024,
            units::size_text(sizes.iter().copied().max().unwrap_or(0)),
            need / 1024
        )),
        _ => Ok(()),
    }
}

/// The memory the bench maps and populates at once: a size's buffer, the misses' memory and
/// the control co-process's buffer (three times the largest size), the hit-path regions (a
/// gap page each), and a margin.
pub fn memory_needed(sizes: &[usize]) -> u64 {
    let largest = sizes.iter().copied().map(page_round).max().unwrap_or(0) as u64;
    3 * largest + (2 * HIT_REGIONS * HIT_REGION_BYTES) as u64 + MEMORY_MARGIN
}
const MEMORY_MARGIN: u64 = 64 << 20;

/// Refuse to start when what the bench maps exceeds 3/4 of `MemAvailable` (populating
/// more would invite the OOM killer); unknown `MemAvailable`: no check.
pub fn check_memory(sizes: &[usize], available: Option<u64>) -> Result<(), String> {
    let need = memory_needed(sizes);
    match available {
        Some(have) if need > have / 4 * 3 => Err(format!(
            "bench --sizes up to {} maps {need} bytes (three times the largest size, and {} MiB more), more than 3/4 of MemAvailable ({have} bytes): give smaller --sizes or free memory",
            units::size_text(sizes.iter().copied().max().unwrap_or(0)),
            (need - 3 * sizes.iter().copied().map(page_round).max().unwrap_or(0) as u64) >> 20
        )),
        _ => Ok(()),
    }
}

/// A path whose file name is `libmrcache*.so*`: a copy of the library.
pub fn is_libmrcache(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .and_then(|name| name.strip_prefix("libmrcache"))
        .is_some_and(|rest| rest.contains(".so"))
}

/// The distinct copies of the library mapped, from /proc/self/maps' text.
pub fn mapped_copies(maps: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in maps.lines() {
        // address perms offset dev inode path
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        if is_libmrcache(path) && !out.iter().any(|p| p == path) {
            out.push(path.to_string());
        }
    }
    out
}

/// The inherited `MRCACHE_*` variables the library reads: a fatal problem or
/// `MRCACHE_ENABLE=0` is an error (the bench measures the cache); else the names of those
/// set, which the benchmark process runs without (its figures are the default's).
pub fn inherited(vars: &[(String, String)]) -> Result<Vec<String>, String> {
    // The profile is the bench's output (--odp-profile), never its input: a file not
    // written yet is no problem here.
    let read: Vec<(String, String)> = vars
        .iter()
        .filter(|(k, _)| mrcache::config::VARIABLES.iter().any(|v| v.name == k))
        .filter(|(k, _)| k != "MRCACHE_ODP_PROFILE")
        .cloned()
        .collect();
    let (cfg, problems) = mrcache::config::parse(read.iter().cloned(), 0);
    if let Some(p) = problems.iter().find(|p| p.is_fatal()) {
        return Err(format!(
            "{}; mrcache bench measures the default configuration: unset it",
            p.to_string()
                .trim_start_matches("mrcache: ")
                .replace("; the cache is off for this process", "")
        ));
    }
    if !cfg.enabled {
        return Err(
            "MRCACHE_ENABLE turns the cache off in this environment: mrcache bench measures the cache; unset MRCACHE_ENABLE".into(),
        );
    }
    Ok(read.into_iter().map(|(k, _)| k).collect())
}

fn mrcache_vars() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            k.starts_with("MRCACHE_")
                .then(|| (k, v.to_string_lossy().into_owned()))
        })
        .collect()
}

pub fn run(o: Options) -> Result<ExitCode, String> {
    let plan = plan(&o)?;
    if let Some(p) = &plan.odp_profile {
        check_profile_dir(p)?;
    }
    check_memlock(&plan.sizes, Memlock::current())?;
    check_memory(&plan.sizes, proc::mem_available())?;
    // Always measured in processes of our own making: the measuring process (preloaded,
    // the default configuration with MRCACHE_ADMIT=always), which starts the control
    // (libibverbs without the preload) as its co-process.
    let mark = std::env::var_os(CHILD_MARK);
    if mark.is_none() {
        let stripped = inherited(&mrcache_vars())?;
        let lib = super::find_library(o.lib)?;
        return reexec(&lib, &stripped);
    }
    if mark.as_ref().is_some_and(|m| m == CONTROL_MARK) {
        if preload::preloaded() {
            return Err(preloaded_in_control(
                &std::env::var("LD_PRELOAD").unwrap_or_default(),
            ));
        }
        control::serve(&plan)?;
        return Ok(ExitCode::SUCCESS);
    }
    if mark.as_ref().is_some_and(|m| m == ON_DEMAND_MARK) {
        if !preload::preloaded() {
            return Err(
                "libmrcache.so did not load in the MRCACHE_ODP=on co-process of mrcache bench"
                    .into(),
            );
        }
        odp::serve_cached(&plan)?;
        return Ok(ExitCode::SUCCESS);
    }
    let copies = std::fs::read_to_string("/proc/self/maps")
        .map(|m| mapped_copies(&m))
        .unwrap_or_default();
    if copies.len() > 1 {
        return Err(format!(
            "{} copies of libmrcache are loaded ({}); the benchmark process needs exactly one: remove the others from LD_PRELOAD",
            copies.len(),
            copies.join(", ")
        ));
    }
    if !preload::preloaded() {
        return Err("libmrcache.so did not load in the benchmark process (LD_PRELOAD); check it with mrcache info".into());
    }
    let result = measure::run(&plan, || {
        control::Peer::start(preload_without_us(std::env::var_os("LD_PRELOAD")))
    })?;
    if plan.json {
        println!("{}", report::json(&result));
    } else {
        print!("{}", report::table(&result));
    }
    if let Some(path) = &plan.odp_profile {
        odp::profile::write(&result.on_demand, path)?;
        eprintln!("mrcache: on-demand profile written to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `LD_PRELOAD` without any copy of libmrcache (`None`: nothing left).
fn preload_without_us(existing: Option<OsString>) -> Option<OsString> {
    let existing = existing?;
    let kept: Vec<&str> = existing
        .to_str()
        .unwrap_or_default()
        .split([' ', ':'])
        .filter(|p| !p.is_empty() && !is_libmrcache(p) && !links_to_libmrcache(p))
        .collect();
    (!kept.is_empty()).then(|| OsString::from(kept.join(":")))
}

/// An `LD_PRELOAD` entry that is a symbolic link to a `libmrcache*.so*` file.
fn links_to_libmrcache(p: &str) -> bool {
    std::fs::canonicalize(p).is_ok_and(|c| c.to_str().is_some_and(is_libmrcache))
}

/// The control process found libmrcache loaded although its `LD_PRELOAD` has no
/// `libmrcache*.so*` entry (a copy or link under another name): name the entries to remove.
pub fn preloaded_in_control(preload: &str) -> String {
    let entries: Vec<&str> = preload
        .split([' ', ':'])
        .filter(|p| !p.is_empty())
        .collect();
    let ours: Vec<&str> = entries
        .iter()
        .copied()
        .filter(|p| is_libmrcache(p) || links_to_libmrcache(p))
        .collect();
    if let [one] = ours.as_slice() {
        return format!(
            "the control process of mrcache bench (libibverbs without the preload) has libmrcache loaded from LD_PRELOAD entry {one}: remove {one} from LD_PRELOAD"
        );
    }
    format!(
        "the control process of mrcache bench (libibverbs without the preload) has libmrcache loaded through LD_PRELOAD={}: one of these is the library under another name; remove it from LD_PRELOAD",
        if entries.is_empty() {
            "(empty)".to_string()
        } else {
            entries.join(":")
        }
    )
}

/// Run this same command again with libmrcache.so preloaded (the exit status is its own),
/// in the default configuration: without the inherited variables `strip` (said on one
/// stderr line), with MRCACHE_ADMIT=always.
fn reexec(lib: &std::path::Path, strip: &[String]) -> Result<ExitCode, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate myself: {e}"))?;
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut cmd = Command::new(&exe);
    // Nothing of the cache's own at exit in the middle of the table (not worth a line).
    let said: Vec<&str> = strip
        .iter()
        .map(String::as_str)
        .filter(|k| !matches!(*k, "MRCACHE_STATS" | "MRCACHE_STATS_FILE"))
        .collect();
    if !said.is_empty() {
        eprintln!(
            "mrcache: bench measures the default configuration; not applied: {}",
            said.join(", ")
        );
    }
    for k in strip {
        cmd.env_remove(k);
    }
    // The profile is the bench's output, never its input (a file not written yet, or one
    // the default configuration does not have).
    cmd.env_remove("MRCACHE_ODP_PROFILE");
    // Every size cached, so that "cached" is the cache's hit; the default's choice is then
    // computed from the figures (admission's model).
    cmd.env("MRCACHE_ADMIT", "always")
        .args(args)
        .env(
            "LD_PRELOAD",
            super::compose_preload(lib, std::env::var_os("LD_PRELOAD")),
        )
        .env(CHILD_MARK, ADMIT_SET)
        .env_remove("MRCACHE_STATS")
        .env_remove("MRCACHE_STATS_FILE");
    let err = cmd.exec();
    Err(format!("cannot run {}: {err}", exe.display()))
}

#[cfg(test)]
mod tests;
