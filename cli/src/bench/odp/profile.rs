//! The on-demand profile the rows make (`mrcache::config::odp_profile`): per size the
//! figures `MRCACHE_ODP=auto` decides from, the device's ids and where its on-demand writes
//! land; written by `mrcache bench --odp-profile FILE`.

use super::super::timing::Spread;
use super::{Row, Section};
use mrcache::config::odp_profile::{OdpProfile, SizeFigures, on_demand_from};
use std::path::Path;

/// Columns of `Row::round_ns`.
const PINNED: usize = 0;
const ON_DEMAND: usize = 1;
const WRITE: usize = 2;
const FIRST_WRITE: usize = 3;

fn median_of(rounds: &[[f64; 4]], f: impl Fn(&[f64; 4]) -> f64) -> f64 {
    Spread::of(&rounds.iter().map(f).collect::<Vec<_>>()).median
}

/// A row's figures (µs): the pinned and the on-demand pair, each the median of its column;
/// the first touch, the median of the rounds' first write less their write into the pinned
/// registration; an on-demand miss (its pair and first touch) over a pinned one, the median
/// of the rounds' ratios.
pub fn figures(r: &Row) -> SizeFigures {
    let rounds = &r.round_ns;
    let ratios = Spread::of(
        &rounds
            .iter()
            .map(|x| (x[ON_DEMAND] + x[FIRST_WRITE] - x[WRITE]) / x[PINNED])
            .collect::<Vec<_>>(),
    );
    SizeFigures {
        size: r.size as u64,
        rounds: rounds.len() as u32,
        pinned_us: median_of(rounds, |x| x[PINNED]) / 1000.0,
        on_demand_us: median_of(rounds, |x| x[ON_DEMAND]) / 1000.0,
        first_touch_us: median_of(rounds, |x| x[FIRST_WRITE] - x[WRITE]) / 1000.0,
        miss_over_pinned: ratios.median,
        miss_over_pinned_min: ratios.min,
        miss_over_pinned_max: ratios.max,
    }
}

/// The profile of the section, or why there is none (one line).
pub fn profile(s: &Section) -> Result<OdpProfile, String> {
    if let Some(why) = s.why_none() {
        return Err(why.trim_start_matches("on-demand paging: ").to_string());
    }
    if let Some(why) = &s.stopped {
        return Err(format!("the on-demand rows stopped: {why}"));
    }
    let offsets_kept = match &s.offsets {
        Some(Ok(o)) => o.kept,
        Some(Err(why)) => {
            return Err(format!(
                "where {}'s on-demand writes land is not known: {why}",
                s.device
            ));
        }
        None => return Err("the offset check did not run".into()),
    };
    let (vendor, part, firmware) = s.ids.clone().ok_or_else(|| {
        format!(
            "{}'s vendor and part ids cannot be read (ibv_query_device failed)",
            s.device
        )
    })?;
    let sizes: Vec<SizeFigures> = s.rows.iter().map(figures).collect();
    if let Some(bad) = sizes.iter().find(|z| {
        ![
            z.pinned_us,
            z.on_demand_us,
            z.first_touch_us,
            z.miss_over_pinned,
        ]
        .iter()
        .all(|v| v.is_finite())
    }) {
        return Err(format!("no figures for {} bytes", bad.size));
    }
    if sizes.is_empty() {
        return Err("no on-demand rows".into());
    }
    Ok(OdpProfile {
        device: s.device.clone(),
        vendor,
        part,
        firmware,
        kernel: mrcache::node::running_kernel(),
        offsets_kept,
        on_demand_from: on_demand_from(&sizes),
        sizes,
    })
}

/// `--odp-profile FILE`: the profile written to `path`, or why not (one line; nothing is
/// written then).
pub fn write(s: &Section, path: &Path) -> Result<(), String> {
    let p = profile(s).map_err(|why| {
        format!(
            "--odp-profile {}: no profile written: {why}",
            path.display()
        )
    })?;
    let cannot =
        |e: std::io::Error| format!("--odp-profile {}: cannot write it: {e}", path.display());
    // Whole or not at all: a job starting meanwhile reads the old profile or the new one.
    let tmp = temporary(path);
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut f, p.render().as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(cannot)
}

/// The temporary name `path` is written under before the rename: a dot file beside it.
pub fn temporary(path: &Path) -> std::path::PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}
