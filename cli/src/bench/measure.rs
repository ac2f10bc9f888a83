//! The measurements of `mrcache bench` (docs/design/bench.md).
//!
//! Per size and access, for half of `--seconds` each: rounds, each made of a phase of
//! `ibv_reg_mr` + `ibv_dereg_mr` by libibverbs alone, a phase of as many pairs in the
//! no-preload control (`control::Peer`, a co-process), a phase of the same through the cache
//! on a range it holds (hit and release), the three in an order rotated every round, and one miss through the cache on fresh memory
//! (registration and release; the entry is then unmapped and the cache's drain thread
//! deregisters it, awaited outside the timing through the process's pinned pages). Each
//! round gives one figure per phase (its time divided by its pairs, what an application
//! doing them pays); a row is the median and the range of its rounds' figures. The rounds
//! are rested: after each, a sleep as long as its phases took (a duty cycle of 1/2,
//! `DUTY`).

use super::admission::{self, Access, Costs, LOCAL, Verdict, flags};
use super::control::{Agreement, NAMESPACE_SPREAD, Peer, paired_ratio};
use super::preload::is_ours;
use super::proc::pinned;
use super::timing::{Spread, batch_for, clock_ns, phase};
use super::verbs::{Buffer, Copy, DeviceInfo, Mover, Pd, Verbs};
use super::{HIT_REGION_BYTES, HIT_REGIONS, Plan};
use std::time::{Duration, Instant};

const MAX_ROUNDS: usize = 25;
/// The share of a row's rounds spent registering: after each round, a rest as long as its
/// phases took (stated in the table's header and in --json's `method`).
pub const DUTY: f64 = 0.5;
/// Fewer rounds than this, and a row's figures have no spread to be judged by: a warning.
pub const TRUSTED_ROUNDS: usize = 3;
/// A miss round (fresh memory, drained afterwards) every this many rounds, and one at least.
const MISS_EVERY: usize = 3;

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Row {
    pub size: usize,
    pub access: Access,
    /// libibverbs alone: registration + deregistration, and the deregistration alone.
    pub alone: Spread,
    pub alone_dereg: Spread,
    /// Through the cache on a range it holds: hit + release (for remote access under
    /// revoke: with the window bind and unbind).
    pub cached: Spread,
    /// Why the cache did not keep the registration (then `cached` is a pass-through).
    pub passed_through: Option<String>,
    /// Through the cache on fresh memory: the miss's registration + its release.
    pub miss: Spread,
    /// libibverbs alone on fresh memory, beside each miss.
    pub fresh_alone: Spread,
    /// Remote rows: what the window bind and unbind add (cached remote less cached local).
    pub revoke_ns: Option<f64>,
    /// The control's figures for this row: libibverbs in the base namespace without the
    /// preload (what an application pays), one per round; how the `dlmopen` copy compared
    /// with it, round by round.
    pub no_preload: Option<Spread>,
    pub namespace: Option<Agreement>,
    /// Per round, ns per pair: libibverbs alone (dlmopen), no preload (the control; NaN
    /// without one), cached.
    pub round_ns: Vec<[f64; 3]>,
    pub rounds: usize,
    pub misses: usize,
    /// The figures the default's admission is given, and its verdict.
    pub costs: Costs,
    pub verdict: Verdict,
    pub verdict_why: String,
    /// The row's time in all, and its memory's part before the budget (mapping, populating
    /// and first registrations, here and in the control).
    pub took: Duration,
    pub memory_took: Duration,
}

#[derive(Debug, Clone)]
pub struct HitPath {
    pub regions: usize,
    pub ns: Spread,
    pub batches: usize,
    pub hits: bool,
}

