//! `mrcache`: the launcher. `mrcache run -- PROGRAM ARGS` runs PROGRAM with libmrcache.so
//! preloaded (keeping any LD_PRELOAD already set); `mrcache info` says what the library
//! would do here; `mrcache stats FILES...` aggregates the JSON statistics of a job's ranks.

mod bench;

use clap::{Parser, Subcommand};
use mrcache::config::{self, VARIABLES};
use mrcache::stats::{Counter, Report};
use std::ffi::{CString, OsString, c_void};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod generate;

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
    /// through the cache on this device, local and remote, and what the default would do.
    Bench {
        /// The RDMA device (default: the first with an active port)
        #[arg(long, value_name = "NAME")]
        device: Option<String>,
        /// Registration sizes, comma-separated (binary multiples: k, m, g; at most 1g)
        #[arg(long, value_name = "SIZES", default_value = "4k,64k,1m,16m,64m")]
        sizes: String,
        /// At most this many seconds per size
        #[arg(long, value_name = "N", default_value = "1")]
        seconds: String,
        /// Print the results as one JSON object
        #[arg(long)]
        json: bool,
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
            lib,
        } => bench::run(bench::Options {
            device,
            sizes,
            seconds,
            json,
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

/// libibverbs, opened privately (this launcher is not the preloaded program).
struct Verbs(*mut c_void);

impl Verbs {
    fn open() -> Option<Verbs> {
        // SAFETY: dlopen with a valid name.
        let h = unsafe {
            libc::dlopen(
                c"libibverbs.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            )
        };
        (!h.is_null()).then_some(Verbs(h))
    }

    fn sym(&self, name: &str, version: &str) -> *mut c_void {
        let (n, v) = (
            CString::new(name).unwrap_or_default(),
            CString::new(version).unwrap_or_default(),
        );
        // SAFETY: dlvsym on a live handle.
        unsafe { libc::dlvsym(self.0, n.as_ptr(), v.as_ptr()) }
    }

    /// The file it was loaded from (its name carries rdma-core's version).
    fn path(&self) -> Option<String> {
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        maps.lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("libibverbs.so"))
            .map(str::to_string)
    }
}

fn info(lib: Option<PathBuf>) -> Result<ExitCode, String> {
    println!("mrcache {}", mrcache::VERSION);
    let lib = find_library(lib);
    match &lib {
        Ok(p) => println!("library: {}", p.display()),
        Err(e) => println!("library: not found ({e})"),
    }

    let cfg = info_configuration();
    info_verbs(&cfg);
    info_monitors(&lib)?;
    Ok(ExitCode::SUCCESS)
}

/// The variables, each with its value and where it came from (a bad value marked in its
/// row), and the configuration they make.
fn info_configuration() -> config::Config {
    println!("\nconfiguration (MRCACHE_* variables):");
    let vars: Vec<(String, String)> = mrcache_vars().collect();
    // The whole environment: a launcher's node-local rank count divides the default cap.
    let all = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())));
    let (cfg, problems) = config::parse_on(
        all,
        config::physical_memory(),
        mrcache::node::Memlock::current(),
    );
    for v in VARIABLES {
        match vars.iter().find(|(k, _)| k == v.name) {
            Some((_, value)) if problems.iter().any(|p| p.is_fatal() && p.name() == v.name) => {
                println!(
                    "  {:<24} {:<28} (environment) INVALID, allowed: {}",
                    v.name, value, v.allowed
                )
            }
            Some((_, value)) => println!("  {:<24} {:<28} (environment)", v.name, value),
            None => println!("  {:<24} {:<28} (default)", v.name, v.default),
        }
    }
    println!(
        "  effective: cache {}, max {} entries, max {} bytes, shadows {}, monitor {}, fork {}, remote keys {}",
        if cfg.enabled { "on" } else { "OFF" },
        if cfg.max_entries == usize::MAX {
            "unlimited".to_string()
        } else {
            cfg.max_entries.to_string()
        },
        bytes_text(cfg.max_bytes),
        if cfg.shadow { "on" } else { "off" },
        cfg.monitor.as_str(),
        cfg.fork.as_str(),
        cfg.remote.as_str()
    );
    println!(
        "  max bytes: {} ({})",
        bytes_text(cfg.max_bytes),
        cfg.max_bytes_why
    );
    match cfg.local_ranks {
        Some(r) => println!("  ranks on this node: {} ({})", r.count, r.from),
        None => println!(
            "  ranks on this node: not set by a launcher (read: {})",
            mrcache::node::LAUNCHER_VARIABLES.join(", ")
        ),
    }
    println!("  RLIMIT_MEMLOCK: {}", cfg.memlock);
    println!(
        "  remote keys: MRCACHE_REMOTE={}: {}",
        cfg.remote.as_str(),
        match cfg.remote {
            config::RemoteMode::Revoke => {
                "registrations with remote access are cached; each gets a memory window key bound at registration and unbound before ibv_dereg_mr returns (devices without type-1 windows: passed to libibverbs uncached)"
            }
            config::RemoteMode::Keep => {
                "a cached registration's rkey stays valid after ibv_dereg_mr, until the entry is evicted or its memory unmapped: a peer holding it can write into memory the app freed (trusted peers only)"
            }
            config::RemoteMode::Bypass => {
                "registrations with remote access are passed to libibverbs uncached"
            }
        }
    );
    println!(
        "  admission: MRCACHE_ADMIT={}: {}",
        cfg.admit.as_str(),
        match cfg.admit {
            config::Admit::Auto => {
                "per size class (power of two of the length) and access kind (local; remote under revoke), cached only while its measured cached round (hit + release; with window bind + unbind for remote) costs less than the provider's measured reg + dereg, else passed through (a cached trial after 32 misses, backing off to 1024, re-measures); when full, a miss evicts only if seen more often lately than the victim was used (scan resistance). Each run's decisions and figures: MRCACHE_STATS=1 (summary) or json (`admission`)"
            }
            config::Admit::Always => {
                "every registration is cached, the least recently used idle entry evicted (figures still measured and reported)"
            }
        }
    );
    for p in &problems {
        println!("  {p}");
    }

    cfg
}

