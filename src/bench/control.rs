//! The control of `mrcache bench`: is the "libibverbs alone" column what an application
//! without the preload pays? (docs/design.md, "`mrcache bench`: the no-preload control")
//!
//! Run by the launcher before the measuring process, in a process of its own without
//! libmrcache.so: the process's own libibverbs (the base link-map namespace, as an
//! application calls it) and the `dlmopen` copy the table's libibverbs column uses, on the
//! same buffer, in short alternating phases (`SLICE`, the order rotated every round so
//! that none always runs first). Each round has three phases: the `dlmopen` copy timed by
//! the table's own phase (`measure::alone_phase`); the base copy timed by the plainest loop
//! (between two clock readings, as many pairs as the table's phase of that copy last did);
//! the base copy timed by the table's phase. The table's "no-preload" column is the plain base figures' median (what an
//! application pays); the third against the second checks the table's timing (`timing`,
//! the VM case fails when they differ), the first against the second shows what the
//! namespace costs (`namespace`, reported).

use super::Plan;
use super::admission::Access;
use super::measure::{Spread, access_name, alone_phase, batch_for, clock_ns, is_ours};
use super::verbs::{Buffer, Copy, Pd, Verbs};
use std::time::{Duration, Instant};

/// One phase of a round: a batch of pairs at least, about this long.
pub const SLICE: Duration = Duration::from_millis(1);
/// Rounds per row at most (a row has a quarter of `--seconds`, one round at least).
pub const MAX_ROUNDS: usize = 400;
/// Agreement: the copies differ when both hold (docs/design.md): the one copy was the
/// slower in more rounds than chance gives (a sign test, `Z_MAX` standard deviations over
/// half the rounds) and the median of the per-round ratios is off 1 by more than `SPREAD`.
pub const Z_MAX: f64 = 3.5;
/// The spread allowed to the table's timing against the plainest (its one clock reading
/// per batch is under 1% of the batch, `batch_for`).
pub const TIMING_SPREAD: f64 = 0.02;
/// The spread the namespace comparison is stated at.
pub const NAMESPACE_SPREAD: f64 = 0.05;

#[derive(Debug, Clone)]
pub struct ControlRow {
    pub size: usize,
    pub access: Access,
    /// Per round, ns per reg + dereg: the `dlmopen` copy (the table's timing), the base
    /// namespace's libibverbs (the plainest timing), the same (the table's timing).
    pub rounds: Vec<[f64; 3]>,
}

impl ControlRow {
    fn column(&self, i: usize) -> Vec<f64> {
        self.rounds.iter().map(|r| r[i]).collect()
    }
    pub fn alone(&self) -> Spread {
        Spread::of(&self.column(0))
    }
    pub fn base(&self) -> Spread {
        Spread::of(&self.column(1))
    }
    /// (the `dlmopen` copy, the base copy), both as the table times libibverbs alone
    /// against the plainest loop.
    pub fn namespace_pairs(&self) -> Vec<(f64, f64)> {
        self.rounds.iter().map(|r| (r[0], r[1])).collect()
    }
    /// (the table's timing, the plainest), both of the base copy.
    pub fn timing_pairs(&self) -> Vec<(f64, f64)> {
        self.rounds.iter().map(|r| (r[2], r[1])).collect()
    }
}

#[derive(Debug, Clone)]
pub struct Control {
    pub clock_ns: f64,
    pub base_from: String,
    pub rows: Vec<ControlRow>,
}

/// How the two copies compare over a set of rounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Agreement {
    pub rounds: usize,
    /// Rounds in which the first of the pair was the slower.
    pub first_slower: usize,
    /// (first_slower - rounds/2) / sqrt(rounds/4).
    pub z: f64,
    /// The median of first / second over the rounds.
    pub median_ratio: f64,
    /// The spread the two are allowed.
    pub spread: f64,
}

