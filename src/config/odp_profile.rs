//! The on-demand profile (`MRCACHE_ODP_PROFILE`): what `mrcache bench --odp-profile`
//! measured on one kind of device, and where `MRCACHE_ODP=auto` registers entries on demand
//! because it pays there.
//!
//! An entry made on demand costs at its miss what the device takes to register it plus, at
//! the device's first use of its pages, the fault that maps them; a pinned one costs its
//! registration. The bench measures both per size on the device itself (a loopback RDMA
//! WRITE is the first use), and whether data it RDMA-writes into an on-demand registration
//! at an offset within a page lands there. The rule (`on_demand_from`): on demand from the
//! smallest measured size at and above which every measured size's on-demand miss cost less
//! than its pinned one in every round, over at least `MIN_ROUNDS` rounds; sizes beyond the
//! largest measured follow it. A device whose on-demand writes misplace data is never chosen.
//! A profile holds for the kernel and firmware it was measured on: elsewhere it is not used.
//!
//! The file is text, one item per line; `#` starts a comment line:
//!
//! ```text
//! mrcache on-demand profile 1
//! device rxe0
//! vendor 0xffffff
//! part 0
//! firmware 0.0.0
//! kernel 7.3.4+deb13-amd64
//! offsets kept
//! size 4096 rounds 6 pinned_us 46.5 on_demand_us 63.5 first_touch_us 12.1 miss_over_pinned 1.62 min 1.1 max 2.3
//! on-demand-from 1048576
//! ```
//!
//! `vendor` and `part` are the device's vendor and vendor part ids, `firmware` its firmware
//! version (`ibv_devinfo`'s `fw_ver`, which may be empty), `kernel` the release it ran under
//! (`uname -r`): the profile applies to devices of that kind and firmware under that kernel
//! only. `offsets` is `kept` or `misplaced`, `on-demand-from` a byte count or `never`. The
//! `size` lines say what the decision was made from; they are checked but not used. A
//! comment is a line of its own. A file is read up to `MAX_BYTES`.

use std::fmt::Write as _;

/// The first line of every profile: its format and version.
pub const HEADER: &str = "mrcache on-demand profile 1";

/// The fewest rounds a size's figures count from: a device's single write can take
/// milliseconds more or less than the next one (under emulation), which one round cannot
/// tell from a fault's cost.
pub const MIN_ROUNDS: u32 = 3;

/// The most a profile file may hold (a profile of a hundred sizes takes about 12 KiB).
pub const MAX_BYTES: u64 = 64 << 10;

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
    /// The smallest of the rounds' ratios.
    pub miss_over_pinned_min: f64,
    /// The largest.
    pub miss_over_pinned_max: f64,
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
    /// Firmware version (may be empty).
    pub firmware: String,
    /// The kernel release it was measured under.
    pub kernel: String,
    /// Whether data the device RDMA-wrote into an on-demand registration at an offset within
    /// a page landed at that offset.
    pub offsets_kept: bool,
    /// What was measured.
    pub sizes: Vec<SizeFigures>,
    /// Register on demand from this many bytes (None: never).
    pub on_demand_from: Option<u64>,
}

/// The smallest measured size from which an on-demand miss costs less than a pinned one at
/// every larger measured size too; None if it does not at the largest. A size pays only
/// over `MIN_ROUNDS` rounds or more, each round's ratio above 0 and below 1: a round below
/// 0 is noise outweighing what was measured, and one at or above 1 says the median alone
/// could be noise too.
pub fn on_demand_from(sizes: &[SizeFigures]) -> Option<u64> {
    let mut sorted: Vec<&SizeFigures> = sizes.iter().collect();
    sorted.sort_by_key(|s| s.size);
    sorted
        .iter()
        .rev()
        .take_while(|s| {
            s.rounds >= MIN_ROUNDS && s.miss_over_pinned_min > 0.0 && s.miss_over_pinned_max < 1.0
        })
        .last()
        .map(|s| s.size)
}

impl OdpProfile {
    /// Whether a registration of `len` bytes on this kind of device is made on demand.
    pub fn pays(&self, len: u64) -> bool {
        self.offsets_kept && self.on_demand_from.is_some_and(|from| len >= from)
    }

    /// Whether it is the profile of a device with these ids and firmware.
    pub fn matches(&self, vendor: u32, part: u32, firmware: &str) -> bool {
        self.vendor == vendor && self.part == part && self.firmware == firmware
    }

