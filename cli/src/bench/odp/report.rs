//! The on-demand rows' text (after the table) and their part of the JSON.

use super::super::timing::Spread;
use super::super::units::size_text;
use super::device::rc_caps_text;
use super::offsets::{LEN, WITHIN};
use super::profile::{figures, profile};
use super::{Row, Section, paired};
use std::fmt::Write as _;

/// Columns of `Row::round_ns`.
const PINNED: usize = 0;
const ON_DEMAND: usize = 1;
const WRITE: usize = 2;
const FIRST_WRITE: usize = 3;

fn ratio(x: Option<f64>) -> String {
    x.filter(|v| v.is_finite())
        .map_or("-".into(), |v| format!("{v:.2}x"))
}

/// The ratios of a row: on-demand over pinned pair, first write over pinned write (each
/// the median over the rounds of its paired ratio); the cached on-demand hit over the
/// table's pinned hit; the pinned and the on-demand pair alone over the cached hit.
pub struct Ratios {
    pub on_demand_over_pinned: f64,
    pub first_over_write: f64,
    pub cached_over_pinned_hit: Option<f64>,
    pub pinned_over_cached: Option<f64>,
    pub on_demand_over_cached: Option<f64>,
}

pub fn ratios(r: &Row) -> Ratios {
    let cached = r.cached.as_ref().ok().map(|s| s.median);
    Ratios {
        on_demand_over_pinned: paired(&r.round_ns, ON_DEMAND, PINNED),
        first_over_write: paired(&r.round_ns, FIRST_WRITE, WRITE),
        cached_over_pinned_hit: cached.zip(r.cached_pinned_ns).map(|(c, p)| c / p),
        pinned_over_cached: cached.map(|c| r.column(PINNED).median / c),
        on_demand_over_cached: cached.map(|c| r.column(ON_DEMAND).median / c),
    }
}

pub fn text(s: &Section, seconds: f64) -> String {
    let mut o = String::new();
    if let Some(line) = s.why_none() {
        let _ = writeln!(o, "{line}");
        return o;
    }
    let _ = writeln!(
        o,
        "\non-demand paging (ODP): {} pages RC {} on demand. µs, median (min-max) over rounds, libibverbs alone: ibv_reg_mr + ibv_dereg_mr pinned and with IBV_ACCESS_ON_DEMAND, alternating in each round; write: the device's RDMA WRITE over the whole of a pinned registration held for the row, first write: the same into a fresh on-demand registration of pages no registration mapped (a loopback RC queue pair; registrations untimed; each round's figure the mean of up to 8 writes; a rest as long as each round after it); cached: hit + release on an on-demand entry through the cache with MRCACHE_ODP=on (a co-process); od/pin and first/write: the median over the rounds of each round's ratio; /hit: cached over the table's cached µs of the size (local, a pinned entry); speed-up: libibverbs alone pinned, and on demand, over cached\n",
        s.device,
        rc_caps_text(*s.rc_caps.as_ref().unwrap_or(&0))
    );
    let _ = writeln!(
        o,
        "{:<12} {:>22} {:>22} {:>7} {:>22} {:>22} {:>11} {:>22} {:>7} {:>16} {:>6}",
        "size",
        "pinned µs",
        "on-demand µs",
        "od/pin",
        "write µs",
        "first write µs",
        "first/write",
        "cached µs",
        "/hit",
        "speed-up pin/od",
        "rounds"
    );
    for r in &s.rows {
        let x = ratios(r);
        let _ = writeln!(
            o,
            "{:<12} {:>22} {:>22} {:>7} {:>22} {:>22} {:>11} {:>22} {:>7} {:>16} {:>6}",
            format!("odp {}", size_text(r.size)),
            &r.column(PINNED).text(),
            &r.column(ON_DEMAND).text(),
            ratio(Some(x.on_demand_over_pinned)),
            &r.column(WRITE).text(),
            &r.column(FIRST_WRITE).text(),
            ratio(Some(x.first_over_write)),
            r.cached.as_ref().map_or("-".into(), Spread::text),
            ratio(x.cached_over_pinned_hit),
            format!(
                "{}/{}",
                ratio(x.pinned_over_cached),
                ratio(x.on_demand_over_cached)
            ),
            r.round_ns.len()
        );
    }
    for r in &s.rows {
        if let Err(why) = &r.cached {
            let _ = writeln!(o, "  odp {} cached: {why}", size_text(r.size));
        }
    }
    if let Some(why) = &s.stopped {
        let _ = writeln!(o, "on-demand rows stopped: {why}");
    }
    let _ = writeln!(o, "{}", offsets_text(s));
    let _ = writeln!(
        o,
        "on-demand profile: {}",
        profile(s).map_or_else(|why| format!("none: {why}"), |p| p.summary())
    );
    let _ = writeln!(
        o,
        "on-demand rows: {:.1} s (at most {} x {} s, and the co-process's start)",
        s.took.as_secs_f64(),
        s.rows.len().max(1),
        seconds * 5.0 / 8.0
    );
    o
}