pub struct Outcome {
    pub device: String,
    pub info: DeviceInfo,
    pub provider: String,
    pub cache_hooks: String,
    pub alone_from: String,
    pub seconds: f64,
    pub rows: Vec<Row>,
    pub hit_path: Vec<HitPath>,
    pub elapsed: Duration,
    /// The parts of `elapsed`: opening the device in both processes, the hit path, the rows,
    /// and the control process's exit (its deregistrations and teardown: 0.3-0.4 s in the
    /// guest, which the parts had left out).
    pub startup: Duration,
    pub hit_path_took: Duration,
    pub sizes_took: Duration,
    pub control_exit_took: Duration,
    /// Of `sizes_took`: the rows' memory, before their budgets.
    pub memory_took: Duration,
    pub environment: Vec<(String, String)>,
    pub clock_ns: f64,
    /// The control's libibverbs (the no-preload column's).
    pub no_preload_from: String,
    /// The on-demand rows, or why there are none (measured after the control's exit).
    pub on_demand: super::odp::Section,
}

impl Row {
    /// What the application pays without the cache over the cached figure, paired round by
    /// round: the median of the rounds' no-preload / cached (libibverbs alone / cached
    /// without the control). None when the row passed through.
    pub fn speedup(&self) -> Option<f64> {
        if self.passed_through.is_some() {
            return None;
        }
        let col = if self.no_preload.is_some() { 1 } else { 0 };
        let pairs: Vec<(f64, f64)> = self.round_ns.iter().map(|r| (r[col], r[2])).collect();
        Some(paired_ratio(&pairs))
    }

    /// The row's no-preload figures range wider than their median (the machine or the
    /// device changed speed during the row), or come from fewer than `TRUSTED_ROUNDS`
    /// rounds (no spread to judge them by): its speed-up is not to be trusted.
    pub fn no_preload_untrusted(&self) -> bool {
        self.no_preload.is_some_and(|s| {
            self.rounds < TRUSTED_ROUNDS || (s.median.is_finite() && s.max - s.min > s.median)
        })
    }

    /// The figures the default's admission is given, and its decision on them: the means
    /// over the rounds of the no-preload (libibverbs alone without a control) and cached
    /// figures, what the library's running means of the same calls settle on
    /// (`admission::running_figure`), not the medians the table shows.
    fn judge(&mut self) {
        let col = if self.no_preload.is_some() { 1 } else { 0 };
        let of = |k: usize| {
            admission::running_figure(&self.round_ns.iter().map(|r| r[k]).collect::<Vec<_>>())
        };
        self.costs = admission::costs(of(col), of(2));
        (self.verdict, self.verdict_why) = if let Some(why) = &self.passed_through {
            (Verdict::PassThrough, why.clone())
        } else {
            admission::describe(self.access, self.size, &self.costs)
        };
    }
}