impl Agreement {
    pub fn of<'a>(pairs: impl IntoIterator<Item = &'a (f64, f64)>, spread: f64) -> Agreement {
        let pairs: Vec<(f64, f64)> = pairs
            .into_iter()
            .copied()
            .filter(|(a, b)| a.is_finite() && b.is_finite() && *a > 0.0 && *b > 0.0)
            .collect();
        let n = pairs.len();
        let slower = pairs.iter().filter(|(a, b)| a > b).count();
        let z = if n == 0 {
            0.0
        } else {
            (slower as f64 - n as f64 / 2.0) / (n as f64 / 4.0).sqrt()
        };
        let ratios: Vec<f64> = pairs.iter().map(|(a, b)| a / b).collect();
        Agreement {
            rounds: n,
            first_slower: slower,
            z,
            median_ratio: Spread::of(&ratios).median,
            spread,
        }
    }

    /// The two differ: consistently (the sign test) and by more than their spread.
    pub fn differ(&self) -> bool {
        self.z.abs() > Z_MAX && (self.median_ratio - 1.0).abs() > self.spread
    }
}

pub fn run(plan: &Plan) -> Result<Control, String> {
    let base = Verbs::open(Copy::Global)?;
    let alone = Verbs::open(Copy::Alone)?;
    if is_ours(&base.reg_from) || is_ours(&base.dereg_from) || is_ours(&alone.reg_from) {
        return Err(
            "the control process (libibverbs without the preload) resolves ibv_reg_mr to libmrcache.so".into(),
        );
    }
    let bctx = base.open_device(plan.device.as_deref())?;
    let actx = alone
        .open_device(Some(&bctx.name))
        .map_err(|e| format!("{e} (libibverbs alone, in its own namespace)"))?;
    let bpd = bctx.alloc_pd()?;
    let apd = actx.alloc_pd()?;
    let clock = clock_ns();
    let budget = Duration::from_secs_f64(plan.seconds) / 4;
    // Both copies warm before the first row (in a run on rxe without this, the first row's
    // median was 9x the next one's): 200 ms of 4 KiB pairs, alternating, untimed.
    warm(&bpd, &apd)?;
    let mut rows = Vec::new();
    for &size in &plan.sizes {
        for access in Access::ALL {
            rows.push(row(&bpd, &apd, size, access, budget, clock)?);
        }
    }
    let out = Control {
        clock_ns: clock,
        base_from: base.reg_from.clone(),
        rows,
    };
    drop((bpd, apd));
    drop((bctx, actx));
    Ok(out)
}

fn warm(bpd: &Pd, apd: &Pd) -> Result<(), String> {
    let buf = Buffer::new(4096)?;
    let flags = super::measure::flags(Access::Local);
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(200) {
        for pd in [apd, bpd] {
            pd.dereg(pd.reg(buf.addr, 4096, flags)?)?;
        }
    }
    Ok(())
}

fn row(
    bpd: &Pd,
    apd: &Pd,
    size: usize,
    access: Access,
    budget: Duration,
    clock: f64,
) -> Result<ControlRow, String> {
    let flags = super::measure::flags(access);
    let buf = Buffer::new(size)?;
    let pair = |pd: &Pd| pd.dereg(pd.reg(buf.addr, size, flags)?);
    // Both copies warm (their first pins of the pages, the device's first use).
    for _ in 0..2 {
        pair(apd)?;
        pair(bpd)?;
    }
    let t = Instant::now();
    pair(apd)?;
    pair(bpd)?;
    let est = t.elapsed().as_nanos() as f64 / 2.0;
    // libibverbs alone: the table's own phase, with the batch it would use. The base copy:
    // the plainest timing, a fixed number of pairs (a slice's worth, and the batch at
    // least) between two readings of the clock.
    let batch = batch_for(est, clock);
    // The plain loop does as many pairs as the table's phase of the same copy last did, so
    // that a stall of the machine weighs the same in both.
    let mut plain = ((SLICE.as_nanos() as f64 / est) as usize).max(batch).max(1);
    let t0 = Instant::now();
    let mut rounds: Vec<[f64; 3]> = Vec::new();
    while rounds.is_empty() || (rounds.len() < MAX_ROUNDS && t0.elapsed() < budget) {
        let mut r = [0.0; 3];
        // The order rotates: 0 1 2, 1 2 0, 2 0 1, ...
        for k in 0..3 {
            let phase = (k + rounds.len()) % 3;
            r[phase] = match phase {
                0 => alone_phase(apd, buf.addr, size, flags, SLICE, batch)?.0,
                1 => {
                    let t = Instant::now();
                    for _ in 0..plain {
                        pair(bpd)?;
                    }
                    t.elapsed().as_nanos() as f64 / plain as f64
                }
                _ => {
                    let (ns, n) = alone_phase(bpd, buf.addr, size, flags, SLICE, batch)?;
                    plain = n;
                    ns
                }
            };
        }
        rounds.push(r);
    }
    Ok(ControlRow {
        size,
        access,
        rounds,
    })
}

