//! `mrcache`: the launcher. `mrcache run -- PROGRAM ARGS` runs PROGRAM with libmrcache.so
//! preloaded (keeping any LD_PRELOAD already set); `mrcache info` says what the library
//! would do here; `mrcache stats FILES...` aggregates the JSON statistics of a job's ranks.

#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

mod bench;

use clap::{ArgAction, Parser, Subcommand};
use mrcache::config::{self};
use mrcache::stats::{Counter, Report};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod generate;
mod info;
mod manual;

use info::{info, self_test};

#[derive(Parser)]
#[command(
    name = "mrcache",
    version,
    about = "A transparent memory-registration cache for RDMA verbs applications"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

// Parsed once; the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Run PROGRAM with libmrcache.so preloaded; the exit status is PROGRAM's.
    Run {
        /// MRCACHE_LOG: off, error, warn, info, debug, trace
        #[arg(long, value_name = "LEVEL")]
        log: Option<String>,
        /// MRCACHE_LOG_FILE (%p = pid, %h = host)
        #[arg(long, value_name = "PATH")]
        log_file: Option<String>,
        /// MRCACHE_MAX_BYTES (e.g. 4G, 512M, unlimited)
        #[arg(long, value_name = "SIZE")]
        max_bytes: Option<String>,
        /// MRCACHE_MAX_ENTRIES
        #[arg(long, value_name = "N")]
        max_entries: Option<String>,
        /// MRCACHE_STATS: 0, 1 or json
        #[arg(long, value_name = "MODE")]
        stats: Option<String>,
        /// MRCACHE_STATS_FILE (%p = pid, %h = host)
        #[arg(long, value_name = "PATH")]
        stats_file: Option<String>,
        /// MRCACHE_MONITOR: patch, symbols, none
        #[arg(long, value_name = "MONITOR")]
        monitor: Option<String>,
        /// MRCACHE_FORK: auto, keep, flush
        #[arg(long, value_name = "MODE")]
        fork: Option<String>,
        /// The library to preload (default: next to this program, or ../lib, or MRCACHE_LIB)
        #[arg(long, value_name = "PATH")]
        lib: Option<PathBuf>,
        /// The program and its arguments
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        program: Vec<OsString>,
    },
    /// Print the version, the effective configuration and where each value comes from, the
    /// libibverbs found, the fork mode that would be chosen and what each monitor covers.
    Info {
        /// The library to inspect (as for run)
        #[arg(long, value_name = "PATH")]
        lib: Option<PathBuf>,
    },
    /// Aggregate MRCACHE_STATS=json files (one JSON object per process) into a table.
    Stats {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Will the cache help here? Measure ibv_reg_mr + ibv_dereg_mr by libibverbs alone and
    /// through the cache on this device, local and remote, and what the default would do;
    /// where the device pages on demand, also on-demand registration and its first write.
    Bench {
        /// The RDMA device (default: the first with an active port)
        // Taken as often as given, dash-led values too: the bench checks them (one line).
        #[arg(long, value_name = "NAME", action = ArgAction::Append, allow_hyphen_values = true)]
        device: Vec<String>,
        /// Registration sizes, comma-separated (binary multiples: k, m, g; at most 1g)
        /// [default: 4k,64k,1m,16m,64m]
        #[arg(long, value_name = "SIZES", action = ArgAction::Append, allow_hyphen_values = true)]
        sizes: Vec<String>,
        /// At most this many seconds per size [default: 1]
        #[arg(long, value_name = "N", action = ArgAction::Append, allow_hyphen_values = true)]
        seconds: Vec<String>,
        /// Print the results as one JSON object
        #[arg(long)]
        json: bool,
        /// Write the device's on-demand profile (for MRCACHE_ODP_PROFILE) to FILE; fails,
        /// writing nothing, where the device offers no on-demand paging
        #[arg(long, value_name = "FILE", action = ArgAction::Append, allow_hyphen_values = true,
              value_parser = clap::builder::OsStringValueParser::new())]
        odp_profile: Vec<OsString>,
        /// The library to preload (as for run)
        #[arg(long, value_name = "PATH")]
        lib: Option<PathBuf>,
    },
    /// Print the path of libmrcache.so.
    Lib,
    #[command(hide = true, name = "__selftest")]
    SelfTest,
    /// Write the manual pages and shell completions into DIR (src/generate.rs).
    #[command(hide = true, name = "__generate")]
    Generate { dir: PathBuf },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Run {
            log,
            log_file,
            max_bytes,
            max_entries,
            stats,
            stats_file,
            monitor,
            fork,
            lib,
            program,
        } => {
            let env = [
                ("MRCACHE_LOG", log),
                ("MRCACHE_LOG_FILE", log_file),
                ("MRCACHE_MAX_BYTES", max_bytes),
                ("MRCACHE_MAX_ENTRIES", max_entries),
                ("MRCACHE_STATS", stats),
                ("MRCACHE_STATS_FILE", stats_file),
                ("MRCACHE_MONITOR", monitor),
                ("MRCACHE_FORK", fork),
            ];
            launch(lib, &env, &program)
        }
        Cmd::Info { lib } => info(lib),
        Cmd::Stats { files } => stats(&files),
        Cmd::Bench {
            device,
            sizes,
            seconds,
            json,
            odp_profile,
            lib,
        } => bench::run(bench::Options {
            device,
            sizes,
            seconds,
            json,
            odp_profile: odp_profile.into_iter().map(PathBuf::from).collect(),
            lib,
        }),
        Cmd::Lib => find_library(None).map(|p| {
            println!("{}", p.display());
            ExitCode::SUCCESS
        }),
        Cmd::SelfTest => self_test(),
        Cmd::Generate { dir } => generate::generate(&dir).map(|()| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|msg| {
        eprintln!("mrcache: {msg}");
        ExitCode::from(2)
    })
}

