//! Setting the runtime up at the first verbs call: configuration, the self-test, the
//! cache, the fork policy, and failing closed when the monitor cannot see everything; and
//! for `mrcache info`, what the self-test and that rule would say here (`selftest_report`).

use crate::monitor::memory::QUEUE;
use crate::monitor::patch::{self, PatchTarget};
use crate::monitor::selftest::{self, Coverage};
use crate::runtime::closed::{check_patches, fail_closed, on_demand_only};
use crate::runtime::fork;
use crate::runtime::{ATFORK_REGISTERED, Runtime, STATS_AT_EXIT};
use crate::trace;
use crate::verbs::odp::Policy;
use crate::verbs::provider::Provider;
use mrcache::cache::{Cache, Limits};
use mrcache::config::{self, LogLevel, Monitor, OnDemand, StatsMode};
use std::sync::atomic::Ordering::*;

/// This process's configuration, and what is wrong with it.
pub fn environment() -> (config::Config, Vec<config::Problem>) {
    let vars = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())));
    config::parse_on(
        vars,
        config::physical_memory(),
        mrcache::node::Memlock::current(),
    )
}

/// The runtime of this process, from its environment.
pub fn set_up() -> Runtime {
    test_init_delay();
    let (config, problems) = environment();
    crate::runtime::budget::record(&config);
    for p in &problems {
        eprintln!("{p}");
    }
    trace::set_log_file(config.log_file.as_deref());
    if config.log > LogLevel::Off {
        trace::set_logger(&config.log_filter, config.log_format);
    }
    if config.stats != StatsMode::Off && !STATS_AT_EXIT.swap(true, SeqCst) {
        // SAFETY: registering a plain extern "C" fn with atexit.
        unsafe { libc::atexit(crate::runtime::report::print_stats) };
    }
    if config.log >= LogLevel::Trace {
        trace::start(config.trace_buffer);
        crate::runtime::fast::set_mode(crate::runtime::fast::TRACED);
    }
    if config.enabled && config.monitor == Monitor::None && config.odp == OnDemand::On {
        eprintln!(
            "mrcache: MRCACHE_MONITOR=none with MRCACHE_ODP=on: unmapped and freed memory is not tracked; only registrations the device makes on demand are cached, the others pass through uncached"
        );
    } else if config.enabled && config.monitor == Monitor::None {
        eprintln!(
            "mrcache: WARNING: MRCACHE_MONITOR=none: unmapped and freed memory is NOT tracked; cached registrations can go stale and remote writes can land in memory that no longer belongs to the buffer. For tests only."
        );
    }
    let mut coverage = None;
    let mut blind = None;
    let cache = config.enabled.then(|| {
        // libc's entries are patched here (a jump another patcher wrote there first is taken
        // over and chained), unless the constructor or a `dlsym` lookup did it already. A
        // patcher that wrote over our jumps since (UCX at ucp_init): nothing is cached yet,
        // so taking them back and chaining to it loses nothing. One it could not take back
        // is still not ours: `check_patches` below fails closed on it.
        if config.monitor == Monitor::Patch {
            crate::monitor::load::patch_libc();
            patch::adopt_overwritten();
        }
        let c = run_selftest();
        let missed = c.missed();
        if config.monitor != Monitor::None && !missed.is_empty() {
            blind = Some(blind_spots(config.monitor, &missed));
        }
        let hazards = patch::hazards();
        if blind.is_none() && !hazards.is_empty() {
            blind = Some(format!(
                "the patch monitor cannot be trusted: {}",
                hazards.join("; ")
            ));
        }
        if config.monitor != Monitor::None
            && blind.is_none()
            && let Some(san) =
                crate::sys::sanitizer::allocator(crate::monitor::cross_modify::single_threaded())
        {
            let linked = if san.linked_in {
                ", linked into the program,"
            } else {
                ""
            };
            blind = Some(format!(
                "the monitor does not see: memory {}'s allocator releases (the sanitizer's runtime{linked} unmaps it with its own system calls, past libc and mrcache's hooks)",
                san.name
            ));
        }
        coverage = Some(c);
        let mut verify = config.verify_pfn;
        if verify && !pagemap_shows_frames() {
            eprintln!("mrcache: MRCACHE_VERIFY=pfn needs root (CAP_SYS_ADMIN) to read page frame numbers from /proc/self/pagemap; verification is off");
            verify = false;
        }
        Cache::with_queue(
            Provider::new(
                verify,
                Policy::new(config.odp, config.remote, config.odp_profile.clone()),
                crate::runtime::log,
            ),
            Limits {
                max_entries: config.max_entries,
                max_bytes: config.max_bytes,
                shadow: config.shadow,
                remote_superset: config.remote_superset,
            },
            &QUEUE,
        )
        .with_remote(config.remote)
        .with_admit(config.admit)
        .with_rounds_timed_by_caller()
        .with_sampling(mrcache::admission::SAMPLE_EVERY)
    });
    if let Some(cache) = &cache {
        if let Some(why) = blind {
            // Decided here, before the cache serves anything (no pinned entry exists). Under
            // `auto` on the device of the registration that sets up: where it pages nothing
            // on demand, caching only on-demand entries would cache nothing. Under `on` the
            // user asked for them, on whichever device pages on demand.
            let context = crate::runtime::SETUP_CONTEXT.load(Relaxed);
            let odp = match config.odp {
                OnDemand::On => true,
                OnDemand::Auto => context != 0 && cache.registrar().odp.pages_on_demand(context),
                OnDemand::Off => false,
            };
            if !(odp && on_demand_only(cache, &why)) {
                fail_closed(cache, &why);
            }
        } else if config.monitor == Monitor::None && config.odp == OnDemand::On {
            on_demand_only(cache, "MRCACHE_MONITOR=none");
        } else if config.monitor == Monitor::Patch {
            patch::EVERY_HIT.store(config.patch_check_every_hit, Relaxed);
            check_patches(cache);
            if cache.caching_stopped().is_none() {
                patch::try_clean();
            }
        }
    }
    let fork = cache.as_ref().map(|_| {
        // Once per address space: a fork child that takes the set-up over inherits the
        // parent's registrations (and this flag), and handlers registered twice would
        // run prepare twice and block on the lock the first one holds.
        if !ATFORK_REGISTERED.swap(true, SeqCst) {
            // Looked up now, not first in a prepare handler a signal handler may run.
            crate::sys::thread::program_single_threaded();
            // SAFETY: registering plain extern "C" handlers.
            unsafe {
                libc::pthread_atfork(Some(fork::prepare), Some(fork::parent), Some(fork::child))
            };
        }
        fork::decide(config.fork)
    });
    if let (Some(d), Some(c)) = (&fork, &coverage)
        && config.log >= LogLevel::Info
    {
        let pid = std::process::id();
        trace::log_line(
            LogLevel::Info,
            &format!(
                "mrcache[{pid}]: monitor {}; self-test {:.0} us: {}: {}",
                config.monitor.as_str(),
                c.nanos as f64 / 1e3,
                c.headline(),
                c.summary()
            ),
        );
        trace::log_line(
            LogLevel::Info,
            &format!("mrcache[{pid}]: fork policy: {}", d.why),
        );
        // Read only under `auto` (config::parse).
        if let Some(p) = &config.odp_profile {
            trace::log_line(
                LogLevel::Info,
                &format!(
                    "mrcache[{pid}]: on-demand profile: {}",
                    p.verdict_under(&mrcache::node::running_kernel())
                ),
            );
        }
    }
    if cache.is_none() {
        crate::runtime::fast::set_mode(crate::runtime::fast::OFF);
    }
    Runtime {
        cache,
        monitor: config.monitor,
        coverage,
        fork,
        log: config.log,
        stats: config.stats,
        stats_file: config.stats_file.clone(),
    }
}

