//! The table and the JSON of `mrcache bench`.

use super::admission::access_name;
use super::admission::{Access, Verdict};
use super::control::{Agreement, NAMESPACE_SPREAD, Z_MAX};
use super::measure::{DUTY, Outcome, Row, TRUSTED_ROUNDS};
use super::timing::Spread;
use super::units::{size_text, us};
use std::fmt::Write as _;

fn verdict_text(v: Verdict) -> &'static str {
    match v {
        Verdict::Cache => "cache",
        Verdict::PassThrough => "pass through",
    }
}

/// What the application pays without the cache over the cached figure, paired per round
/// (`Row::speedup`).
fn speedup(r: &Row) -> Option<f64> {
    r.speedup()
}

fn opt_spread(s: &Option<Spread>) -> String {
    s.as_ref().map_or("-".into(), Spread::text)
}

/// All the rows' rounds together: libibverbs alone (dlmopen) against no preload.
fn pooled(o: &Outcome) -> Agreement {
    let ns: Vec<(f64, f64)> = o
        .rows
        .iter()
        .flat_map(|r| r.round_ns.iter().map(|x| (x[0], x[1])))
        .collect();
    Agreement::of(&ns, NAMESPACE_SPREAD)
}

fn agreement_text(a: &Agreement) -> String {
    format!(
        "the first slower in {} of {} rounds (z {:.1}), median ratio {:.3}: {} (within {:.0}%)",
        a.first_slower,
        a.rounds,
        a.z,
        a.median_ratio,
        if a.differ() { "DIFFER" } else { "agree" },
        a.spread * 100.0
    )
}

/// One line naming a row whose no-preload figures are not trustworthy (`Row::no_preload_untrusted`).
pub fn untrusted_text(r: &Row) -> Option<String> {
    let s = r.no_preload.filter(|_| r.no_preload_untrusted())?;
    let what = if r.rounds < TRUSTED_ROUNDS {
        format!(
            "{} round{} only, no spread to judge its figures by (at least {TRUSTED_ROUNDS} needed)",
            r.rounds,
            if r.rounds == 1 { "" } else { "s" }
        )
    } else {
        format!(
            "the no-preload figures range {}-{} µs, wider than their median {} µs",
            us(s.min),
            us(s.max),
            us(s.median)
        )
    };
    Some(format!(
        "warning: {} {}: {what}: its speed-up is not trustworthy (the machine was busy or the device changed speed; run again when idle, or with more --seconds)",
        size_text(r.size),
        access_name(r.access),
    ))
}

fn revoke_text(r: &Row) -> String {
    match (r.access, &r.passed_through, r.revoke_ns) {
        (Access::Local, _, _) => "-".into(),
        (Access::Remote, Some(_), _) => "passed through".into(),
        (Access::Remote, None, Some(ns)) => us(ns),
        (Access::Remote, None, None) => "?".into(),
    }
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_string()
}

pub struct System {
    pub host: String,
    pub cpu: String,
    pub cpus: usize,
    pub kernel: String,
    pub load: String,
    pub monitor: String,
}

pub fn system() -> System {
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let load = read("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    System {
        host: read("/proc/sys/kernel/hostname"),
        cpu,
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        kernel: read("/proc/sys/kernel/osrelease"),
        load,
        monitor: match std::env::var("MRCACHE_MONITOR") {
            Ok(m) => format!("{m} (MRCACHE_MONITOR; the default is patch)"),
            Err(_) => "patch (the default)".into(),
        },
    }
}