/// Wait (at most `limit`) until no more than `bytes` are pinned: the cache's drain thread
/// has deregistered what an unmap invalidated.
fn wait_unpinned(bytes: Option<u64>, limit: Duration) {
    let Some(bytes) = bytes else { return };
    let t = Instant::now();
    while pinned().is_some_and(|p| p > bytes) && t.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub fn run(
    plan: &Plan,
    start_control: impl FnOnce() -> Result<Peer, String>,
) -> Result<Outcome, String> {
    let t0 = Instant::now();
    let global = Verbs::open(Copy::Global)?;
    let alone = Verbs::open(Copy::Alone)?;
    // The two paths are what they claim: the cache's hooks, libibverbs' own functions.
    if !is_ours(&global.reg_from) || !is_ours(&global.dereg_from) {
        return Err(format!(
            "through the cache, ibv_reg_mr resolves to {} and ibv_dereg_mr to {}, not libmrcache.so's hooks",
            global.reg_from, global.dereg_from
        ));
    }
    if is_ours(&alone.reg_from) || is_ours(&alone.dereg_from) {
        return Err("libibverbs alone resolves to libmrcache.so's hooks".into());
    }
    let gctx = global.open_device(plan.device.as_deref())?;
    let actx = alone
        .open_device(Some(&gctx.name))
        .map_err(|e| format!("{} (libibverbs alone, in its own namespace)", e))?;
    let info = gctx
        .info()
        .ok_or_else(|| format!("{}: ibv_query_device failed", gctx.name))?;
    let gpd = gctx.alloc_pd()?;
    let apd = actx.alloc_pd()?;
    let budget = Duration::from_secs_f64(plan.seconds);
    // The control co-process, once the device is known to open here.
    let mut peer = start_control()?;

    let clock = clock_ns();
    let startup = t0.elapsed();
    let hit_path = hit_path(&gpd)?;
    let hit_path_took = t0.elapsed() - startup;

    let mut rows: Vec<Row> = Vec::new();
    for &size in &plan.sizes {
        for access in [Access::Local, Access::Remote] {
            let mut row = measure(
                &gpd,
                &apd,
                &mut peer,
                size,
                access,
                budget / 2,
                info.max_mw,
                clock,
            )?;
            if access == Access::Remote
                && row.passed_through.is_none()
                && let Some(local) = rows.iter().find(|r| {
                    r.size == size && r.access == Access::Local && r.passed_through.is_none()
                })
            {
                row.revoke_ns = Some((row.cached.median - local.cached.median).max(0.0));
            }
            rows.push(row);
        }
    }
    let sizes_took = t0.elapsed() - startup - hit_path_took;
    let memory_took = rows.iter().map(|r| r.memory_took).sum();
    let no_preload_from = peer.base_from.clone();
    let t_exit = Instant::now();
    drop(peer);
    let control_exit_took = t_exit.elapsed();
    let on_demand = super::odp::run(&alone, &actx, &apd, plan, clock, |size| {
        rows.iter()
            .find(|r| r.size == size && r.access == Access::Local && r.passed_through.is_none())
            .map(|r| r.cached.median)
    });
    let environment = std::env::vars_os()
        .filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            // MRCACHE_ADMIT=always when the bench set it (the header says so).
            let ours = k == "MRCACHE_ADMIT"
                && std::env::var(super::CHILD_MARK).is_ok_and(|v| v == super::ADMIT_SET);
            (mrcache::config::VARIABLES.iter().any(|var| var.name == k) && !ours)
                .then(|| (k, v.to_string_lossy().into_owned()))
        })
        .collect();
    let out = Outcome {
        device: gctx.name.clone(),
        info,
        provider: gctx.provider(),
        cache_hooks: global.reg_from.clone(),
        alone_from: alone.reg_from.clone(),
        seconds: plan.seconds,
        rows,
        hit_path,
        elapsed: t0.elapsed(),
        startup,
        hit_path_took,
        sizes_took,
        control_exit_took,
        memory_took,
        environment,
        clock_ns: clock,
        no_preload_from,
        on_demand,
    };
    drop((gpd, apd));
    drop((gctx, actx));
    Ok(out)
}

/// The libibverbs-alone phase: (ns per `ibv_reg_mr` + `ibv_dereg_mr` pair, pairs); no clock is read
/// between the pairs of a batch (a reading costs microseconds where the clock is a system
/// call; `batch_for` keeps the one per batch under 1%, as in the cached phase). The table's
/// column comes from here.
pub(super) fn alone_phase(
    apd: &Pd,
    addr: *mut u8,
    size: usize,
    flags: u32,
    slice: Duration,
    batch: usize,
) -> Result<(f64, usize), String> {
    phase(slice, batch, || apd.dereg(apd.reg(addr, size, flags)?))
}

