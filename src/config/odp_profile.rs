//! The on-demand profile (`MRCACHE_ODP_PROFILE`): what `mrcache bench --odp-profile`
//! measured on one kind of device, and where `MRCACHE_ODP=auto` registers entries on demand
//! because it pays there.
//!
//! An entry made on demand costs at its miss what the device takes to register it plus, at
//! the device's first use of its pages, the fault that maps them; a pinned one costs its
//! registration. The bench measures both per size on the device itself (a loopback RDMA
//! WRITE is the first use), and whether the device's on-demand transfers land where they
//! were sent. The rule (`on_demand_from`): on demand from the smallest measured size at and
//! above which every measured size's on-demand miss costs less than its pinned one, over at
//! least `MIN_ROUNDS` rounds; sizes beyond the largest measured follow it. A device whose
//! on-demand transfers misplace data is never chosen.
//!
//! The file is text, one item per line; `#` starts a comment line:
//!
//! ```text
//! mrcache on-demand profile 1
//! device rxe0
//! vendor 0xffffff
//! part 0
//! offsets kept
//! size 4096 rounds 6 pinned_us 46.5 on_demand_us 63.5 first_touch_us 12.1 miss_over_pinned 1.62
//! on-demand-from 1048576
//! ```
//!
//! `vendor` and `part` are the device's vendor and vendor part ids (`ibv_devinfo`): the
//! profile applies to devices of that kind only. `offsets` is `kept` or `misplaced`,
//! `on-demand-from` a byte count or `never`. The `size` lines say what the decision was made
//! from; they are checked but not used.

use std::fmt::Write as _;

/// The first line of every profile: its format and version.
pub const HEADER: &str = "mrcache on-demand profile 1";

/// The fewest rounds a size's figures count from: a device's single write can take
/// milliseconds more or less than the next one (under emulation), which one round cannot
/// tell from a fault's cost.
pub const MIN_ROUNDS: u32 = 3;

/// One measured size.
#[derive(Debug, Clone, PartialEq)]
pub struct SizeFigures {
    /// Bytes registered.
    pub size: u64,
    /// Rounds measured.
    pub rounds: u32,
    /// A pinned registration and its deregistration, µs (median of the rounds).
    pub pinned_us: f64,
    /// The same made on demand, µs.
    pub on_demand_us: f64,
    /// What the device's first write into a fresh on-demand registration costs over a write
    /// into a pinned one, µs (median of the rounds; may be negative in noise).
    pub first_touch_us: f64,
    /// An on-demand miss (registration, deregistration and first touch) over a pinned one:
    /// the median of the rounds' ratios.
    pub miss_over_pinned: f64,
}

/// A device kind's on-demand profile.
#[derive(Debug, Clone, PartialEq)]
pub struct OdpProfile {
    /// The device it was measured on (for people; devices are matched by `vendor`, `part`).
    pub device: String,
    /// Vendor id.
    pub vendor: u32,
    /// Vendor part id.
    pub part: u32,
    /// Whether data written into an on-demand registration at an offset within a page, or
    /// read from one, is where it was sent.
    pub offsets_kept: bool,
    /// What was measured.
    pub sizes: Vec<SizeFigures>,
    /// Register on demand from this many bytes (None: never).
    pub on_demand_from: Option<u64>,
}

/// The smallest measured size from which an on-demand miss costs less than a pinned one at
/// every larger measured size too; None if it does not at the largest. A size pays only
/// over `MIN_ROUNDS` rounds or more, and with a ratio above 0 (below it, noise outweighed
/// what was measured).
pub fn on_demand_from(sizes: &[SizeFigures]) -> Option<u64> {
    let mut sorted: Vec<&SizeFigures> = sizes.iter().collect();
    sorted.sort_by_key(|s| s.size);
    sorted
        .iter()
        .rev()
        .take_while(|s| {
            s.rounds >= MIN_ROUNDS && s.miss_over_pinned > 0.0 && s.miss_over_pinned < 1.0
        })
        .last()
        .map(|s| s.size)
}

impl OdpProfile {
    /// Whether a registration of `len` bytes on this kind of device is made on demand.
    pub fn pays(&self, len: u64) -> bool {
        self.offsets_kept && self.on_demand_from.is_some_and(|from| len >= from)
    }

    /// Whether it is the profile of a device with these ids.
    pub fn matches(&self, vendor: u32, part: u32) -> bool {
        self.vendor == vendor && self.part == part
    }

