//! The byte cap this process runs under and why (`MRCACHE_MAX_BYTES`, or the default
//! divided among the node's ranks and kept under `RLIMIT_MEMLOCK`: `mrcache::node`), kept
//! for the statistics.

use mrcache::config::Config;
use mrcache::stats::Report;
use std::sync::OnceLock;

struct Budget {
    max_bytes: u64,
    why: String,
    local_ranks: u64,
    memlock: String,
}

static BUDGET: OnceLock<Budget> = OnceLock::new();

/// Remember the configuration's cap (runtime set-up, once).
pub fn record(config: &Config) {
    let _ = BUDGET.set(Budget {
        max_bytes: config.max_bytes,
        why: config.max_bytes_why.clone(),
        local_ranks: config.local_ranks.map_or(0, |r| r.count as u64),
        memlock: config.memlock.to_string(),
    });
}

pub fn fill(r: &mut Report) {
    if let Some(b) = BUDGET.get() {
        r.max_bytes = b.max_bytes;
        r.max_bytes_why = b.why.clone();
        r.local_ranks = b.local_ranks;
        r.memlock = b.memlock.clone();
    }
}