#[allow(clippy::too_many_arguments)]
fn measure(
    gpd: &Pd,
    apd: &Pd,
    peer: &mut Peer,
    size: usize,
    access: Access,
    budget: Duration,
    max_mw: i32,
    clock_ns: f64,
) -> Result<Row, String> {
    let flags = flags(access);
    // The row's memory first: mapping and populating it here and in the control, and its
    // first registrations (the warm-up), reported apart ("memory"): under emulation that
    // alone takes seconds at 64 MiB, a time that depends on the size, not on --seconds.
    let t_row = Instant::now();
    let buf = Buffer::new(size)?;
    let mut mover = Mover::new(size)?;
    // Warm both paths; the cache's first registration of the range is a miss that leaves
    // it cached, idle. Two more, both held at once, must then come back with its lkey (hits).
    let t = Instant::now();
    apd.dereg(apd.reg(buf.addr, size, flags)?)?;
    // What a miss round adds: a registration, two moves, the drain.
    let miss_estimate = 2 * t.elapsed() + Duration::from_millis(20);
    let t = Instant::now();
    apd.dereg(apd.reg(buf.addr, size, flags)?)?;
    let est = t.elapsed().as_nanos() as f64;
    let batch_alone = batch_for(est, clock_ns);
    peer.row(size, access)?;
    let first = gpd.reg(buf.addr, size, flags)?;
    gpd.dereg(first)?;
    let passed_through = if held_hits(gpd, buf.addr, size, flags, first.lkey)? {
        None
    } else if access == Access::Remote && max_mw <= 0 {
        Some("passed through: the device has no memory windows (max_mw 0)".to_string())
    } else {
        Some("passed through: the cache did not keep the registration".to_string())
    };
    let t = Instant::now();
    for _ in 0..16 {
        gpd.dereg(gpd.reg(buf.addr, size, flags)?)?;
    }
    let batch_cached = batch_for(t.elapsed().as_nanos() as f64 / 16.0, clock_ns);

    // Each round: a libibverbs-alone phase, a no-preload phase as long, a cached phase.
    // (Half the row's time is rest after each round: phases half as long as without it
    // keep the rounds as many.)
    let slice_alone = budget / 48;
    let slice_cached = budget / 160;
    let (mut alone, mut alone_dereg, mut cached, mut miss) = (vec![], vec![], vec![], vec![]);
    let mut no_preload = vec![];
    let mut round_ns: Vec<[f64; 3]> = vec![];
    // The no-preload phase does as many pairs as the last libibverbs-alone phase.
    let mut pairs_alone =
        ((slice_alone.as_nanos() as f64 / est.max(1.0)) as usize).max(batch_alone);
    let mut fresh_alone = vec![];
    let mut passed_through = passed_through;
    let mut rounds = 0;
    let mut miss_part = Duration::ZERO;
    // The misses' memory: populated once, registered first by libibverbs alone on its
    // fresh pages ("fresh"), then moved between two addresses (mremap), so each miss is
    // a registration the cache does not hold, of pages registered before, as libibverbs
    // alone's are.
    let t = Instant::now();
    apd.dereg(apd.reg(mover.addr(), size, flags)?)?;
    fresh_alone.push(t.elapsed().as_nanos() as f64);
    // Then the budget: the rounds, the rest after each, the miss rounds and the drain
    // waits all count in it. Only the first round and one miss round are done whatever is
    // left (a row needs a figure).
    let t0 = Instant::now();
    let setup = t0 - t_row;
    let left = || budget.saturating_sub(t0.elapsed());
    let mut miss_round = |miss: &mut Vec<f64>| -> Result<(), String> {
        let before = pinned();
        mover.flip()?;
        let t = Instant::now();
        gpd.dereg(gpd.reg(mover.addr(), size, flags)?)?;
        miss.push(t.elapsed().as_nanos() as f64);
        // The entry goes with the pages' next move; wait for the drain thread (not past
        // the row's budget).
        mover.flip()?;
        wait_unpinned(before, Duration::from_millis(500).min(left()));
        Ok(())
    };
    // A round starts only if it fits in what is left of the budget.
    loop {
        let r0 = Instant::now();
        // The three phases, in an order rotated every round: 0 1 2, 1 2 0, 2 0 1, ...
        let (mut a, mut np, mut c) = (f64::NAN, f64::NAN, f64::NAN);
        for k in 0..3 {
            match (k + rounds) % 3 {
                0 => {
                    // libibverbs alone (dlmopen).
                    let (ns, n) =
                        alone_phase(apd, buf.addr, size, flags, slice_alone, batch_alone)?;
                    (a, pairs_alone) = (ns, n);
                    // Its deregistration timed apart (untimed registration), outside the phase.
                    let mr = apd.reg(buf.addr, size, flags)?;
                    let t = Instant::now();
                    apd.dereg(mr)?;
                    alone_dereg.push(t.elapsed().as_nanos() as f64);
                }
                // No preload: the control co-process, as many pairs, now.
                1 => np = peer.phase(pairs_alone, batch_alone)?,
                _ => {
                    // Through the cache, on the range it holds.
                    let mut lost = false;
                    (c, _) = phase(slice_cached, batch_cached, || {
                        let mr = gpd.reg(buf.addr, size, flags)?;
                        lost |= mr.lkey != first.lkey;
                        gpd.dereg(mr)
                    })?;
                    // The same lkey could be a provider's reused key: checked untimed with two held.
                    lost |= !held_hits(gpd, buf.addr, size, flags, first.lkey)?;
                    if lost && passed_through.is_none() {
                        passed_through = Some(
                            "passed through: the cache stopped keeping the registration during the run (evicted: MRCACHE_MAX_BYTES; or its admission passed the class through)".into(),
                        );
                    }
                }
            }
        }
        alone.push(a);
        no_preload.push(np);
        cached.push(c);
        round_ns.push([a, np, c]);
        let plain = r0.elapsed();
        // Rest as long as the round's phases took: back to back for a second or more,
        // registrations get dearer round by round on rxe (1 MiB: 292 to 1059 µs over five
        // rounds, both processes alike, while an application alternating 0.3 s back to back
        // with 0.3 s of 1 ms bursts paid 260-340 µs): work the kernel defers at each
        // deregistration piles up unless the device is idle at times, as it is in an
        // application that does anything between its registrations (docs/design/bench.md,
        // "The rest").
        std::thread::sleep(plain);
        // Every MISS_EVERY rounds (and once at least), a miss through the cache on fresh
        // memory; then unmapped and drained. After the rest, as the phases come after one
        // (a miss timed unrested would carry the phases' deferred work).
        if rounds % MISS_EVERY == MISS_EVERY - 1 {
            let m0 = Instant::now();
            miss_round(&mut miss)?;
            miss_part = m0.elapsed();
        }
        rounds += 1;
        let next = 2 * plain
            + if rounds % MISS_EVERY == MISS_EVERY - 1 {
                miss_part.max(miss_estimate)
            } else {
                Duration::ZERO
            };
        // Room for the one miss round every row has, and for the last drain.
        let reserve = if miss.is_empty() {
            2 * miss_estimate
        } else {
            miss_estimate
        };
        if rounds >= MAX_ROUNDS || t0.elapsed() + next + reserve > budget {
            break;
        }
    }
    if miss.is_empty() {
        miss_round(&mut miss)?;
    }
    // Leave nothing cached for the next size: unmap, and wait for the drain.
    let before = pinned().map(|p| p.saturating_sub(super::page_round(size) as u64));
    drop(buf);
    drop(mover);
    wait_unpinned(before, Duration::from_millis(500).min(left()));

    let miss_count = miss.len();
    let (alone, alone_dereg, cached, miss) = (
        Spread::of(&alone),
        Spread::of(&alone_dereg),
        Spread::of(&cached),
        Spread::of(&miss),
    );
    let mut row = Row {
        size,
        access,
        alone,
        alone_dereg,
        cached,
        passed_through,
        miss,
        fresh_alone: Spread::of(&fresh_alone),
        revoke_ns: None,
        no_preload: Some(Spread::of(&no_preload)),
        namespace: Some(Agreement::of(
            &round_ns.iter().map(|r| (r[0], r[1])).collect::<Vec<_>>(),
            NAMESPACE_SPREAD,
        )),
        round_ns,
        rounds,
        misses: miss_count,
        costs: Costs::default(),
        verdict: Verdict::Cache,
        verdict_why: String::new(),
        took: t_row.elapsed(),
        memory_took: setup,
    };
    row.judge();
    Ok(row)
}

