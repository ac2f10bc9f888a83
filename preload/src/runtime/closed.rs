//! Failing closed: when the monitor cannot see every unmap, caching stops (one line, once),
//! unless only registrations the device makes on demand are cached; and the patch check that
//! finds another patcher's overwrite of our jumps, run at set-up, on the full path and on
//! every drain cycle.

use crate::monitor::patch;
use crate::trace;
use crate::verbs::provider::Provider;
use mrcache::cache::Cache;

/// Memory could now go away unseen (`why`): stop caching (one line, once), unless only
/// registrations the device makes on demand are cached already (`on_demand_only`, decided
/// at set-up), which stay correct whatever the monitor misses. Registrations are made and
/// released uncached from here on; entries in use are deregistered at their release.
pub fn fail_closed(cache: &Cache<Provider>, why: &str) {
    if cache.registrar().odp.only_why().is_some() {
        return;
    }
    if cache.stop_caching(why) {
        trace::write_line(&format!(
            "mrcache[{}]: caching is OFF: {why}; every registration now passes through uncached",
            std::process::id()
        ));
    }
}

/// Cache only registrations the device makes on demand, for `why` (at set-up, before the
/// cache serves anything); false under `MRCACHE_ODP=off`.
pub fn on_demand_only(cache: &Cache<Provider>, why: &str) -> bool {
    if !cache.registrar().odp.only(why) {
        return false;
    }
    trace::write_line(&format!(
        "mrcache[{}]: only registrations the device makes on demand (ODP) are cached: {why}; the others pass through uncached",
        std::process::id()
    ));
    true
}

/// Fail closed when another patcher wrote over one of our jumps in libc. A few byte
/// compares: run at the cache's creation, before every registration and on every
/// background drain cycle.
pub fn check_patches(cache: &Cache<Provider>) {
    if cache.caching_stopped().is_some() {
        return;
    }
    if let Some(name) = patch::overwritten() {
        fail_closed(
            cache,
            &format!(
                "the {} entry point (libc's, or mrcache's own hook) was overwritten by another code patcher (UCX, Open MPI, libfabric, a profiler?) after mrcache's start; memory released through it is no longer seen",
                name.to_string_lossy()
            ),
        );
    }
}

/// `check_patches` on the registration hooks' full path, which every miss and every call
/// passed through takes: while the watch word is clean no watched page changed since the
/// last full check, so no site can have (the fast hit's own rule, docs/design/monitor.md, "The
/// patch check"); every site is read only while it is not. The drain thread and
/// the set-up still read every site (`check_patches`).
pub fn check_patches_watched(cache: &Cache<Provider>) {
    if patch::watch_clean() {
        return;
    }
    check_patches(cache);
}
