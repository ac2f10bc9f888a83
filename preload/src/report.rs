//! This process's statistics report and exit summary, and the self-test text of `mrcache
//! info`.

use crate::init::{blind_spots, run_selftest};
use crate::memory::{self, QUEUE};
use crate::runtime::{self, BYPASSED, COUNTERS, FORK_DONTFORKED, FORK_FLUSHED, cache};
use crate::trace;
use mrcache::config::{Monitor, StatsMode};
use mrcache::stats::{Bypassed, Counter, Report, UnmapSource};
use std::sync::atomic::Ordering::*;

/// For `mrcache info`: the self-test's result as lines of text.
pub fn selftest_report() -> String {
    if cache().is_some() {
        return "the cache is running in this process; the self-test ran at its start\n".into();
    }
    let c = run_selftest();
    let mut out = String::new();
    for (path, status) in &c.results {
        let s = match status {
            crate::selftest::Status::Caught => "caught".to_string(),
            crate::selftest::Status::Missed => "MISSED".to_string(),
            crate::selftest::Status::NotRun(why) => why.to_string(),
        };
        out.push_str(&format!("{path}: {s}\n"));
    }
    out.push_str(&format!("(self-test took {} us)\n", c.nanos / 1000));
    let missed = c.missed();
    if !missed.is_empty() {
        let monitor = crate::init::environment().0.monitor;
        if monitor != Monitor::None {
            out.push_str(&format!(
                "caching would be OFF in a verbs program here: {}\n",
                blind_spots(monitor, &missed)
            ));
        }
    }
    out
}

/// This process's statistics.
pub fn report() -> Option<Report> {
    let rt = runtime::get()?;
    let cache = cache()?;
    let s = cache.snapshot();
    let registrations = s.counts[Counter::Misses] + s.counts[Counter::Uncached];
    let per_reg = s.counts[Counter::RegistrationNs]
        .checked_div(registrations)
        .unwrap_or(0);
    let mut r = Report {
        version: mrcache::VERSION.into(),
        pid: std::process::id(),
        host: trace::host_name(),
        counts: s.counts,
        fork_decision: rt.fork.as_ref().map(|d| d.why.clone()).unwrap_or_default(),
        monitor: rt.monitor.as_str().into(),
        remote_keys: cache.remote().as_str().into(),
        selftest_us: rt.coverage.as_ref().map_or(0, |c| c.nanos / 1000),
        caching_off: cache.caching_stopped().unwrap_or_default().into(),
        ..Report::default()
    };
    crate::budget::fill(&mut r);
    let c = &mut r.counts;
    c[Counter::UnmapsMergedOnOverflow] = QUEUE.overflows.load(Relaxed);
    c[Counter::EntriesAtExit] = s.entries;
    c[Counter::BytesAtExit] = s.bytes;
    c[Counter::SavedNsEstimate] = (c[Counter::Hits] + c[Counter::HitsContaining]) * per_reg;
    c[Counter::Forks] = COUNTERS.get(Counter::Forks);
    c[Counter::TraceRecordsDropped] = trace::dropped();
    for &why in Bypassed::ALL {
        let n = BYPASSED.get(why as usize);
        if n > 0 {
            r.bypassed.insert(why.name().into(), n);
        }
    }
    for &source in UnmapSource::ALL {
        let n = memory::REPORTED.get(source as usize);
        if n > 0 {
            r.unmaps_by_source.insert(source.name().into(), n);
        }
    }
    if let Some(c) = &rt.coverage {
        for (path, status) in &c.results {
            let v = match status {
                crate::selftest::Status::Caught => "caught".to_string(),
                crate::selftest::Status::Missed => "missed".to_string(),
                crate::selftest::Status::NotRun(why) => format!("not run: {why}"),
            };
            r.selftest.insert((*path).into(), v);
        }
    }
    Some(r)
}

pub extern "C" fn print_stats() {
    let Some(rt) = runtime::get() else { return };
    let Some(r) = report() else { return };
    match rt.stats {
        StatsMode::Off => {}
        StatsMode::Json => {
            let line = r.to_json();
            match rt.stats_file.as_deref() {
                Some(pattern) => {
                    let path = mrcache::stats::expand_path(pattern, r.pid, &r.host);
                    let written = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                        .and_then(|mut f| {
                            std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes())
                        });
                    if let Err(e) = written {
                        eprintln!("mrcache: cannot write MRCACHE_STATS_FILE {path}: {e}");
                        eprintln!("{line}");
                    }
                }
                None => trace::write_line(&line),
            }
        }
        StatsMode::Summary => {
            let pid = r.pid;
            let bypassed: u64 = r.bypassed.values().sum();
            trace::write_line(&format!(
                "mrcache: pid {pid}: {} hits ({} containing), {} misses, {} uncached, {bypassed} bypassed, {} evictions ({} for ENOMEM), {} invalidated, {} double deregs, {} verify mismatches; {} entries / {} KiB cached now, peak {} / {} KiB; {:.3} ms spent registering (mean {:.1} us per registration, first touches included), so the hits avoided roughly {:.3} ms",
                r.hits_total(),
                r[Counter::HitsContaining],
                r[Counter::Misses],
                r[Counter::Uncached],
                r[Counter::Evictions] + r[Counter::EvictionsEnomem],
                r[Counter::EvictionsEnomem],
                r[Counter::Invalidated],
                r[Counter::DoubleDeregs],
                r[Counter::VerifyMismatches],
                r[Counter::EntriesAtExit],
                r[Counter::BytesAtExit] / 1024,
                r[Counter::PeakEntries],
                r[Counter::PeakBytes] / 1024,
                r[Counter::RegistrationNs] as f64 / 1e6,
                r[Counter::RegistrationNs] as f64
                    / 1e3
                    / (r[Counter::Misses] + r[Counter::Uncached]).max(1) as f64,
                r[Counter::SavedNsEstimate] as f64 / 1e6,
            ));
            trace::write_line(&crate::budget::summary(&r));
            trace::write_line(&format!(
                "mrcache: pid {pid}: remote keys: MRCACHE_REMOTE={}; {} granted, {} revoked, {} registrations with remote access passed to libibverbs",
                r.remote_keys,
                r[Counter::RemoteGrants],
                r[Counter::RemoteRevokes],
                r.bypassed
                    .get(Bypassed::RemoteAccess.name())
                    .copied()
                    .unwrap_or(0)
            ));
            trace::write_line(&format!(
                "mrcache: pid {pid}: fork: {}; {} forks, {} idle entries deregistered at fork, {} ranges marked DONTFORK",
                r.fork_decision,
                r[Counter::Forks],
                FORK_FLUSHED.load(Relaxed),
                FORK_DONTFORKED.load(Relaxed)
            ));
            if !r.caching_off.is_empty() {
                trace::write_line(&format!(
                    "mrcache: pid {pid}: caching was OFF: {}",
                    r.caching_off
                ));
            }
            if let Some(c) = &rt.coverage {
                let by_source: Vec<String> = r
                    .unmaps_by_source
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect();
                trace::write_line(&format!(
                    "mrcache: pid {pid}: monitor {}, unmaps reported: {} ({} merged on overflow); self-test {:.0} us: {}",
                    r.monitor,
                    if by_source.is_empty() {
                        "none".into()
                    } else {
                        by_source.join(", ")
                    },
                    r[Counter::UnmapsMergedOnOverflow],
                    c.nanos as f64 / 1e3,
                    c.summary()
                ));
            }
        }
    }
}