/// Two registrations of the range through the cache, both held at once, come back with the
/// lkey `key` of its cached entry: hits. Passed through, two live registrations cannot
/// share an lkey (a provider that reuses keys, as mlx5's MR cache, reuses only freed ones),
/// so an lkey equal to an earlier, released registration's does not pass for a hit.
fn held_hits(pd: &Pd, addr: *mut u8, len: usize, flags: u32, key: u32) -> Result<bool, String> {
    let a = pd.reg(addr, len, flags)?;
    let b = pd.reg(addr, len, flags);
    let hit = b.as_ref().is_ok_and(|b| a.lkey == key && b.lkey == key);
    if let Ok(b) = b {
        pd.dereg(b)?;
    }
    pd.dereg(a)?;
    Ok(hit)
}

/// The hit path's bounds, whatever `--seconds` (docs/usage.md, "How long it takes"): the
/// regions' first registrations (misses) stop after `HIT_REGISTERING`, each of the two timed
/// parts after `HIT_TIMING` (5 batches at least), the drain wait after `HIT_DRAIN`.
pub const HIT_REGISTERING: Duration = Duration::from_secs(2);
pub const HIT_TIMING: Duration = Duration::from_millis(100);
pub const HIT_DRAIN: Duration = Duration::from_millis(500);