/// The libibverbs found, its symbols, its devices, and the fork policy that would apply.
fn info_verbs(cfg: &config::Config) {
    println!("\nlibibverbs:");
    match Verbs::open() {
        None => println!(
            "  not found (apt-get install libibverbs1 ibverbs-providers); nothing to cache"
        ),
        Some(v) => {
            println!("  {}", v.path().unwrap_or_else(|| "libibverbs.so.1".into()));
            let syms = [
                ("ibv_reg_mr", "IBVERBS_1.1"),
                ("ibv_reg_mr_iova", "IBVERBS_1.7"),
                ("ibv_reg_mr_iova2", "IBVERBS_1.8"),
                ("ibv_dereg_mr", "IBVERBS_1.1"),
                ("ibv_rereg_mr", "IBVERBS_1.1"),
                ("ibv_reg_dmabuf_mr", "IBVERBS_1.12"),
                ("ibv_dealloc_pd", "IBVERBS_1.1"),
                ("ibv_close_device", "IBVERBS_1.1"),
                ("ibv_fork_init", "IBVERBS_1.1"),
                ("ibv_is_fork_initialized", "IBVERBS_1.13"),
                ("ibv_dontfork_range", "IBVERBS_1.1"),
            ];
            let found: Vec<String> = syms
                .iter()
                .map(|(n, ver)| {
                    format!(
                        "{n}@{ver}: {}",
                        if v.sym(n, ver).is_null() {
                            "MISSING"
                        } else {
                            "found"
                        }
                    )
                })
                .collect();
            for f in found {
                println!("  {f}");
            }
            let get = v.sym("ibv_get_device_list", "IBVERBS_1.1");
            if !get.is_null() {
                // SAFETY: ibv_get_device_list(int *) -> struct ibv_device **, freed below.
                let get: unsafe extern "C" fn(*mut i32) -> *mut *mut c_void =
                    unsafe { std::mem::transmute(get) };
                let mut n = 0;
                // SAFETY: as above.
                let list = unsafe { get(&mut n) };
                println!("  RDMA devices: {n}");
                let free = v.sym("ibv_free_device_list", "IBVERBS_1.1");
                if !list.is_null() && !free.is_null() {
                    // SAFETY: ibv_free_device_list(struct ibv_device **).
                    let free: unsafe extern "C" fn(*mut *mut c_void) =
                        unsafe { std::mem::transmute(free) };
                    // SAFETY: as above.
                    unsafe { free(list) };
                }
            }
            let f = v.sym("ibv_is_fork_initialized", "IBVERBS_1.13");
            let copy_on_fork = if f.is_null() {
                None
            } else {
                // SAFETY: ibv_is_fork_initialized(void) -> enum.
                let f: unsafe extern "C" fn() -> i32 = unsafe { std::mem::transmute(f) };
                // SAFETY: as above.
                Some(unsafe { f() } == 2)
            };
            let tracking = mrcache::fork::tracking_in_env(|k| std::env::var(k).ok());
            let d = mrcache::fork::decide(cfg.fork, copy_on_fork, tracking);
            println!(
                "\nfork: {} (RDMAV_FORK_SAFE/IBV_FORK_SAFE; ibv_fork_init() at run time also turns tracking on)",
                d.why
            );
        }
    }
}

/// What each monitor catches here: the self-test, run in a child under each.
fn info_monitors(lib: &Result<PathBuf, String>) -> Result<(), String> {
    println!("\nmonitors (startup self-test, run in a child under each):");
    if let Ok(lib) = &lib {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        for m in ["patch", "symbols", "none"] {
            let out = Command::new(&exe)
                .arg("__selftest")
                .env("LD_PRELOAD", lib)
                .env("MRCACHE_MONITOR", m)
                .output()
                .map_err(|e| e.to_string())?;
            println!("  {m}:");
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                println!("    {line}");
            }
        }
    } else {
        println!("  (library not found)");
    }
    Ok(())
}

/// Runs under LD_PRELOAD=libmrcache.so: call its self-test and print the result.
fn self_test() -> Result<ExitCode, String> {
    // SAFETY: dlsym for our own library's exported report function.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"mrcache_selftest_report".as_ptr()) };
    if f.is_null() {
        return Err("libmrcache.so is not preloaded".into());
    }
    let mut buf = vec![0u8; 8192];
    // SAFETY: mrcache_selftest_report(char *buf, size_t len) -> size_t (bytes written).
    let f: unsafe extern "C" fn(*mut u8, usize) -> usize = unsafe { std::mem::transmute(f) };
    // SAFETY: as above, with our buffer.
    let n = unsafe { f(buf.as_mut_ptr(), buf.len()) };
    print!("{}", String::from_utf8_lossy(&buf[..n.min(buf.len())]));
    Ok(ExitCode::SUCCESS)
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