pub fn table(o: &Outcome) -> String {
    let sys = system();
    let i = &o.info;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "mrcache bench {}: will the cache help on {}?",
        mrcache::VERSION,
        o.device
    );
    let _ = writeln!(
        s,
        "device: {}, provider {}, fw_ver {}, vendor_id 0x{:04x}, vendor_part_id {}, hw_ver 0x{:x}, memory windows: {}",
        o.device,
        o.provider,
        i.fw_ver,
        i.vendor_id,
        i.vendor_part_id,
        i.hw_ver,
        if i.max_mw > 0 {
            format!("yes (max_mw {})", i.max_mw)
        } else {
            "none (max_mw 0)".into()
        }
    );
    let _ = writeln!(
        s,
        "host: {}, cpu {} ({} CPUs), kernel {}, load average {}",
        sys.host, sys.cpu, sys.cpus, sys.kernel, sys.load
    );
    let _ = writeln!(
        s,
        "libibverbs alone: {} in a link-map namespace of its own (dlmopen); no preload: {} in a control process without libmrcache.so; through the cache: {}",
        o.alone_from, o.no_preload_from, o.cache_hooks
    );
    let _ = writeln!(
        s,
        "clock: one reading costs {:.0} ns here; the timed phases read it once per batch, batches of pairs sized so that it is under 0.1%",
        o.clock_ns
    );
    let env: Vec<String> = o
        .environment
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let _ = writeln!(
        s,
        "configuration: {}{}",
        if std::env::var(super::CHILD_MARK).is_ok_and(|v| v == super::ADMIT_SET) {
            "MRCACHE_ADMIT=always set by the bench (every size cached and measured; the default column is the library's admission decision on the figures); "
        } else {
            ""
        },
        if env.is_empty() {
            "otherwise the defaults (no MRCACHE_* variable set)".to_string()
        } else {
            env.join(" ")
        }
    );
    let hp: Vec<String> = o
        .hit_path
        .iter()
        .map(|h| {
            format!(
                "{} {}: {:.0} ns ({:.0}-{:.0}){}",
                h.regions,
                if h.regions == 1 { "region" } else { "regions" },
                h.ns.median,
                h.ns.min,
                h.ns.max,
                if h.hits { "" } else { " NOT HITS" }
            )
        })
        .collect();
    let _ = writeln!(
        s,
        "hit path, ns per ibv_reg_mr + ibv_dereg_mr hit (monitor {}; 4 KiB regions, median (min-max) of batches of 1,000): {}",
        sys.monitor,
        hp.join(", ")
    );
    let _ = writeln!(
        s,
        "µs per ibv_reg_mr + ibv_dereg_mr, median (min-max) over rounds alternating libibverbs alone, the cache's hit + release, and (every third round) a miss + release on a range the cache does not hold (pages registered before, moved there with mremap), each round's figure a phase's total time over its pairs (what an application doing them pays), and a rest as long as the round after it (registering {:.0}% of the time: the figures are those of an application that rests as long as it registers; one registering back to back can pay more); fresh µs: libibverbs alone on freshly mapped memory, once per row; at most {} s per size\n",
        100.0 * DUTY,
        o.seconds
    );
    let _ = writeln!(
        s,
        "{:<8} {:<6} {:>22} {:>22} {:>22} {:>9} {:>22} {:>9} {:>14} {:>6}  default",
        "size",
        "access",
        "libibverbs µs",
        "no-preload µs",
        "cached µs",
        "speed-up",
        "miss µs",
        "fresh µs",
        "revoke µs",
        "rounds"
    );
    for r in &o.rows {
        let _ = writeln!(
            s,
            "{:<8} {:<6} {:>22} {:>22} {:>22} {:>9} {:>22} {:>9} {:>14} {:>6}  {}",
            size_text(r.size),
            access_name(r.access),
            &r.alone.text(),
            opt_spread(&r.no_preload),
            &r.cached.text(),
            speedup(r).map_or("-".into(), |x| format!("{x:.1}x")),
            &r.miss.text(),
            us(r.fresh_alone.median),
            revoke_text(r),
            r.rounds,
            verdict_text(r.verdict)
        );
    }
    for w in o.rows.iter().filter_map(untrusted_text) {
        let _ = writeln!(s, "{w}");
    }
    let _ = writeln!(
        s,
        "\nno-preload µs: the same pairs through the process's own libibverbs, timed plainly, in a control co-process without the preload, one phase per round on request (as many pairs as that round's libibverbs-alone phase) between the round's libibverbs-alone and cached phases (the order rotated every round); speed-up: the median over the rounds of that round's no-preload / cached. libibverbs alone (dlmopen) against no preload: {} (two differ when |z| > {Z_MAX} and the median ratio is off 1 by more than the spread)",
        agreement_text(&pooled(o)),
    );
    let _ = writeln!(
        s,
        "default: what the cache's cost-aware admission decides for the next miss of the row's class on its figures: mrcache::admission::Classes::decide, i.e. verdict_banded(Costs {{ miss_ns: the mean over the rounds of no-preload µs, cached_ns: the mean over the rounds of cached µs, evict_ns: 0 }}, held: cache), the figures the library's running means of the same calls settle on: pass through only when cached > {} x the miss (the library's figures are its own calls timed the same way)",
        mrcache::admission::BAND_OUT
    );
    for r in o.rows.iter().filter(|r| r.passed_through.is_some()) {
        let _ = writeln!(
            s,
            "  {} {}: {}",
            size_text(r.size),
            access_name(r.access),
            r.passed_through.as_deref().unwrap_or_default()
        );
    }
    let _ = writeln!(
        s,
        "revoke µs: cached remote less cached local of the same size (the window bind at the hit and the unbind at the release); {:.1} s in all: start-up {:.1} s, hit path {:.1} s, the {} sizes' memory (mapping, populating, first registrations) {:.1} s, their measuring {:.1} s (at most {} x {} s), the control process's exit {:.1} s{}",
        o.elapsed.as_secs_f64(),
        o.startup.as_secs_f64(),
        o.hit_path_took.as_secs_f64(),
        o.rows.len() / 2,
        o.memory_took.as_secs_f64(),
        o.sizes_took.saturating_sub(o.memory_took).as_secs_f64(),
        o.rows.len() / 2,
        o.seconds,
        o.control_exit_took.as_secs_f64(),
        if o.on_demand.offered() {
            format!(", on-demand rows {:.1} s", o.on_demand.took.as_secs_f64())
        } else {
            String::new()
        }
    );
    s.push_str(&super::odp::report::text(&o.on_demand, o.seconds));
    s
}

