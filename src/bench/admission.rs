//! What the default would do for a size: the cost-aware admission's verdict on the figures
//! the bench measured.
//!
//! STAND-IN until issue 21's `mrcache::admission` is merged (same names): caches where a
//! cached round is cheaper than a registration by libibverbs alone.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Local,
    Remote,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Costs {
    pub miss_ns: f64,
    pub cached_ns: f64,
    pub evict_ns: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Cache,
    PassThrough,
}

pub fn verdict(_access: Access, costs: &Costs) -> Verdict {
    if costs.cached_ns < costs.miss_ns {
        Verdict::Cache
    } else {
        Verdict::PassThrough
    }
}

/// The verdict and the words that say on which figures.
pub fn describe(access: Access, costs: &Costs) -> (Verdict, String) {
    let v = verdict(access, costs);
    (
        v,
        format!(
            "stand-in rule (issue 21 not merged): cache when cached {:.0} ns < libibverbs {:.0} ns",
            costs.cached_ns, costs.miss_ns
        ),
    )
}