fn launch(
    lib: Option<PathBuf>,
    env: &[(&str, Option<String>)],
    program: &[OsString],
) -> Result<ExitCode, String> {
    let set: Vec<(&str, &str)> = env
        .iter()
        .filter_map(|(k, v)| Some((*k, v.as_deref()?)))
        .collect();
    // Catch a bad option here, with the same words the library would use.
    let (_, problems) = config::parse(set.iter().copied(), 0);
    if let Some(p) = problems.iter().find(|p| p.is_fatal()) {
        return Err(p
            .to_string()
            .trim_start_matches("mrcache: ")
            .replace("; the cache is off for this process", ""));
    }
    warn_inherited(&set);
    let lib = find_library(lib)?;
    let (prog, args) = program
        .split_first()
        .ok_or("run needs a program: mrcache run -- PROGRAM [ARGS...]")?;
    let mut cmd = Command::new(prog);
    cmd.args(args).env(
        "LD_PRELOAD",
        compose_preload(&lib, std::env::var_os("LD_PRELOAD")),
    );
    for (k, v) in set {
        cmd.env(k, v);
    }
    let err = cmd.exec();
    Err(format!("cannot run {}: {err}", Path::new(prog).display()))
}

/// A bad `MRCACHE_*` value inherited from the environment turns the cache off in the
/// program (the library says so at its first verbs call, if it makes one): say so now,
/// before the program starts, with the library's words. The program still runs, as it would
/// without the launcher. Variables the options set are checked as options instead.
fn warn_inherited(options: &[(&str, &str)]) {
    let inherited: Vec<(String, String)> = mrcache_vars()
        .filter(|(k, _)| !options.iter().any(|(o, _)| o == k))
        .collect();
    let (_, problems) = config::parse(inherited, config::physical_memory());
    for p in problems.iter().filter(|p| p.is_fatal()) {
        eprintln!("{p}");
    }
}

/// The `MRCACHE_*` variables in our environment. Not `env::vars`, which panics on any
/// variable that is not UTF-8 (another program's business); ours are read lossily, so a
/// non-UTF-8 value is reported as invalid.
fn mrcache_vars() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os().filter_map(|(k, v)| {
        let k = k.into_string().ok()?;
        k.starts_with("MRCACHE_")
            .then(|| (k, v.to_string_lossy().into_owned()))
    })
}