/// The control's figures as one JSON line (ns), for the measuring process.
pub fn json(c: &Control) -> String {
    let rows: Vec<serde_json::Value> = c
        .rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "size": r.size,
                "access": access_name(r.access),
                "rounds_ns": r.rounds.iter().map(|x| x.map(f64::round)).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({"clock_ns": c.clock_ns, "base_from": c.base_from, "rows": rows}).to_string()
}

/// Read back what `json` wrote.
pub fn parse(s: &str) -> Result<Control, String> {
    let bad = || "the control process's figures are malformed".to_string();
    let v: serde_json::Value = serde_json::from_str(s.trim()).map_err(|_| bad())?;
    let mut rows = Vec::new();
    for r in v["rows"].as_array().ok_or_else(bad)? {
        let access = match r["access"].as_str() {
            Some("local") => Access::Local,
            Some("remote") => Access::Remote,
            _ => return Err(bad()),
        };
        let rounds = r["rounds_ns"]
            .as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|p| Some([p[0].as_f64()?, p[1].as_f64()?, p[2].as_f64()?]))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)?;
        rows.push(ControlRow {
            size: r["size"].as_u64().ok_or_else(bad)? as usize,
            access,
            rounds,
        });
    }
    Ok(Control {
        clock_ns: v["clock_ns"].as_f64().unwrap_or(f64::NAN),
        base_from: v["base_from"].as_str().unwrap_or("?").to_string(),
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_is_a_sign_test_and_a_spread() {
        let of = |p: &[(f64, f64)]| Agreement::of(p, NAMESPACE_SPREAD);
        // Alternately faster and slower by 20%: no consistent difference.
        let even: Vec<(f64, f64)> = (0..200)
            .map(|i| {
                if i % 2 == 0 {
                    (120.0, 100.0)
                } else {
                    (100.0, 120.0)
                }
            })
            .collect();
        let a = of(&even);
        assert_eq!((a.rounds, a.first_slower), (200, 100));
        assert!(!a.differ(), "{a:?}");
        // Always 10% slower: differs.
        let slow: Vec<(f64, f64)> = (0..50)
            .map(|i| (110.0 + i as f64, 100.0 + i as f64))
            .collect();
        let a = of(&slow);
        assert!(a.differ() && a.z > Z_MAX && a.median_ratio > 1.05, "{a:?}");
        // Always slower by 3%: consistent, within the namespace's spread, not the timing's.
        let near: Vec<(f64, f64)> = (0..50).map(|_| (103.0, 100.0)).collect();
        assert!(!of(&near).differ());
        assert!(Agreement::of(&near, TIMING_SPREAD).differ());
        // Faster by 10% differs as well.
        let fast: Vec<(f64, f64)> = (0..50).map(|_| (90.0, 100.0)).collect();
        assert!(of(&fast).differ());
        // Too few rounds cannot differ.
        assert!(!of(&slow[..10]).differ());
        assert_eq!(of(&[]).rounds, 0);
    }

    #[test]
    fn json_reads_back() {
        let c = Control {
            clock_ns: 6980.0,
            base_from: "/lib/libibverbs.so.1".into(),
            rows: vec![ControlRow {
                size: 4096,
                access: Access::Remote,
                rounds: vec![
                    [140_000.0, 138_000.0, 139_000.0],
                    [150_000.0, 151_000.0, 152_000.0],
                ],
            }],
        };
        let back = parse(&json(&c)).unwrap();
        assert_eq!(back.rows[0].rounds, c.rows[0].rounds);
        assert_eq!(back.rows[0].timing_pairs()[1], (152_000.0, 151_000.0));
        assert_eq!(back.rows[0].namespace_pairs()[0], (140_000.0, 138_000.0));
        assert_eq!(
            (back.rows[0].size, back.rows[0].access),
            (4096, Access::Remote)
        );
        assert_eq!(back.clock_ns, 6980.0);
        assert!(parse("{").is_err() && parse("{\"rows\": [{\"size\": 1}]}").is_err());
    }
}