/// What the monitor misses, and why, for the line that turns caching off.
pub fn blind_spots(monitor: Monitor, missed: &[&str]) -> String {
    let mut why = Vec::new();
    if monitor == Monitor::Patch {
        // One clause per reason: "libc's munmap, madvise were not patched: <why>".
        let refused: Vec<(&str, patch::PatchError)> = PatchTarget::ALL
            .iter()
            .filter_map(|&t| Some((t.name().to_str().ok()?, patch::refused(t as usize)?)))
            .collect();
        let refused: Vec<_> = refused.into_iter().filter(|r| !r.1.written()).collect();
        let mut reasons: Vec<patch::PatchError> = refused.iter().map(|r| r.1).collect();
        reasons.dedup();
        for e in reasons {
            let names: Vec<&str> = refused.iter().filter(|r| r.1 == e).map(|r| r.0).collect();
            why.push(format!(
                "libc's {} not patched: {}",
                names.join(", "),
                e.why()
            ));
        }
        why.extend(patch::hazards());
        if let Some(name) = patch::overwritten() {
            why.push(format!(
                "libc's {} (or mrcache's own hook) was patched, then overwritten by another code patcher",
                name.to_string_lossy()
            ));
        }
        if let Some(name) = patch::hook_taken_before_start() {
            why.push(format!(
                "mrcache's own {} hook was overwritten by another code patcher before mrcache started: it took mrcache's definition for libc's (UCX's bistro does when libucm comes after libc in the search order, as in ucx_perftest, or is preloaded before libmrcache.so)",
                name.to_string_lossy()
            ));
        }
    } else {
        why.push(format!("monitor '{}' only sees calls through the symbol table (MRCACHE_MONITOR=patch also sees libc's own calls)", monitor.as_str()));
    }
    format!(
        "the monitor does not see: {} ({})",
        missed.join(", "),
        why.join("; ")
    )
}

