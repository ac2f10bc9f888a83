//! The per-process statistics report (`MRCACHE_STATS=json`), written by libmrcache.so at
//! exit and read back by `mrcache stats FILES...` to aggregate a job's ranks.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub version: String,
    pub pid: u32,
    pub host: String,
    pub hits: u64,
    pub hits_containing: u64,
    pub misses: u64,
    pub uncached: u64,
    /// Registrations passed to libibverbs untouched, by reason.
    pub bypassed: BTreeMap<String, u64>,
    pub evictions: u64,
    pub evictions_enomem: u64,
    /// Cached entries dropped because their memory went away.
    pub invalidated_entries: u64,
    /// Unmaps reported by the memory hooks, by call.
    pub unmaps_by_source: BTreeMap<String, u64>,
    pub unmaps_merged_on_overflow: u64,
    pub double_deregs: u64,
    pub verify_mismatches: u64,
    pub dereg_failures: u64,
    pub entries_at_exit: u64,
    pub bytes_at_exit: u64,
    pub peak_entries: u64,
    pub peak_bytes: u64,
    /// Time spent in provider registrations (misses and uncached).
    pub registration_ns: u64,
    /// Estimated time hits saved: hits x the mean cost of a registration here.
    pub saved_ns_estimate: u64,
    pub forks: u64,
    pub fork_decision: String,
    pub monitor: String,
    /// Why caching was turned off in this process (empty: it was not).
    #[serde(default)]
    pub caching_off: String,
    /// `MRCACHE_REMOTE`: revoke, keep or bypass.
    #[serde(default)]
    pub remote_keys: String,
    /// Remote keys handed out through windows, and revoked at `ibv_dereg_mr`.
    #[serde(default)]
    pub remote_grants: u64,
    #[serde(default)]
    pub remote_revokes: u64,
    pub selftest_us: u64,
    pub selftest: BTreeMap<String, String>,
    pub trace_records_dropped: u64,
}

impl Report {
    pub fn hits_total(&self) -> u64 {
        self.hits + self.hits_containing
    }

    pub fn hit_rate(&self) -> f64 {
        let all = self.hits_total() + self.misses + self.uncached;
        if all == 0 {
            0.0
        } else {
            self.hits_total() as f64 / all as f64
        }
    }

    /// Sum of the counters over `reports` (pid 0, host "total").
    pub fn total(reports: &[Report]) -> Report {
        let mut t = Report {
            host: "total".into(),
            ..Report::default()
        };
        for r in reports {
            t.hits += r.hits;
            t.hits_containing += r.hits_containing;
            t.misses += r.misses;
            t.uncached += r.uncached;
            for (k, v) in &r.bypassed {
                *t.bypassed.entry(k.clone()).or_default() += v;
            }
            t.evictions += r.evictions;
            t.evictions_enomem += r.evictions_enomem;
            t.invalidated_entries += r.invalidated_entries;
            for (k, v) in &r.unmaps_by_source {
                *t.unmaps_by_source.entry(k.clone()).or_default() += v;
            }
            t.double_deregs += r.double_deregs;
            t.verify_mismatches += r.verify_mismatches;
            t.dereg_failures += r.dereg_failures;
            t.peak_entries = t.peak_entries.max(r.peak_entries);
            t.peak_bytes = t.peak_bytes.max(r.peak_bytes);
            t.registration_ns += r.registration_ns;
            t.saved_ns_estimate += r.saved_ns_estimate;
            t.forks += r.forks;
            t.trace_records_dropped += r.trace_records_dropped;
            t.remote_grants += r.remote_grants;
            t.remote_revokes += r.remote_revokes;
        }
        let mut modes: Vec<&str> = reports.iter().map(|r| r.remote_keys.as_str()).collect();
        modes.sort_unstable();
        modes.dedup();
        t.remote_keys = modes.join("+");
        t
    }

    /// One JSON object on one line.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parse every JSON object line of `text` (other lines, e.g. a trace, are skipped).
    pub fn parse_lines(text: &str) -> Result<Vec<Report>, String> {
        text.lines()
            .enumerate()
            .filter(|(_, l)| l.trim_start().starts_with('{'))
            .map(|(n, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", n + 1)))
            .collect()
    }
}

/// Expand `%p` (pid) and `%h` (host name) in a file name pattern.
pub fn expand_path(pattern: &str, pid: u32, host: &str) -> String {
    pattern.replace("%p", &pid.to_string()).replace("%h", host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_total() {
        let mut a = Report {
            pid: 1,
            host: "n1".into(),
            hits: 10,
            misses: 2,
            ..Report::default()
        };
        a.bypassed.insert("on-demand".into(), 1);
        let b = Report {
            pid: 2,
            host: "n2".into(),
            hits: 5,
            misses: 3,
            peak_entries: 7,
            ..Report::default()
        };
        let text = format!(
            "trace line\n{}\n{}\n",
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
        let parsed = Report::parse_lines(&text).unwrap();
        assert_eq!(parsed, vec![a.clone(), b.clone()]);
        let t = Report::total(&parsed);
        assert_eq!((t.hits, t.misses, t.peak_entries), (15, 5, 7));
        assert_eq!(t.bypassed["on-demand"], 1);
        assert!((a.hit_rate() - 10.0 / 12.0).abs() < 1e-9);
        assert_eq!(
            expand_path("/tmp/mrc.%h.%p.json", 42, "n1"),
            "/tmp/mrc.n1.42.json"
        );
    }
}
