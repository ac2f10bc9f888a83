//! This process's statistics report and exit summary.

use crate::monitor::memory::{self, QUEUE};
use crate::runtime::{self, BYPASSED, COUNTERS, cache};
use crate::trace;
use mrcache::config::StatsMode;
use mrcache::stats::{Bypassed, Counter, Report, UnmapSource};
use std::sync::atomic::Ordering::*;

/// This process's statistics.
pub fn report() -> Option<Report> {
    let rt = runtime::get()?;
    let cache = cache()?;
    let s = cache.snapshot();
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
        on_demand_only: cache.registrar().odp.only_why().unwrap_or_default().into(),
        admit: cache.admit().as_str().into(),
        admission: cache.admission().to_report(),
        ..Report::default()
    };
    crate::runtime::budget::fill(&mut r);
    let c = &mut r.counts;
    c[Counter::UnmapsMergedOnOverflow] = QUEUE.overflows.load(Relaxed);
    c[Counter::EntriesAtExit] = s.entries;
    c[Counter::BytesAtExit] = s.bytes;
    for f in [
        Counter::Forks,
        Counter::ForkIdleDeregistered,
        Counter::ForkRangesDontfork,
    ] {
        c[f] = COUNTERS.get(f);
    }
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
            r.selftest.insert((*path).into(), status.to_string());
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
            for line in mrcache::summary::summary(&r) {
                trace::write_line(&line);
            }
        }
    }
}