    /// One line for people: the device and what `auto` does on it.
    pub fn summary(&self) -> String {
        let rule = match (self.offsets_kept, self.on_demand_from) {
            (false, _) => "never on demand: its on-demand transfers misplace data".to_string(),
            (true, None) => "pinned: an on-demand miss costs more at every size".to_string(),
            (true, Some(from)) => format!("on demand from {from} bytes"),
        };
        format!(
            "{} (vendor {:#x} part {}): {rule}",
            self.device, self.vendor, self.part
        )
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let mut s = format!("{HEADER}\n");
        s.push_str("# Written by `mrcache bench --odp-profile`; read by MRCACHE_ODP=auto when\n");
        s.push_str("# MRCACHE_ODP_PROFILE names this file (docs/design/odp.md).\n");
        let _ = writeln!(s, "device {}", self.device);
        let _ = writeln!(s, "vendor {:#x}", self.vendor);
        let _ = writeln!(s, "part {}", self.part);
        let offsets = if self.offsets_kept {
            "kept"
        } else {
            "misplaced"
        };
        let _ = writeln!(s, "offsets {offsets}");
        for z in &self.sizes {
            let _ = writeln!(
                s,
                "size {} rounds {} pinned_us {:.3} on_demand_us {:.3} first_touch_us {:.3} miss_over_pinned {:.3}",
                z.size, z.rounds, z.pinned_us, z.on_demand_us, z.first_touch_us, z.miss_over_pinned
            );
        }
        match self.on_demand_from {
            Some(from) => {
                let _ = writeln!(s, "on-demand-from {from}");
            }
            None => s.push_str("on-demand-from never\n"),
        }
        s
    }

    /// Read a profile's text; the error names the line and what it allows.
    pub fn parse(text: &str) -> Result<OdpProfile, String> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        match lines.next() {
            Some((_, HEADER)) => {}
            Some((n, l)) => return Err(format!("line {n}: {l:?} is not {HEADER:?}")),
            None => return Err(format!("empty: no {HEADER:?} line")),
        }
        let mut device = None;
        let mut vendor = None;
        let mut part = None;
        let mut offsets = None;
        let mut from = None;
        let mut sizes = Vec::new();
        for (n, line) in lines {
            let (key, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            let rest = rest.trim();
            let bad = |what: &str| format!("line {n}: {key} {rest:?}: {what}");
            let once = |seen: bool| {
                if seen {
                    Err(format!("line {n}: a second {key} line"))
                } else {
                    Ok(())
                }
            };
            match key {
                "device" => {
                    once(device.is_some())?;
                    if rest.is_empty() {
                        return Err(bad("a device name is needed"));
                    }
                    device = Some(rest.to_string());
                }
                "vendor" | "part" => {
                    let slot = if key == "vendor" {
                        &mut vendor
                    } else {
                        &mut part
                    };
                    once(slot.is_some())?;
                    *slot = Some(parse_id(rest).ok_or_else(|| {
                        bad("allowed: a 32-bit id, decimal or 0x hexadecimal")
                    })?);
                }
                "offsets" => {
                    once(offsets.is_some())?;
                    offsets = Some(match rest {
                        "kept" => true,
                        "misplaced" => false,
                        _ => return Err(bad("allowed: kept, misplaced")),
                    });
                }
                "size" => sizes.push(parse_size(rest).ok_or_else(|| {
                    bad("allowed: BYTES rounds N pinned_us X on_demand_us X first_touch_us X miss_over_pinned X")
                })?),
                "on-demand-from" => {
                    once(from.is_some())?;
                    from = Some(match rest {
                        "never" => None,
                        v => Some(
                            v.parse::<u64>()
                                .ok()
                                .filter(|&b| b > 0)
                                .ok_or_else(|| bad("allowed: a positive byte count, or never"))?,
                        ),
                    });
                }
                _ => {
                    return Err(format!(
                        "line {n}: unknown item {key:?} (known: device, vendor, part, offsets, size, on-demand-from)"
                    ));
                }
            }
        }
        let missing = |what: &str| format!("no {what} line");
        Ok(OdpProfile {
            device: device.ok_or_else(|| missing("device"))?,
            vendor: vendor.ok_or_else(|| missing("vendor"))?,
            part: part.ok_or_else(|| missing("part"))?,
            offsets_kept: offsets.ok_or_else(|| missing("offsets"))?,
            sizes,
            on_demand_from: from.ok_or_else(|| missing("on-demand-from"))?,
        })
    }
}

fn parse_id(v: &str) -> Option<u32> {
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

fn parse_size(v: &str) -> Option<SizeFigures> {
    let w: Vec<&str> = v.split_whitespace().collect();
    let [
        size,
        "rounds",
        n,
        "pinned_us",
        p,
        "on_demand_us",
        o,
        "first_touch_us",
        f,
        "miss_over_pinned",
        m,
    ] = w[..]
    else {
        return None;
    };
    let num = |x: &str| x.parse::<f64>().ok().filter(|v| v.is_finite());
    Some(SizeFigures {
        size: size.parse().ok().filter(|&s| s > 0)?,
        rounds: n.parse().ok()?,
        pinned_us: num(p)?,
        on_demand_us: num(o)?,
        first_touch_us: num(f)?,
        miss_over_pinned: num(m)?,
    })
}

#[cfg(test)]
mod tests;