    /// One line for people: the device and what `auto` does on it.
    pub fn summary(&self) -> String {
        let rule = match (self.offsets_kept, self.on_demand_from) {
            (false, _) => "never on demand: its on-demand transfers misplace data".to_string(),
            (true, None) => {
                "pinned: no measured size's on-demand miss cost less in every round".to_string()
            }
            (true, Some(from)) => format!("on demand from {from} bytes"),
        };
        format!(
            "{} (vendor {:#x} part {} firmware {:?}, kernel {}): {rule}",
            self.device, self.vendor, self.part, self.firmware, self.kernel
        )
    }

    /// `summary`, and whether it holds under the running kernel `kernel`.
    pub fn verdict_under(&self, kernel: &str) -> String {
        if self.kernel == kernel {
            return self.summary();
        }
        format!(
            "{}; not used: this is kernel {kernel} (measure again with mrcache bench --odp-profile)",
            self.summary()
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
        let _ = writeln!(s, "firmware {}", self.firmware);
        let _ = writeln!(s, "kernel {}", self.kernel);
        let offsets = if self.offsets_kept {
            "kept"
        } else {
            "misplaced"
        };
        let _ = writeln!(s, "offsets {offsets}");
        for z in &self.sizes {
            let _ = writeln!(
                s,
                "size {} rounds {} pinned_us {} on_demand_us {} first_touch_us {} miss_over_pinned {} min {} max {}",
                z.size,
                z.rounds,
                z.pinned_us,
                z.on_demand_us,
                z.first_touch_us,
                z.miss_over_pinned,
                z.miss_over_pinned_min,
                z.miss_over_pinned_max
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
            Some((n, l)) => return Err(format!("line {n}: {:?} is not {HEADER:?}", short(l))),
            None => return Err(format!("empty: no {HEADER:?} line")),
        }
        let mut device = None;
        let mut firmware = None;
        let mut kernel = None;
        let mut vendor = None;
        let mut part = None;
        let mut offsets = None;
        let mut from = None;
        let mut sizes = Vec::new();
        for (n, line) in lines {
            let (key, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            let rest = rest.trim();
            let bad = |what: &str| format!("line {n}: {} {:?}: {what}", short(key), short(rest));
            let once = |seen: bool| {
                if seen {
                    Err(format!("line {n}: a second {key} line"))
                } else {
                    Ok(())
                }
            };
            match key {
                "device" | "firmware" | "kernel" => {
                    let slot = match key {
                        "device" => &mut device,
                        "firmware" => &mut firmware,
                        _ => &mut kernel,
                    };
                    once(slot.is_some())?;
                    if rest.is_empty() && key != "firmware" {
                        return Err(bad("a name is needed"));
                    }
                    if rest.chars().any(char::is_control) {
                        return Err(bad("allowed: printable characters"));
                    }
                    *slot = Some(rest.to_string());
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
                    bad("allowed: BYTES rounds N pinned_us X on_demand_us X first_touch_us X miss_over_pinned X min X max X")
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
                        "line {n}: unknown item {:?} (known: device, vendor, part, firmware, kernel, offsets, size, on-demand-from)",
                        short(key)
                    ));
                }
            }
        }
        let missing = |what: &str| format!("no {what} line");
        Ok(OdpProfile {
            device: device.ok_or_else(|| missing("device"))?,
            vendor: vendor.ok_or_else(|| missing("vendor"))?,
            part: part.ok_or_else(|| missing("part"))?,
            firmware: firmware.ok_or_else(|| missing("firmware"))?,
            kernel: kernel.ok_or_else(|| missing("kernel"))?,
            offsets_kept: offsets.ok_or_else(|| missing("offsets"))?,
            sizes,
            on_demand_from: from.ok_or_else(|| missing("on-demand-from"))?,
        })
    }
}

/// At most 60 characters of `s`, for an error line.
fn short(s: &str) -> String {
    match s.char_indices().nth(60) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_string(),
    }
}

fn parse_id(v: &str) -> Option<u32> {
    let (digits, radix) = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (v, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
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
        "min",
        lo,
        "max",
        hi,
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
        miss_over_pinned_min: num(lo)?,
        miss_over_pinned_max: num(hi)?,
    })
}

#[cfg(test)]
mod tests;
