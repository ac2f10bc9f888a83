//! On-demand entries (`MRCACHE_ODP`, docs/design/odp.md) through libmrcache.so and the fake
//! extended context of tests/c/host/on_demand.c, whose query_device_ex op says whether its
//! device pages on demand.

use crate::common;

use std::path::PathBuf;

fn run(scenario: &str, env: &[(&str, &str)]) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("on_demand");
    let tag = format!("{scenario}_{}", env.len());
    let (shim, prog) = common::shim_and_program(
        "host",
        "on_demand_shim",
        "on_demand",
        &dir,
        &tag,
        &["-libverbs"],
    );
    let out = std::process::Command::new(&prog)
        .arg(scenario)
        .env("LD_PRELOAD", common::preload_with(&shim))
        .env("MRCACHE_ADMIT", "always")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let t = common::text(&out);
    println!("{t}");
    assert_eq!(out.status.code(), Some(0), "{t}");
    t
}

/// What a device pages on demand is asked again for a context opened after
/// `ibv_close_device`: the allocator may put another device's context at the same address,
/// and a registration on a device without ODP must not be asked ON_DEMAND. Seen failing
/// with the first context's answer kept: `reopen: mr NULL errno 95` (EOPNOTSUPP).
#[test]
fn a_context_at_a_closed_ones_address_is_asked_again() {
    for env in [
        &[("MRCACHE_MONITOR", "patch"), ("MRCACHE_ODP", "on")][..],
        &[("MRCACHE_MONITOR", "none"), ("MRCACHE_ODP", "on")][..],
    ] {
        let out = run("reopen", env);
        assert_eq!(
            common::line(&out, "reopen:"),
            "reopen: mr ok errno 0",
            "{env:?}"
        );
    }
}

/// An on-demand entry follows whatever backs its range: `MRCACHE_VERIFY=pfn` finds no
/// mismatch in it when new pages replace the old, and the hit stays a hit. Seen failing
/// with `VERIFY MISMATCH: ... the cache missed an unmap; treated as a miss` and 2 provider
/// registrations.
#[test]
fn verify_leaves_on_demand_entries_alone() {
    let env = [
        ("MRCACHE_MONITOR", "none"),
        ("MRCACHE_ODP", "on"),
        ("MRCACHE_VERIFY", "pfn"),
    ];
    let out = run("verify", &env);
    assert!(!out.contains("VERIFY MISMATCH"), "{out}");
    assert_eq!(
        common::line(&out, "verify:"),
        "verify: provider registrations 1 (on demand 1)"
    );
}

/// A registration the on-demand policy refuses (another device, without ODP) is passed
/// through before room is made for it: it evicts no cached entry. With room for one entry,
/// the ODP device's pair is a hit in every round after the first. Seen failing with the
/// refused pair evicting it each round: `evict: provider registrations on the ODP device 5
/// of 5`.
#[test]
fn a_refused_registration_evicts_nothing() {
    let env = [
        ("MRCACHE_MONITOR", "none"),
        ("MRCACHE_ODP", "on"),
        ("MRCACHE_MAX_ENTRIES", "1"),
    ];
    let out = run("evict", &env);
    assert_eq!(
        common::line(&out, "evict:"),
        "evict: provider registrations on the ODP device 1 of 5"
    );
}

/// `MRCACHE_ODP=on` with a blind monitor caches the entries a device makes on demand,
/// whichever device's registration set the library up (docs/configuration.md): here the
/// first one is on a device without ODP. Seen failing with caching turned off instead:
/// `blind_on: provider registrations on the ODP device 5 of 5`.
#[test]
fn on_with_a_blind_monitor_caches_on_demand_entries() {
    let env = [("MRCACHE_MONITOR", "symbols"), ("MRCACHE_ODP", "on")];
    let out = run("blind_on", &env);
    assert_eq!(
        common::line(&out, "blind_on:"),
        "blind_on: provider registrations on the ODP device 1 of 5"
    );
    assert!(
        out.contains("only registrations the device makes on demand"),
        "{out}"
    );
}

/// Under the default `auto`, a registration the device cannot pin for want of lockable
/// memory (ENOMEM: the memlock limit) is made on demand instead, on a device that pages every
/// transport on demand: it pins nothing, and the monitor still sees its unmaps. Seen failing
/// before the fallback: `memlock: mr NULL errno 12 (on demand 0)`; with `MRCACHE_ODP=off`
/// it still fails so.
#[test]
fn auto_registers_on_demand_where_pinning_fails() {
    let out = run("memlock", &[("MRCACHE_MONITOR", "patch")]);
    assert_eq!(
        common::line(&out, "memlock:"),
        "memlock: mr ok errno 0 (on demand 1)"
    );
    let out = run(
        "memlock",
        &[("MRCACHE_MONITOR", "patch"), ("MRCACHE_ODP", "off")],
    );
    assert_eq!(
        common::line(&out, "memlock:"),
        "memlock: mr NULL errno 12 (on demand 0)"
    );
}

/// A device whose capabilities say it pages on demand but which refuses an on-demand
/// registration (EINVAL, as a kernel with ODP turned off does) never fails the app's
/// registration: under `MRCACHE_ODP=on` with the patch monitor the entry is pinned instead
/// and cached (one provider registration for five pairs); with only on-demand entries cached
/// (`MRCACHE_MONITOR=none`) each registration passes through to libibverbs, pinned and
/// uncached (five). Seen failing before the fallback: `refused: mr NULL errno 22, provider
/// registrations 0 of 5 (on demand 0)` in both.
#[test]
fn a_device_that_refuses_on_demand_gets_pinned_registrations() {
    let out = run(
        "refused",
        &[("MRCACHE_MONITOR", "patch"), ("MRCACHE_ODP", "on")],
    );
    assert_eq!(
        common::line(&out, "refused:"),
        "refused: mr ok errno 0, provider registrations 1 of 5 (on demand 0)"
    );
    let out = run(
        "refused",
        &[("MRCACHE_MONITOR", "none"), ("MRCACHE_ODP", "on")],
    );
    assert_eq!(
        common::line(&out, "refused:"),
        "refused: mr ok errno 0, provider registrations 5 of 5 (on demand 0)"
    );
}
