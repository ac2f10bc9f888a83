//! `mrcache info`: what the library would do here (the variables and the configuration
//! they make, the libibverbs found and its devices, the fork policy, what each monitor
//! catches), and `mrcache __self-test`, which runs under the library.

use super::{bytes_text, find_library, mrcache_vars};
use mrcache::config::{self, VARIABLES};
use std::ffi::{CString, c_void};
use std::path::PathBuf;
use std::process::{Command, ExitCode};

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

pub fn info(lib: Option<PathBuf>) -> Result<ExitCode, String> {
    println!("mrcache {}", mrcache::VERSION);
    let lib = find_library(lib);
    match &lib {
        Ok(p) => {
            println!("library: {}", p.display());
            // The front loads the engine from its own directory at the first verbs call.
            let engine = p.with_file_name("libmrcache_engine.so");
            if engine.is_file() {
                println!("engine: {}", engine.display());
            } else {
                println!(
                    "engine: not found ({}): verbs calls would go to libibverbs uncached",
                    engine.display()
                );
            }
        }
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
        "  on-demand paging: MRCACHE_ODP={}: {}",
        cfg.odp.as_str(),
        match cfg.odp {
            config::OnDemand::Auto => {
                "entries are pinned; where the monitor cannot see every unmap, only registrations the device makes on demand (ODP) are cached, instead of none"
            }
            config::OnDemand::On => {
                "every entry the device can make on demand (ODP) is registered so; with the monitor off or blind, only those are cached"
            }
            config::OnDemand::Off => {
                "every entry is pinned; where the monitor cannot see every unmap, caching is off"
            }
        }
    );
    match (&cfg.odp_profile, &cfg.odp_profile_path) {
        (Some(p), _) => println!(
            "  on-demand profile (MRCACHE_ODP_PROFILE): {}",
            p.verdict_under(&mrcache::node::running_kernel())
        ),
        (None, Some(_)) if cfg.odp != config::OnDemand::Auto => println!(
            "  on-demand profile: MRCACHE_ODP_PROFILE is read only under MRCACHE_ODP=auto: ignored"
        ),
        _ => {}
    }
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
pub fn self_test() -> Result<ExitCode, String> {
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
