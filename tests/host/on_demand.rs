//! On-demand entries (`MRCACHE_ODP`, docs/design/odp.md) through libmrcache.so and the fake
//! extended context of tests/c/host/on_demand.c, whose query_device_ex op says whether its
//! device pages on demand.

use crate::common;

use std::path::PathBuf;

fn run(scenario: &str, env: &[(&str, &str)]) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("on_demand");
    // One build per scenario and environment: tests running at once never share one.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(env, &mut h);
    let tag = format!(
        "{}_{:x}",
        scenario.replace(' ', "_"),
        std::hash::Hasher::finish(&h)
    );
    let (shim, prog) = common::shim_and_program(
        "host",
        "on_demand_shim",
        "on_demand",
        &dir,
        &tag,
        &["-libverbs"],
    );
    let out = std::process::Command::new(&prog)
        .args(scenario.split(' '))
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

/// A profile file for the fake devices: Mellanox's vendor id (0x2c9) and part 4129, or rxe's
/// (`rxe`), saying whether on-demand transfers keep their offsets, on demand from `from`.
fn profile(name: &str, rxe: bool, kept: bool, from: Option<u64>) -> String {
    write_profile(name, rxe, kept, from, "", &mrcache::node::running_kernel())
}

/// `profile`, measured on `firmware` (the fake devices report none) under `kernel`.
fn write_profile(
    name: &str,
    rxe: bool,
    kept: bool,
    from: Option<u64>,
    firmware: &str,
    kernel: &str,
) -> String {
    use mrcache::config::OdpProfile;
    let p = OdpProfile {
        device: name.into(),
        vendor: if rxe { 0xff_ffff } else { 0x2c9 },
        part: if rxe { 0 } else { 4129 },
        firmware: firmware.into(),
        kernel: kernel.into(),
        offsets_kept: kept,
        sizes: Vec::new(),
        on_demand_from: from,
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("on_demand");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.profile"));
    std::fs::write(&path, p.render()).unwrap();
    path.to_string_lossy().into_owned()
}

/// Under `auto` with the patch monitor seeing every unmap, a profile of the device's kind
/// that says an on-demand miss pays from 64 KiB makes the 64 KiB and 1 MiB entries on
/// demand and keeps the 4 KiB one pinned; without a profile, with one of another kind
/// (vendor or part), or one that found the device misplacing data, every entry is pinned.
/// Seen failing before the policy read the profile: `sizes: on demand: none` where the
/// profile pays.
#[test]
fn auto_registers_on_demand_from_the_size_the_profile_says_pays() {
    let sizes = |env: &[(&str, &str)]| {
        let mut e = vec![("MRCACHE_MONITOR", "patch")];
        e.extend_from_slice(env);
        common::line(&run("sizes 4", &e), "sizes:").to_string()
    };
    let out = run("sizes 4", &[("MRCACHE_MONITOR", "patch")]);
    assert_eq!(common::line(&out, "sizes:"), "sizes: on demand: none");
    assert_eq!(
        common::line(&out, "registrations:"),
        "registrations: 3 of 6 pairs"
    );
    let pays = profile("pays", false, true, Some(65536));
    assert_eq!(
        sizes(&[("MRCACHE_ODP_PROFILE", &pays)]),
        "sizes: on demand: 65536 1048576"
    );
    let other = profile("other", true, true, Some(4096));
    assert_eq!(
        sizes(&[("MRCACHE_ODP_PROFILE", &other)]),
        "sizes: on demand: none",
        "a profile of another kind of device"
    );
    let misplaced = profile("misplaced", false, false, Some(4096));
    assert_eq!(
        sizes(&[("MRCACHE_ODP_PROFILE", &misplaced)]),
        "sizes: on demand: none"
    );
    let firmware = write_profile(
        "firmware",
        false,
        true,
        Some(4096),
        "16.35.2000",
        &mrcache::node::running_kernel(),
    );
    assert_eq!(
        sizes(&[("MRCACHE_ODP_PROFILE", &firmware)]),
        "sizes: on demand: none",
        "a profile of another firmware"
    );
    let kernel = write_profile("kernel", false, true, Some(4096), "", "2.6.32-old");
    assert_eq!(
        sizes(&[("MRCACHE_ODP_PROFILE", &kernel)]),
        "sizes: on demand: none",
        "a profile measured under another kernel"
    );
    let never = profile("never", false, true, None);
    assert_eq!(
        sizes(&[("MRCACHE_ODP_PROFILE", &never)]),
        "sizes: on demand: none"
    );
    assert_eq!(
        sizes(&[("MRCACHE_ODP_PROFILE", &pays), ("MRCACHE_ODP", "off")]),
        "sizes: on demand: none",
        "the profile is read under auto only"
    );
}

/// rxe is never chosen by `auto` without a profile (its on-demand copy misplaces data on the
/// kernels tested); a profile of rxe whose offset check passed makes it chosen, as any
/// device. Seen failing before: `sizes: on demand: none` with the profile.
#[test]
fn a_profile_that_found_offsets_kept_lets_auto_choose_rxe() {
    let env = |p: Option<&str>| {
        let mut e = vec![("MRCACHE_MONITOR", "patch")];
        e.extend(p.map(|p| ("MRCACHE_ODP_PROFILE", p)));
        common::line(&run("sizes 5", &e), "sizes:").to_string()
    };
    assert_eq!(env(None), "sizes: on demand: none");
    let kept = profile("rxe_kept", true, true, Some(4096));
    assert_eq!(env(Some(&kept)), "sizes: on demand: 4096 65536 1048576");
}

/// A device the profile found misplacing data is not chosen even where pinning fails for
/// want of lockable memory: the app's registration fails as libibverbs' would. Seen failing
/// before: `memlock: mr ok errno 0 (on demand 1)`.
#[test]
fn a_device_that_misplaces_data_is_not_chosen_where_pinning_fails() {
    let misplaced = profile("memlock_misplaced", false, false, None);
    let out = run(
        "memlock",
        &[
            ("MRCACHE_MONITOR", "patch"),
            ("MRCACHE_ODP_PROFILE", &misplaced),
        ],
    );
    assert_eq!(
        common::line(&out, "memlock:"),
        "memlock: mr NULL errno 12 (on demand 0)"
    );
}

/// A profile that cannot be read, or is not one, prints one line naming the variable, the
/// file and what is wrong, and the process runs with the cache off (each pair reaches the
/// provider: six of six, where the cache makes three).
#[test]
fn a_bad_profile_turns_the_cache_off_with_one_line() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("on_demand");
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.profile");
    std::fs::write(&bad, "mrcache on-demand profile 1\noffsets sideways\n").unwrap();
    let bad = bad.to_string_lossy().into_owned();
    let missing = dir.join("missing.profile").to_string_lossy().into_owned();
    for (path, why) in [
        (
            &bad,
            "line 2: offsets \"sideways\": allowed: kept, misplaced",
        ),
        (&missing, "cannot read it"),
        (&"relative.profile".to_string(), "a relative path"),
    ] {
        let out = run(
            "sizes 4",
            &[("MRCACHE_MONITOR", "patch"), ("MRCACHE_ODP_PROFILE", path)],
        );
        let line = common::line(&out, "mrcache: MRCACHE_ODP_PROFILE=");
        assert!(
            line.contains(why) && line.ends_with("the cache is off for this process"),
            "{line}"
        );
        assert_eq!(
            common::line(&out, "registrations:"),
            "registrations: 6 of 6 pairs"
        );
    }
}