/// Whether the device's on-demand transfers keep their offsets, in one line.
pub fn offsets_text(s: &Section) -> String {
    let sent =
        format!("{LEN} bytes RDMA-written at offset {WITHIN} of a fresh on-demand registration");
    match &s.offsets {
        None => "on-demand offsets: not checked".into(),
        Some(Err(why)) => format!("on-demand offsets: not known: {why}"),
        Some(Ok(o)) if o.kept => format!(
            "on-demand offsets: {} keeps them: {sent} landed there",
            s.device
        ),
        Some(Ok(o)) => format!(
            "on-demand offsets: {} misplaces data: {sent} landed {}",
            s.device,
            o.landed_at
                .map_or("nowhere in its first page".into(), |at| format!(
                    "at offset {at}"
                ))
        ),
    }
}

pub fn json(s: &Section) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = s
        .rows
        .iter()
        .map(|r| {
            let x = ratios(r);
            let f = figures(r);
            serde_json::json!({
                "size": r.size,
                "rounds": r.round_ns.len(),
                "pinned_us": &r.column(PINNED).json(),
                "on_demand_us": &r.column(ON_DEMAND).json(),
                "write_us": &r.column(WRITE).json(),
                "first_write_us": &r.column(FIRST_WRITE).json(),
                "rounds_us": r.round_ns.iter().map(|x| x.map(|v| v / 1000.0)).collect::<Vec<_>>(),
                "rounds_us_columns": ["pinned", "on_demand", "write", "first_write"],
                "on_demand_over_pinned": x.on_demand_over_pinned,
                "first_write_over_write": x.first_over_write,
                "cached_us": r.cached.as_ref().ok().map(Spread::json),
                "cached_why_not": r.cached.as_ref().err(),
                "cached_over_pinned_hit": x.cached_over_pinned_hit,
                "speedup_over_pinned": x.pinned_over_cached,
                "speedup_over_on_demand": x.on_demand_over_cached,
                "first_touch_us": f.first_touch_us,
                "miss_over_pinned": f.miss_over_pinned,
                "took_s": r.took.as_secs_f64(),
            })
        })
        .collect();
    let p = profile(s);
    serde_json::json!({
        "offered": s.offered(),
        "rc_odp_caps": s.rc_caps.as_ref().ok(),
        "rc_odp_caps_text": s.rc_caps.as_ref().ok().map(|c| rc_caps_text(*c)),
        "why_none": s.why_none(),
        "stopped": s.stopped,
        "took_s": s.took.as_secs_f64(),
        "vendor": s.ids.as_ref().map(|(v, _, _)| v),
        "part": s.ids.as_ref().map(|(_, p, _)| p),
        "firmware": s.ids.as_ref().map(|(_, _, f)| f),
        "offsets_kept": s.offsets.as_ref().and_then(|o| o.as_ref().ok()).map(|o| o.kept),
        "offsets_landed_at": s.offsets.as_ref().and_then(|o| o.as_ref().ok()).and_then(|o| o.landed_at),
        "offsets_why_not": s.offsets.as_ref().and_then(|o| o.as_ref().err()),
        "rows": rows,
        "on_demand_from": p.as_ref().ok().and_then(|p| p.on_demand_from),
        "profile": p.as_ref().ok().map(|p| p.summary()),
        "profile_why_not": p.as_ref().err(),
    })
}