/// ns per hit + release at 1 and `HIT_REGIONS` regions of 4 KiB a gap page apart, visited
/// in a fixed pseudo-random order; a tenth of `budget` each, in batches of 1,000 pairs.
fn hit_path(pd: &Pd) -> Result<Vec<HitPath>, String> {
    let stride = 2 * HIT_REGION_BYTES;
    let before = pinned();
    let buf = Buffer::new(HIT_REGIONS * stride)?;
    let mut keys = Vec::with_capacity(HIT_REGIONS);
    // The regions' first registrations are misses: under emulation they can take seconds
    // in all; measure the regions registered by HIT_REGISTERING.
    let t = Instant::now();
    for i in 0..HIT_REGIONS {
        if i > 0 && t.elapsed() > HIT_REGISTERING {
            break;
        }
        let mr = pd.reg(buf.at(i * stride), HIT_REGION_BYTES, LOCAL)?;
        keys.push(mr.lkey);
        pd.dereg(mr)?;
    }
    let mut out = Vec::new();
    let registered = keys.len();
    for regions in [1, registered] {
        // A fixed permutation of the regions (an LCG), repeated to 1,000 visits.
        let mut order: Vec<usize> = (0..regions).collect();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for i in (1..regions).rev() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            order.swap(i, (x >> 33) as usize % (i + 1));
        }
        let visits: Vec<usize> = (0..1000).map(|i| order[i % regions]).collect();
        let mut hits = true;
        for &i in &visits {
            hits &= held_hits(pd, buf.at(i * stride), HIT_REGION_BYTES, LOCAL, keys[i])?;
        }
        let t = Instant::now();
        let mut figures = Vec::new();
        while figures.len() < 5 || (t.elapsed() < HIT_TIMING && figures.len() < 1001) {
            let b = Instant::now();
            for &i in &visits {
                let mr = pd.reg(buf.at(i * stride), HIT_REGION_BYTES, LOCAL)?;
                pd.dereg(mr)?;
            }
            figures.push(b.elapsed().as_nanos() as f64 / visits.len() as f64);
        }
        out.push(HitPath {
            regions,
            ns: Spread::of(&figures),
            batches: figures.len(),
            hits,
        });
    }
    drop(buf);
    wait_unpinned(before, HIT_DRAIN);
    Ok(out)
}

#[cfg(test)]
mod tests;