/// Remote registrations are made on demand by a profile only under `MRCACHE_REMOTE=revoke`
/// (the fake device has no memory windows, so there they pass through): under `keep` the
/// registration's own key would reach whatever lives at the address after an unmap. Seen
/// failing before: `remote: on demand: remote 1, local 1` under `keep`.
#[test]
fn a_profile_makes_remote_entries_on_demand_only_under_revoke() {
    let pays = profile("remote_pays", false, true, Some(4096));
    let out = run(
        "remote",
        &[
            ("MRCACHE_MONITOR", "patch"),
            ("MRCACHE_REMOTE", "keep"),
            ("MRCACHE_ODP_PROFILE", &pays),
        ],
    );
    assert_eq!(
        common::line(&out, "remote:"),
        "remote: on demand: remote 0, local 1"
    );
}

/// An on-demand registration refused for want of memory (ENOMEM) is pinned, and the device
/// keeps its standing: the next registrations are on demand again. Seen failing before:
/// `transient: registrations 3 (on demand 0)` (the device demoted for the process).
#[test]
fn a_transient_enomem_does_not_demote_the_device() {
    let pays = profile("transient_pays", false, true, Some(4096));
    let out = run(
        "transient",
        &[("MRCACHE_MONITOR", "patch"), ("MRCACHE_ODP_PROFILE", &pays)],
    );
    assert_eq!(
        common::line(&out, "transient:"),
        "transient: registrations 3 (on demand 2)"
    );
}

/// The profile is opened only where it is used: a FIFO does not hold the set-up (it is not
/// a regular file: one line, the cache off, at once), and a missing file is no problem under
/// `MRCACHE_ODP=on` or `off` or with the cache off. Seen failing before: the FIFO's run
/// never ended (killed after 20 s), and `on` with a missing file printed its line and turned
/// the cache off (6 of 6 pairs).
#[test]
fn the_profile_is_opened_only_where_used_and_never_blocks() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("on_demand");
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo.profile");
    let _ = std::fs::remove_file(&fifo);
    let c = std::ffi::CString::new(fifo.to_string_lossy().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let fifo = fifo.to_string_lossy().into_owned();
    let t = std::time::Instant::now();
    let out = run(
        "sizes 4",
        &[("MRCACHE_MONITOR", "patch"), ("MRCACHE_ODP_PROFILE", &fifo)],
    );
    assert!(t.elapsed().as_secs() < 20, "the set-up blocked on a FIFO");
    assert!(
        common::line(&out, "mrcache: MRCACHE_ODP_PROFILE=").contains("not a regular file"),
        "{out}"
    );
    let missing = dir
        .join("never-written.profile")
        .to_string_lossy()
        .into_owned();
    for env in [&[("MRCACHE_ODP", "on")][..], &[("MRCACHE_ODP", "off")][..]] {
        let mut e = vec![
            ("MRCACHE_MONITOR", "patch"),
            ("MRCACHE_ODP_PROFILE", missing.as_str()),
        ];
        e.extend_from_slice(env);
        let out = run("sizes 4", &e);
        assert!(!out.contains("MRCACHE_ODP_PROFILE="), "{env:?}: {out}");
        assert_eq!(
            common::line(&out, "registrations:"),
            "registrations: 3 of 6 pairs",
            "{env:?}"
        );
    }
}