/// Prepend our library to an existing LD_PRELOAD so the user's own preloads still load,
/// without adding it twice: every entry whose file name is `libmrcache*.so*` is dropped
/// (another copy of the library, at another path, would hook every call twice).
fn compose_preload(lib: &Path, existing: Option<OsString>) -> OsString {
    let mut out = OsString::from(lib.as_os_str());
    if let Some(existing) = existing {
        let kept: Vec<&str> = existing
            .to_str()
            .unwrap_or_default()
            .split([' ', ':'])
            .filter(|p| !p.is_empty() && Path::new(p) != lib && !bench::is_libmrcache(p))
            .collect();
        if !kept.is_empty() {
            out.push(":");
            out.push(kept.join(":"));
        }
    }
    out
}

/// The library to preload: `--lib`, else `MRCACHE_LIB`, else the first good candidate next
/// to the launcher. A named path that is not libmrcache.so is an error naming where it came
/// from; a bad candidate in the search is skipped with one line saying why.
fn find_library(explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    let named = match explicit {
        Some(p) => Some(("--lib ", p)),
        None => std::env::var_os("MRCACHE_LIB").map(|p| ("MRCACHE_LIB=", PathBuf::from(p))),
    };
    if let Some((source, p)) = named {
        if p.as_os_str().is_empty() {
            let source = source.trim_end_matches(['=', ' ']);
            return Err(format!(
                "{source} is empty: give the path of libmrcache.so, or unset it to search next to the launcher"
            ));
        }
        return check_library(&p)
            .and_then(|()| std::fs::canonicalize(&p).map_err(|e| e.to_string()))
            .map_err(|why| format!("{source}{}: {why}", p.display()));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate myself: {e}"))?;
    let dir = exe.parent().ok_or("executable has no directory")?;
    // ../lib/<arch>-linux-gnu: the multiarch directory of a Debian package (ci/package).
    let multiarch = format!("../lib/{}-linux-gnu/libmrcache.so", std::env::consts::ARCH);
    for p in [
        dir.join("libmrcache.so"),
        dir.join("../lib/libmrcache.so"),
        dir.join("../lib/mrcache/libmrcache.so"),
        dir.join(multiarch),
    ] {
        if !p.exists() {
            continue;
        }
        match check_library(&p) {
            Ok(()) => return Ok(std::fs::canonicalize(&p).unwrap_or(p)),
            Err(why) => eprintln!("mrcache: skipped {}: {why}", p.display()),
        }
    }
    Err(format!(
        "libmrcache.so not found next to {} or in ../lib (or ../lib/mrcache, ../lib/<arch>-linux-gnu); build it (cargo build --release) or set MRCACHE_LIB",
        exe.display()
    ))
}

/// Why `path` is not libmrcache.so, if it is not: it must be an ELF64 little-endian shared
/// object for this machine whose dynamic symbols define `mrcache_version`. Read from the file
/// (section headers, .dynsym, .dynstr), never loaded: loading it would run its constructors.
fn check_library(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > 1 << 30 {
        return Err("over 1 GiB: not libmrcache.so".into());
    }
    let d = std::fs::read(path).map_err(|e| e.to_string())?;
    let bytes = |o: u64, n: usize| -> Option<&[u8]> {
        let o = usize::try_from(o).ok()?;
        d.get(o..o.checked_add(n)?)
    };
    let u16at = |o: u64| bytes(o, 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32at = |o: u64| bytes(o, 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()));
    let u64at = |o: u64| bytes(o, 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    let truncated = || "not an ELF shared object (truncated)".to_string();
    if d.len() < 64 || &d[..4] != b"\x7fELF" {
        return Err(if d.starts_with(b"\x7fELF") {
            truncated()
        } else {
            "not an ELF file".into()
        });
    }
    if d[4] != 2 || d[5] != 1 {
        return Err("not an ELF64 little-endian file".into());
    }
    let machine = match std::env::consts::ARCH {
        "x86_64" => Some(62),
        "aarch64" => Some(183),
        _ => None,
    };
    let (ty, mach) = (
        u16at(16).ok_or_else(truncated)?,
        u16at(18).ok_or_else(truncated)?,
    );
    if ty != 3 {
        return Err(format!("not a shared object (ELF type {ty})"));
    }
    if machine.is_some_and(|m| m != mach) {
        return Err(format!("built for another machine (ELF machine {mach})"));
    }
    let shoff = u64at(40).ok_or_else(truncated)?;
    let shentsize = u64::from(u16at(58).ok_or_else(truncated)?);
    let shnum = u64::from(u16at(60).ok_or_else(truncated)?);
    let section = |i: u64| shoff.checked_add(i.checked_mul(shentsize)?);
    for i in 0..shnum {
        let sh = section(i).ok_or_else(truncated)?;
        if u32at(sh + 4).ok_or_else(truncated)? != 11 {
            continue; // not SHT_DYNSYM
        }
        let (off, size) = (
            u64at(sh + 24).ok_or_else(truncated)?,
            u64at(sh + 32).ok_or_else(truncated)?,
        );
        let strs =
            section(u64::from(u32at(sh + 40).ok_or_else(truncated)?)).ok_or_else(truncated)?;
        let (soff, ssize) = (
            u64at(strs + 24).ok_or_else(truncated)?,
            u64at(strs + 32).ok_or_else(truncated)?,
        );
        let table = usize::try_from(ssize)
            .ok()
            .and_then(|n| bytes(soff, n))
            .ok_or_else(truncated)?;
        for sym in (0..size / 24).map(|k| off + k * 24) {
            let name = usize::try_from(u32at(sym).ok_or_else(truncated)?).unwrap_or(usize::MAX);
            let defined = u16at(sym + 6).ok_or_else(truncated)? != 0;
            let name = table.get(name..).unwrap_or_default();
            if defined && name.starts_with(b"mrcache_version\0") {
                return Ok(());
            }
        }
    }
    Err("does not export mrcache_version: not libmrcache.so".into())
}

fn stats(files: &[PathBuf]) -> Result<ExitCode, String> {
    let mut reports = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        reports.extend(Report::parse_lines(&text).map_err(|e| format!("{}: {e}", f.display()))?);
    }
    if reports.is_empty() {
        return Err("no statistics found (run with MRCACHE_STATS=json)".into());
    }
    println!(
        "{:<16} {:>8} {:>10} {:>8} {:>8} {:>6} {:>11} {:>8} {:>10} {:>10}",
        "host",
        "pid",
        "hits",
        "misses",
        "uncached",
        "hit%",
        "invalidated",
        "peak",
        "peak MiB",
        "reg ms"
    );
    let row = |r: &Report, pid: String| {
        println!(
            "{:<16} {:>8} {:>10} {:>8} {:>8} {:>5.1}% {:>11} {:>8} {:>10.1} {:>10.1}",
            r.host,
            pid,
            r.hits_total(),
            r[Counter::Misses],
            r[Counter::Uncached],
            r.hit_rate() * 100.0,
            r[Counter::Invalidated],
            r[Counter::PeakEntries],
            r[Counter::PeakBytes] as f64 / (1 << 20) as f64,
            r[Counter::RegistrationNs] as f64 / 1e6
        );
    };
    for r in &reports {
        row(r, r.pid.to_string());
    }
    let t = Report::total(&reports);
    row(&t, format!("{} procs", reports.len()));
    println!(
        "remote keys: MRCACHE_REMOTE={}; {} granted through windows, {} revoked at ibv_dereg_mr",
        t.remote_keys,
        t[Counter::RemoteGrants],
        t[Counter::RemoteRevokes]
    );
    println!(
        "admission: {} passed through (caching did not pay), {} (scan), {} cached trials",
        t[Counter::AdmissionPassedCost],
        t[Counter::AdmissionPassedScan],
        t[Counter::AdmissionTrials]
    );
    for r in &reports {
        for a in &r.admission {
            println!(
                "  {} {}: {} {}: {} (miss {} ns, cached round {} ns {}, eviction {} ns; {} passed, {} trials)",
                r.host,
                r.pid,
                a.access,
                a.class,
                a.verdict,
                a.miss_ns,
                a.cached_ns,
                a.cached_from,
                a.evict_ns,
                a.passed,
                a.trials
            );
        }
    }
    if t[Counter::DoubleDeregs] + t[Counter::VerifyMismatches] + t[Counter::TraceRecordsDropped] > 0
    {
        println!(
            "attention: {} double deregistrations, {} verify mismatches, {} trace records dropped",
            t[Counter::DoubleDeregs],
            t[Counter::VerifyMismatches],
            t[Counter::TraceRecordsDropped]
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn bytes_text(bytes: u64) -> String {
    if bytes == u64::MAX {
        "unlimited".to_string()
    } else {
        bytes.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dash-led value or a repeated option of `bench` reaches the bench's own checks,
    /// which answer one `mrcache:` line (clap's answer was its usage text, several lines).
    #[test]
    fn bench_options_dash_led_or_repeated_get_one_line() {
        let plan = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["mrcache", "bench"], args].concat())
                .map_err(|e| format!("clap: {e}"))?;
            let Cmd::Bench {
                device,
                sizes,
                seconds,
                json,
                odp_profile,
                lib,
            } = cli.command
            else {
                panic!("not bench")
            };
            bench::plan(&bench::Options {
                device,
                sizes,
                seconds,
                json,
                odp_profile: odp_profile.into_iter().map(PathBuf::from).collect(),
                lib,
            })
        };
        for (args, want) in [
            (
                &["--seconds", "-1"][..],
                "--seconds \"-1\" is not valid; allowed: ",
            ),
            (&["--sizes", "-4k"], "--sizes \"-4k\" is not valid"),
            (
                &["--sizes", "4k", "--sizes", "8k"],
                "--sizes is given 2 times; allowed: once",
            ),
            (
                &["--seconds", "1", "--seconds", "2"],
                "--seconds is given 2 times",
            ),
            (
                &["--device", "a", "--device", "b"],
                "--device is given 2 times",
            ),
            (
                &["--odp-profile", "a", "--odp-profile", "b"],
                "--odp-profile is given 2 times",
            ),
            (&["--odp-profile", ""], "--odp-profile \"\" is not valid"),
        ] {
            let e = plan(args).err().unwrap_or_default();
            assert!(e.starts_with(want) && !e.contains('\n'), "{args:?}: {e:?}");
        }
        let p = plan(&[]).unwrap();
        assert_eq!((p.sizes.len(), p.seconds, p.device), (5, 1.0, None));
        let p = plan(&["--sizes", "4k,1m", "--seconds", "0.5", "--device", "rxe0"]).unwrap();
        assert_eq!((p.sizes, p.seconds), (vec![4096, 1 << 20], 0.5));
        assert_eq!(p.odp_profile, None);
        let p = plan(&["--odp-profile", "-p"]).unwrap();
        assert_eq!(p.odp_profile, Some(PathBuf::from("-p")));
    }

    #[test]
    fn preload_is_prepended_and_not_duplicated() {
        let lib = Path::new("/opt/mrcache/lib/libmrcache.so");
        assert_eq!(
            compose_preload(lib, None),
            OsString::from("/opt/mrcache/lib/libmrcache.so")
        );
        assert_eq!(
            compose_preload(lib, Some("libjemalloc.so.2 /x/y.so".into())),
            OsString::from("/opt/mrcache/lib/libmrcache.so:libjemalloc.so.2:/x/y.so")
        );
        assert_eq!(
            compose_preload(lib, Some("/opt/mrcache/lib/libmrcache.so:a.so".into())),
            OsString::from("/opt/mrcache/lib/libmrcache.so:a.so")
        );
        // Another copy of the library, at any path or under any version suffix, is dropped.
        assert_eq!(
            compose_preload(
                lib,
                Some("/tmp/cp2/libmrcache.so a.so:libmrcache.so.1:/x/libmrcache-old.so".into())
            ),
            OsString::from("/opt/mrcache/lib/libmrcache.so:a.so")
        );
        assert_eq!(
            compose_preload(lib, Some("/x/libmrcachex.txt:/y/mylibmrcache.so".into())),
            OsString::from("/opt/mrcache/lib/libmrcache.so:/x/libmrcachex.txt:/y/mylibmrcache.so")
        );
    }
}
