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
        firmware: firmware.trim().to_string(),
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
    let text = p.render();
    // What the jobs will read must be what was measured.
    if OdpProfile::parse(&text).as_ref() != Ok(&p) {
        return Err(format!(
            "--odp-profile {}: no profile written: it would not read back as measured (a device name or firmware version with characters a profile cannot hold?)",
            path.display()
        ));
    }
    let tmp = temporary(path);
    let mut f = create_new(&tmp).map_err(cannot)?;
    let written = (|| {
        std::io::Write::write_all(&mut f, text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(cannot)
}

/// The temporary name `path` is written under before the rename: a short dot file beside
/// it, this process's.
pub fn temporary(path: &Path) -> std::path::PathBuf {
    path.with_file_name(format!(".odp-profile.{}.tmp", std::process::id()))
}

/// A file created at `path` that was not there (a link planted at the name is not
/// followed), readable by all as the profile must be.
pub fn create_new(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
}
