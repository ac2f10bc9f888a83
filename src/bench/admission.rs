//! What the default would do for a size: the verdict of the cache's cost-aware admission
//! (`mrcache::admission`, issue 21) on the figures the bench measured.

pub use mrcache::admission::{Access, Costs, Verdict, verdict};

/// The figures the default's model is given for a row: `miss_ns` = a registration and
/// deregistration without the cache (libibverbs alone here; the cache times its own
/// provider calls), `cached_ns` = a hit and its release (with the window bind and unbind
/// for remote access). `evict_ns`, an eviction's bookkeeping beyond the deregistration, is
/// not measured here: 0 (the verdict at a hit ratio of 1 does not count it).
pub fn costs(alone_ns: f64, cached_ns: f64) -> Costs {
    Costs {
        miss_ns: alone_ns,
        cached_ns,
        evict_ns: 0.0,
    }
}

/// The verdict, and on which figures.
pub fn describe(access: Access, costs: &Costs) -> (Verdict, String) {
    let v = verdict(access, costs);
    (
        v,
        format!(
            "mrcache::admission::verdict({}, miss_ns {:.0}, cached_ns {:.0}) = {v}",
            access.name(),
            costs.miss_ns,
            costs.cached_ns
        ),
    )
}