/// For `mrcache info`: the self-test's result as lines of text.
pub fn selftest_report() -> String {
    if crate::runtime::cache().is_some() {
        return "the cache is running in this process; the self-test ran at its start\n".into();
    }
    crate::monitor::load::patch_libc();
    let c = run_selftest();
    let mut out = c.lines();
    if crate::monitor::load::PATCHED.load(Relaxed) != 0 {
        out.push_str(if crate::monitor::patch::MPROTECT_PATCHED.load(Relaxed) {
            "patch check: libc's mprotect entry patched: with MRCACHE_PATCH_CHECK=watch a hit reads the watch word only\n"
        } else {
            "patch check: libc's mprotect entry not patched (its start is not one mrcache knows): every hit reads every patched site\n"
        });
    }
    let missed = c.missed();
    if !missed.is_empty() {
        let config = environment().0;
        let monitor = config.monitor;
        if monitor != Monitor::None && config.odp == OnDemand::Off {
            out.push_str(&format!(
                "caching would be OFF in a verbs program here: {}\n",
                blind_spots(monitor, &missed)
            ));
        } else if monitor != Monitor::None {
            out.push_str(&format!(
                "only registrations the device makes on demand (ODP) would be cached in a verbs program here (MRCACHE_ODP={}), the others passed through: {}\n",
                config.odp.as_str(),
                blind_spots(monitor, &missed)
            ));
        }
    }
    out
}

/// Test-only: `MRCACHE_TEST_INIT_DELAY_MS` stalls the set-up at the first verbs call, so a
/// test can fork (or call from another thread) while it is in progress.
fn test_init_delay() {
    if let Some(ms) = std::env::var("MRCACHE_TEST_INIT_DELAY_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Whether /proc/self/pagemap gives real frame numbers here (it gives 0 without
/// CAP_SYS_ADMIN).
fn pagemap_shows_frames() -> bool {
    let probe = Box::new([1u8; 64]);
    let addr = probe.as_ptr() as usize;
    crate::verbs::provider::page_frames(crate::sys::page_down(addr), 1).is_some_and(|f| f[0] != 0)
}

/// The startup self-test, on this process's monitor.
pub fn run_selftest() -> Coverage {
    QUEUE.activate();
    let libc_handle = crate::monitor::load::LIBC.load(Relaxed);
    let patched = crate::monitor::load::PATCHED.load(Relaxed);
    // The allocator probes only mean something when the program's malloc is glibc's.
    let glibc_malloc = !libc_handle.is_null()
        && crate::sys::symbol::address(libc::RTLD_DEFAULT, c"malloc")
            == crate::sys::symbol::address(libc_handle, c"malloc");
    selftest::run(
        libc_handle,
        glibc_malloc,
        patched & PatchTarget::Brk.bit() != 0,
    )
}
