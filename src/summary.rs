//! The exit summary (`MRCACHE_STATS=1`): a report as a short aligned block a person reads
//! at a glance. Times are only ever ones measured here: no estimate of time saved (hits
//! times a mean inflated by first-touch page faults can exceed the whole run).

use crate::stats::{Bypassed, Counter, Report};

/// Width of a summary line, prefix included; longer text wraps under its value column.
const WIDTH: usize = 100;
const PREFIX: &str = "mrcache:   ";
const LABEL: usize = 15;

/// How many calls went to libibverbs for `why`.
fn bypassed_as(r: &Report, why: Bypassed) -> u64 {
    r.bypassed.get(why.name()).copied().unwrap_or(0)
}

/// A class's verdict as the summary says it: under `MRCACHE_ADMIT=always` nothing passes
/// through, whatever the figures say.
fn verdict_shown<'a>(r: &Report, verdict: &'a str) -> &'a str {
    if r.admit == "always" && verdict == "pass-through" {
        "would pass through (always)"
    } else {
        verdict
    }
}

/// The summary of `r`, one string per line.
pub fn summary(r: &Report) -> Vec<String> {
    let n = |c: Counter| r[c];
    let kib = |c: Counter| r[c] / 1024;
    let provider_calls = n(Counter::Misses) + n(Counter::Uncached);
    let bypassed: u64 = r.bypassed.values().sum();
    let mut rows: Vec<(&str, String)> = vec![
        (
            "registrations",
            format!(
                "{} hits ({} containing, {:.1}%), {} misses, {} uncached, {bypassed} bypassed",
                r.hits_total(),
                n(Counter::HitsContaining),
                r.hit_rate() * 100.0,
                n(Counter::Misses),
                n(Counter::Uncached),
            ),
        ),
        (
            "provider time",
            format!(
                "{:.3} ms in {provider_calls} registrations (all threads; first touches included)",
                n(Counter::RegistrationNs) as f64 / 1e6,
            ),
        ),
        (
            "cached",
            format!(
                "{} entries, {} KiB now; peak {} entries, {} KiB",
                n(Counter::EntriesAtExit),
                kib(Counter::BytesAtExit),
                n(Counter::PeakEntries),
                kib(Counter::PeakBytes),
            ),
        ),
        (
            "dropped",
            format!(
                "{} evicted ({} for ENOMEM), {} invalidated (memory went away)",
                n(Counter::Evictions) + n(Counter::EvictionsEnomem),
                n(Counter::EvictionsEnomem),
                n(Counter::Invalidated),
            ),
        ),
        (
            "remote keys",
            format!(
                "MRCACHE_REMOTE={}: {} granted, {} revoked, {} passed to libibverbs ({} more by admission, local ones included: see its line)",
                r.remote_keys,
                n(Counter::RemoteGrants),
                n(Counter::RemoteRevokes),
                bypassed_as(r, Bypassed::RemoteAccess),
                bypassed_as(r, Bypassed::NotWorthCaching)
                    + bypassed_as(r, Bypassed::Scan)
                    + bypassed_as(r, Bypassed::Probe),
            ),
        ),
        (
            "fork",
            format!(
                "{} forks, {} idle entries deregistered, {} ranges marked DONTFORK",
                n(Counter::Forks),
                n(Counter::ForkIdleDeregistered),
                n(Counter::ForkRangesDontfork),
            ),
        ),
        ("fork policy", r.fork_decision.clone()),
    ];
    if !r.admit.is_empty() {
        rows.push((
            "admission",
            format!(
                "MRCACHE_ADMIT={}: {} passed through (caching did not pay), {} (scan: cache full of busier entries), {} probes (a cached remote class's hit passed through to time a miss), {} cached trials",
                r.admit,
                n(Counter::AdmissionPassedCost),
                n(Counter::AdmissionPassedScan),
                bypassed_as(r, Bypassed::Probe),
                n(Counter::AdmissionTrials),
            ),
        ));
    }
    for a in &r.admission {
        rows.push((
            "",
            format!(
                "{} {}: {}: miss {} ns (reg {} + dereg {}), cached round {} ns ({}), eviction {} ns; {} passed, {} trials",
                a.access,
                a.class,
                verdict_shown(r, &a.verdict),
                a.miss_ns,
                a.reg_ns,
                a.dereg_ns,
                a.cached_ns,
                a.cached_from,
                a.evict_ns,
                a.passed,
                a.trials
            ),
        ));
    }
    // The byte cap, one part of its reason a line (so no part is broken across lines).
    let cap = if r.max_bytes == u64::MAX {
        "unlimited".to_string()
    } else {
        format!("{} KiB", r.max_bytes / 1024)
    };
    let mut cap_parts = vec![cap];
    cap_parts.extend(
        r.max_bytes_why
            .split(", ")
            .filter(|p| !p.is_empty())
            .map(str::to_string),
    );
    let node = format!(
        "ranks on this node: {}; RLIMIT_MEMLOCK: {}",
        match r.local_ranks {
            0 => "not set by a launcher".to_string(),
            n => n.to_string(),
        },
        r.memlock
    );
    let by_source: Vec<String> = r
        .unmaps_by_source
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    rows.push((
        "monitor",
        format!(
            "{}: unmaps reported: {} ({} merged on overflow)",
            r.monitor,
            if by_source.is_empty() {
                "none".into()
            } else {
                by_source.join(", ")
            },
            n(Counter::UnmapsMergedOnOverflow),
        ),
    ));
    if !r.selftest.is_empty() {
        let line =
            crate::selftest::headline(r.selftest.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        // "N of M run paths caught in T us; not run: ...; MISSED: ..."
        let (count, rest) = line.split_once(';').unwrap_or((&line, ""));
        rows.push((
            "self-test",
            format!(
                "{count} in {} us{}",
                r.selftest_us,
                if rest.is_empty() {
                    String::new()
                } else {
                    format!(";{rest}")
                }
            ),
        ));
    }
    let problems =
        n(Counter::DoubleDeregs) + n(Counter::VerifyMismatches) + n(Counter::DeregFailures);
    if problems > 0 {
        rows.push((
            "problems",
            format!(
                "{} double deregistrations, {} verify mismatches, {} failed deregistrations",
                n(Counter::DoubleDeregs),
                n(Counter::VerifyMismatches),
                n(Counter::DeregFailures),
            ),
        ));
    }
    if !r.caching_off.is_empty() {
        rows.push(("caching OFF", r.caching_off.clone()));
    }
    if !r.on_demand_only.is_empty() {
        rows.push(("on demand only", r.on_demand_only.clone()));
    }
    let mut out = vec![format!("mrcache: pid {} at exit:", r.pid)];
    let mut push = |label: &str, parts: &[String]| {
        let mut first = true;
        for part in parts {
            for chunk in wrap(part, WIDTH - PREFIX.len() - LABEL) {
                let label = if first { label } else { "" };
                out.push(format!("{PREFIX}{label:<LABEL$}{chunk}"));
                first = false;
            }
        }
    };
    let (first, rest) = rows.split_at(2);
    for (label, text) in first {
        push(label, std::slice::from_ref(text));
    }
    push("byte cap", &cap_parts);
    push("node", &[node]);
    for (label, text) in rest {
        push(label, std::slice::from_ref(text));
    }
    out
}

/// `text` in lines of at most `width` characters, broken at spaces (a longer word stays
/// whole).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split(' ') {
        let line = lines.last_mut().expect("never empty");
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(word.to_string());
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop of a million hits over a few slow first registrations (page faults): the
    /// summary's lines are short, and no time in it is more than the time measured.
    fn busy() -> Report {
        let mut r = Report {
            pid: 4242,
            host: "n1".into(),
            remote_keys: "revoke".into(),
            fork_decision: "auto: the kernel copies pinned pages at fork (ibv_is_fork_initialized = IBV_FORK_UNNEEDED): idle entries are kept; libibverbs fork tracking is off".into(),
            monitor: "patch".into(),
            ..Report::default()
        };
        let c = &mut r.counts;
        c[Counter::Hits] = 1_000_000;
        c[Counter::Misses] = 4;
        c[Counter::RegistrationNs] = 400_000_000;
        c[Counter::PeakEntries] = 3;
        c[Counter::PeakBytes] = 3 << 20;
        r.bypassed.insert("on-demand".into(), 2);
        r.unmaps_by_source.insert("munmap".into(), 12);
        r.selftest.insert("munmap".into(), "caught".into());
        r.max_bytes = 48 << 20;
        r.max_bytes_why = "a quarter of physical memory (8589934592 bytes), capped at 3/4 of RLIMIT_MEMLOCK (67108864 bytes)".into();
        r.memlock = "67108864 bytes".into();
        r
    }

    #[test]
    fn summary_lines_are_short() {
        let lines = summary(&busy());
        println!("{}", lines.join("\n"));
        for line in &lines {
            assert!(line.len() <= 100, "{} chars: {line}", line.len());
        }
        // Aligned: a label column, then every value starts in the same column.
        for line in &lines[1..] {
            let (label, value) = line[PREFIX.len()..].split_at(LABEL);
            assert!(
                line.starts_with(PREFIX) && !value.starts_with(' '),
                "{line}"
            );
            assert!(label.is_empty() || label.ends_with(' '), "{line}");
        }
        assert!(lines.len() <= 16, "{}", lines.len());
        assert!(
            lines
                .iter()
                .any(|l| l.ends_with("capped at 3/4 of RLIMIT_MEMLOCK (67108864 bytes)")),
            "a reason is never broken across lines"
        );
    }

    #[test]
    fn no_time_beyond_what_was_measured() {
        let r = busy();
        let measured_ms = r[Counter::RegistrationNs] as f64 / 1e6;
        for line in summary(&r) {
            let words: Vec<&str> = line.split_whitespace().collect();
            for w in words.windows(2) {
                if w[1].trim_end_matches([',', ';', ')']) == "ms" {
                    let v: f64 = w[0].trim_start_matches('(').parse().unwrap();
                    assert!(v <= measured_ms, "{v} ms > {measured_ms} ms: {line}");
                }
            }
        }
    }

    /// A healthy start: every path the self-test exercised was caught, and brk/sbrk (patched,
    /// never shrunk at start-up) was not run. The line counts what ran and names what did
    /// not, so it never reads as a miss.
    #[test]
    fn selftest_line_counts_what_ran() {
        let mut r = busy();
        r.selftest.clear();
        for p in ["munmap", "madvise", "mremap", "mmap-fixed", "free()"] {
            r.selftest.insert(p.into(), "caught".into());
        }
        r.selftest.insert(
            "brk/sbrk shrink".into(),
            "not run: libc brk patched; not exercised at startup".into(),
        );
        let lines = summary(&r);
        let line = lines.iter().find(|l| l.contains("self-test")).unwrap();
        assert!(
            line.contains("5 of 5 run paths caught") && line.contains("not run: brk/sbrk shrink"),
            "{line}"
        );
        r.selftest.insert("shmdt".into(), "MISSED".into());
        let lines = summary(&r);
        let line = lines.iter().find(|l| l.contains("self-test")).unwrap();
        assert!(
            line.contains("5 of 6 run paths caught") && line.contains("MISSED: shmdt"),
            "{line}"
        );
    }
}