fn agreement_json(a: &Agreement) -> serde_json::Value {
    serde_json::json!({
        "rounds": a.rounds,
        "first_slower": a.first_slower,
        "z": a.z,
        "median_ratio": a.median_ratio,
        "spread": a.spread,
        "differ": a.differ(),
    })
}

pub fn json(o: &Outcome) -> String {
    let sys = system();
    let rows: Vec<serde_json::Value> = o
        .rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "size": r.size,
                "access": access_name(r.access),
                "libibverbs_us": &r.alone.json(),
                "no_preload_us": r.no_preload.as_ref().map(Spread::json),
                "speedup_from": "median of per-round no_preload / cached",
                "rounds_us": r.round_ns.iter().map(|x| x.map(|v| v / 1000.0)).collect::<Vec<_>>(),
                "rounds_us_columns": ["libibverbs_alone", "no_preload", "cached"],
                "namespace": r.namespace.as_ref().map(agreement_json),
                "libibverbs_dereg_us": &r.alone_dereg.json(),
                "cached_us": &r.cached.json(),
                "cached": r.passed_through.is_none(),
                "passed_through": r.passed_through,
                "took_s": r.took.as_secs_f64(),
                "memory_s": r.memory_took.as_secs_f64(),
                "speedup": speedup(r),
                "warning": untrusted_text(r),
                "miss_us": &r.miss.json(),
                "libibverbs_fresh_us": &r.fresh_alone.json(),
                "revoke_us": r.revoke_ns.map(|n| n / 1000.0),
                "rounds": r.rounds,
                "misses": r.misses,
                "default": verdict_text(r.verdict),
                "default_why": r.verdict_why,
                "default_figures_ns": {"miss_ns": r.costs.miss_ns, "cached_ns": r.costs.cached_ns, "evict_ns": r.costs.evict_ns},
            })
        })
        .collect();
    let hit: Vec<serde_json::Value> = o
        .hit_path
        .iter()
        .map(|h| serde_json::json!({"regions": h.regions, "ns": {"median": h.ns.median, "min": h.ns.min, "max": h.ns.max}, "batches": h.batches, "hits": h.hits}))
        .collect();
    let env: serde_json::Map<String, serde_json::Value> = o
        .environment
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::json!(v)))
        .collect();
    serde_json::json!({
        "mrcache": mrcache::VERSION,
        "host": sys.host,
        "cpu": sys.cpu,
        "cpus": sys.cpus,
        "kernel": sys.kernel,
        "load_average": sys.load,
        "device": {
            "name": o.device,
            "provider": o.provider,
            "fw_ver": o.info.fw_ver,
            "vendor_id": o.info.vendor_id,
            "vendor_part_id": o.info.vendor_part_id,
            "hw_ver": o.info.hw_ver,
            "max_mw": o.info.max_mw,
        },
        "libibverbs_alone": o.alone_from,
        "no_preload": o.no_preload_from,
        "control": {"namespace": agreement_json(&pooled(o))},
        "clock_ns": o.clock_ns,
        "cache_hooks": o.cache_hooks,
        "environment": env,
        "admit_always_set_by_bench": std::env::var(super::CHILD_MARK).is_ok_and(|v| v == super::ADMIT_SET),
        "monitor": sys.monitor,
        "seconds_per_size": o.seconds,
        "method": {
            "figure": "each phase's figure is its total time over its pairs (the mean over the phase, what an application doing those pairs pays); a row is the median (min-max) of its rounds' figures; the default is decided on the means over the rounds (what the library's running means settle on)",
            "rest": "after each round the bench sleeps as long as the round's phases took; the miss rounds come after that rest",
            "duty": DUTY,
        },
        "injected_stall_ms": super::control::injected_stall_ms(),
        "hit_path": hit,
        "warnings": o.rows.iter().filter_map(untrusted_text).collect::<Vec<_>>(),
        "rows": rows,
        "elapsed_s": o.elapsed.as_secs_f64(),
        "startup_s": o.startup.as_secs_f64(),
        "hit_path_s": o.hit_path_took.as_secs_f64(),
        "sizes_s": o.sizes_took.as_secs_f64(),
        "memory_s": o.memory_took.as_secs_f64(),
        "control_exit_s": o.control_exit_took.as_secs_f64(),
        "on_demand": super::odp::report::json(&o.on_demand),
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(no_preload: Option<Spread>) -> Row {
        let s = |m: f64| Spread {
            median: m,
            min: m,
            max: m,
        };
        Row {
            size: 64 << 20,
            access: Access::Remote,
            alone: s(20_000.0),
            alone_dereg: s(5_000.0),
            cached: s(30.0),
            passed_through: None,
            miss: s(20_000.0),
            fresh_alone: s(40_000.0),
            revoke_ns: Some(20.0),
            no_preload,
            namespace: None,
            round_ns: vec![[20_000.0, 20_000.0, 30.0]],
            rounds: 5,
            misses: 1,
            costs: Default::default(),
            verdict: Verdict::Cache,
            verdict_why: String::new(),
            took: Default::default(),
            memory_took: Default::default(),
        }
    }

    /// A row whose no-preload figures range wider than their median gets one line naming it.
    #[test]
    fn a_wide_no_preload_spread_is_named() {
        let wide = row(Some(Spread {
            median: 10_000_000.0,
            min: 5_000_000.0,
            max: 15_001_000.0,
        }));
        assert!(wide.no_preload_untrusted());
        let w = untrusted_text(&wide).unwrap();
        assert!(
            w.starts_with("warning: 64 MiB remote: the no-preload figures range 5000-15001 µs, wider than their median 10000 µs")
                && !w.contains('\n'),
            "{w}"
        );
        // Exactly as wide as the median, or no control: no warning.
        for r in [
            row(Some(Spread {
                median: 10_000_000.0,
                min: 5_000_000.0,
                max: 15_000_000.0,
            })),
            row(None),
        ] {
            assert!(!r.no_preload_untrusted() && untrusted_text(&r).is_none());
        }
    }

    /// A row with one round (the 64 MiB rows at the default options on a
    /// loaded node, docs/usage.md) has no range to judge, so it never gets a warning: the
    /// least measured rows read as trustworthy. Asserts a warning (or a line saying it
    /// could not be judged).
    #[test]
    fn a_one_round_row_is_not_silently_trusted() {
        let mut one = row(Some(Spread::of(&[6_069_000.0])));
        one.rounds = 1;
        assert!(
            untrusted_text(&one).is_some(),
            "a row of {} round gets no warning: {:?}",
            one.rounds,
            one.no_preload
        );
    }
}
