//! The on-demand rows of `mrcache bench` (docs/design/bench.md, "On-demand rows"): where the
//! device pages RC send, receive, write and read on demand, per size,
//!
//! - libibverbs alone: `ibv_reg_mr` + `ibv_dereg_mr` pinned and with `IBV_ACCESS_ON_DEMAND`,
//!   in phases alternating within each round;
//! - the first touch: the device's first RDMA WRITE over the whole of a fresh on-demand
//!   registration against one into a pinned registration held for the row, on a loopback
//!   queue pair (`device::Loopback`), in the same rounds;
//! - the cache's hit + release on an on-demand entry: a co-process (`serve_cached`), the
//!   bench again with `MRCACHE_ODP=on`, as the measuring process is the bench again with
//!   `MRCACHE_ADMIT=always`.
//!
//! Before the rows, whether the device's on-demand writes land where they were sent
//! (`offsets`); from the rows and the device's ids, its on-demand profile (`profile`), which
//! `--odp-profile FILE` writes.

pub mod device;
pub mod offsets;
pub mod profile;
pub mod report;

use super::proc::pinned;
use super::timing::{Spread, batch_for, phase};
use super::verbs::{Buffer, Context, Copy, Mr, Pd, Verbs};
use super::{CHILD_MARK, ON_DEMAND_MARK, Plan};
use device::{
    ACCESS_ON_DEMAND, ACCESS_REMOTE_WRITE, Loopback, RC_SEND_RECV_WRITE_READ, rc_caps_text,
};
use mrcache::config::odp_profile::MIN_ROUNDS;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `IBV_ACCESS_LOCAL_WRITE`: the registrations' access, as the table's local rows.
const LOCAL_WRITE: u32 = 1;
const MAX_ROUNDS: usize = 25;
/// The largest piece one RDMA WRITE carries; a registration is written whole in pieces.
pub const WRITE_PIECE: usize = 4 << 20;
/// Of the cached co-process's time per size: phases of hit + release.
const CACHED_PHASES: usize = 5;

/// One size's on-demand figures, ns.
#[derive(Debug, Clone)]
pub struct Row {
    pub size: usize,
    /// Per round: pinned pair, on-demand pair, write into the pinned registration, first
    /// write into the on-demand one (libibverbs alone).
    pub round_ns: Vec<[f64; 4]>,
    /// The cache's hit + release on an on-demand entry (MRCACHE_ODP=on), or why not.
    pub cached: Result<Spread, String>,
    /// The table's cached figure of the same size, local (a hit on a pinned entry).
    pub cached_pinned_ns: Option<f64>,
    pub took: Duration,
}

/// The median over the rounds of `a / b` (columns of `round_ns`).
pub fn paired(rounds: &[[f64; 4]], a: usize, b: usize) -> f64 {
    let r: Vec<f64> = rounds.iter().map(|x| x[a] / x[b]).collect();
    Spread::of(&r).median
}

impl Row {
    pub fn column(&self, k: usize) -> Spread {
        Spread::of(&self.round_ns.iter().map(|r| r[k]).collect::<Vec<_>>())
    }
}

/// What the device offers, and the rows measured where it offers enough.
pub struct Section {
    pub device: String,
    /// `rc_odp_caps` (0: no explicit ODP), or why it could not be read.
    pub rc_caps: Result<u32, String>,
    /// The device's vendor and vendor part ids (`ibv_query_device`; None: not read).
    pub ids: Option<(u32, u32, String)>,
    /// Where its on-demand writes land (`offsets::check`), where it offers ODP.
    pub offsets: Option<Result<offsets::Offsets, String>>,
    pub rows: Vec<Row>,
    /// Why the rows stopped before the last size (a failed registration or write).
    pub stopped: Option<String>,
    pub took: Duration,
}

impl Section {
    /// The device pages on demand what the rows use (RC send, receive, write, read).
    pub fn offered(&self) -> bool {
        self.rc_caps
            .as_ref()
            .is_ok_and(|c| c & RC_SEND_RECV_WRITE_READ == RC_SEND_RECV_WRITE_READ)
    }

    /// Why there are no on-demand rows, in one line (None: there are).
    pub fn why_none(&self) -> Option<String> {
        if self.offered() {
            return None;
        }
        Some(match &self.rc_caps {
            Err(why) => format!(
                "on-demand paging: {}'s capabilities cannot be read ({why}): no on-demand rows",
                self.device
            ),
            Ok(0) => format!(
                "on-demand paging: {} offers no explicit on-demand paging (ODP) for RC: no on-demand rows",
                self.device
            ),
            Ok(c) => format!(
                "on-demand paging: {} pages on demand for RC only {} (the rows need send, receive, write and read): no on-demand rows",
                self.device,
                rc_caps_text(*c)
            ),
        })
    }
}

/// The rows, with libibverbs alone (`verbs`, `ctx`, `pd`); `cached_pinned(size)` is the
/// table's hit on a pinned entry of that size.
pub fn run(
    verbs: &Verbs,
    ctx: &Context,
    pd: &Pd,
    plan: &Plan,
    clock_ns: f64,
    cached_pinned: impl Fn(usize) -> Option<f64>,
) -> Section {
    let t0 = Instant::now();
    let mut s = Section {
        device: ctx.name.clone(),
        rc_caps: device::rc_on_demand(ctx),
        ids: ctx
            .info()
            .map(|i| (i.vendor_id, i.vendor_part_id, i.fw_ver)),
        offsets: None,
        rows: Vec::new(),
        stopped: None,
        took: Duration::ZERO,
    };
    if s.offered() {
        // On a queue pair of its own: a failed write leaves its queue pair in error.
        s.offsets = Some(Loopback::open(verbs, ctx, pd).and_then(|lb| offsets::check(pd, &lb)));
        let cached = cached_rows(plan);
        // A profile's sizes count only over enough rounds (odp_profile::MIN_ROUNDS).
        let min_rounds = match plan.odp_profile {
            Some(_) => MIN_ROUNDS as usize,
            None => 1,
        };
        let measured = Loopback::open(verbs, ctx, pd).and_then(|lb| {
            for &size in &plan.sizes {
                let mut row = measure(pd, &lb, size, plan.seconds / 2.0, min_rounds, clock_ns)?;
                row.cached = match &cached {
                    Ok(c) => c
                        .iter()
                        .find(|(sz, _)| *sz == size)
                        .map(|(_, r)| r.clone())
                        .unwrap_or_else(|| Err("the co-process gave no figure".into())),
                    Err(e) => Err(e.clone()),
                };
                row.cached_pinned_ns = cached_pinned(size);
                s.rows.push(row);
            }
            Ok(())
        });
        s.stopped = measured.err();
    }
    s.took = t0.elapsed();
    s
}

/// One size's rounds, in `seconds` but at least `min_rounds` of them.
fn measure(
    pd: &Pd,
    lb: &Loopback,
    size: usize,
    seconds: f64,
    min_rounds: usize,
    clock_ns: f64,
) -> Result<Row, String> {
    let t_row = Instant::now();
    let budget = Duration::from_secs_f64(seconds);
    let buf = Buffer::new(size)?;
    let piece = size.min(WRITE_PIECE);
    let src = Buffer::new(piece)?;
    let src_mr = pd.reg(src.addr, piece, LOCAL_WRITE)?;
    let target = LOCAL_WRITE | ACCESS_REMOTE_WRITE;
    // The pinned registration the writes without a first touch go to: its own buffer,
    // registered once for the row and written once before the rounds.
    let held = Buffer::new(size)?;
    let held_mr = pd.reg(held.addr, size, target)?;
    let pair = |flags: u32| pd.dereg(pd.reg(buf.addr, size, flags)?);
    // Warm both kinds and size the batches.
    let mut batch = [1usize; 2];
    for (k, flags) in [LOCAL_WRITE, LOCAL_WRITE | ACCESS_ON_DEMAND]
        .into_iter()
        .enumerate()
    {
        pair(flags)?;
        let t = Instant::now();
        pair(flags)?;
        batch[k] = batch_for(t.elapsed().as_nanos() as f64, clock_ns);
    }
    let write_all = |into: &Buffer, mr: &Mr| -> Result<f64, String> {
        let t = Instant::now();
        for at in (0..size).step_by(piece) {
            let n = piece.min(size - at);
            lb.write(src.addr, &src_mr, n, into.at(at), mr)?;
        }
        Ok(t.elapsed().as_nanos() as f64)
    };
    let writes = writes_per_round(size);
    let slice = budget / 32;
    let mut round_ns: Vec<[f64; 4]> = Vec::new();
    let result = (|| -> Result<(), String> {
        if writes > 1 {
            write_all(&held, &held_mr)?;
        }
        while round_ns.len() < MAX_ROUNDS {
            let r0 = Instant::now();
            let mut r = [f64::NAN; 4];
            // The two pairs' phases, in an order alternating every round.
            for k in 0..2 {
                let which = (k + round_ns.len()) % 2;
                let flags = [LOCAL_WRITE, LOCAL_WRITE | ACCESS_ON_DEMAND][which];
                r[which] = phase(slice, batch[which], || pair(flags))?.0;
            }
            // Writes into the held pinned registration, then as many first writes, each into
            // a fresh on-demand registration of pages the device never mapped (dropped and
            // touched again first, as by an application that reuses its memory; the
            // registrations are not timed). A round's figure is the mean of its writes.
            let mut pinned_ns = 0.0;
            for _ in 0..writes {
                pinned_ns += write_all(&held, &held_mr)?;
            }
            let mut first_ns = 0.0;
            for _ in 0..writes {
                drop_pages(&buf);
                let mr = pd.reg(buf.addr, size, target | ACCESS_ON_DEMAND)?;
                let w = write_all(&buf, &mr);
                pd.dereg(mr)?;
                first_ns += w?;
            }
            r[2] = pinned_ns / writes as f64;
            r[3] = first_ns / writes as f64;
            round_ns.push(r);
            // Rest as long as the round took, as the table's rows do.
            let plain = r0.elapsed();
            std::thread::sleep(plain);
            if round_ns.len() >= min_rounds && t_row.elapsed() + 2 * plain > budget {
                break;
            }
        }
        Ok(())
    })();
    pd.dereg(held_mr)?;
    pd.dereg(src_mr)?;
    result?;
    Ok(Row {
        size,
        round_ns,
        cached: Err(String::new()),
        cached_pinned_ns: None,
        took: t_row.elapsed(),
    })
}

/// Writes of each kind per round: 8 at 128 KiB and under, one from 1 MiB up (a write of the
/// whole registration; under emulation a MiB takes tens of ms).
pub fn writes_per_round(size: usize) -> usize {
    ((1usize << 20) / size.max(1)).clamp(1, 8)
}

/// Give the buffer's pages back and touch them again: new pages, which no registration
/// mapped.
fn drop_pages(buf: &Buffer) {
    // SAFETY: our own mapping, no registration of it alive; its contents do not matter.
    unsafe { libc::madvise(buf.addr.cast(), buf.len, libc::MADV_DONTNEED) };
    for at in (0..buf.len).step_by(4096) {
        // SAFETY: within our mapping, readable and writable.
        unsafe { buf.at(at).write_volatile(1) };
    }
}

type CachedRows = Vec<(usize, Result<Spread, String>)>;

/// The cache's figures from the co-process: this command again, preloaded as this process
/// is, with `MRCACHE_ODP=on` (its lines on stdout, `serve_cached`).
fn cached_rows(plan: &Plan) -> Result<CachedRows, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate myself: {e}"))?;
    let mut child = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(CHILD_MARK, ON_DEMAND_MARK)
        .env("MRCACHE_ODP", "on")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the MRCACHE_ODP=on co-process: {e}"))?;
    let out = child.stdout.take().ok_or("no pipe from the co-process")?;
    let mut rows = Vec::new();
    let mut failed = None;
    for line in BufReader::new(out).lines().map_while(Result::ok) {
        match parse_cached(&line) {
            Some(r) => rows.push(r),
            None => failed = Some(line),
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    if let Some(line) = failed.filter(|_| rows.len() < plan.sizes.len()) {
        return Err(format!("the MRCACHE_ODP=on co-process said: {line}"));
    }
    if !status.success() && rows.is_empty() {
        return Err(format!("the MRCACHE_ODP=on co-process failed ({status})"));
    }
    Ok(rows)
}

/// `size median min max` (ns) or `size - why`.
pub fn parse_cached(line: &str) -> Option<(usize, Result<Spread, String>)> {
    let (size, rest) = line.split_once(' ')?;
    let size = size.parse().ok()?;
    if let Some(why) = rest.strip_prefix("- ") {
        return Some((size, Err(why.to_string())));
    }
    let v: Vec<f64> = rest.split(' ').filter_map(|x| x.parse().ok()).collect();
    let [median, min, max] = v[..] else {
        return None;
    };
    Some((size, Ok(Spread { median, min, max })))
}

/// The co-process (`MRCACHE_ODP=on`, preloaded): per size, one line on stdout: the hit +
/// release through the cache on an entry it made on demand (its miss pinned nothing, two
/// registrations held at once share its lkey), `CACHED_PHASES` phases in an eighth of
/// `--seconds`; or why not.
pub fn serve_cached(plan: &Plan) -> Result<(), String> {
    let verbs = Verbs::open(Copy::Global)?;
    let ctx = verbs.open_device(plan.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    let clock = super::timing::clock_ns();
    for &size in &plan.sizes {
        let buf = Buffer::new(size)?;
        let before = pinned();
        let first = pd.reg(buf.addr, size, LOCAL_WRITE)?;
        let grew = pinned().zip(before).map(|(a, b)| a.saturating_sub(b));
        pd.dereg(first)?;
        let a = pd.reg(buf.addr, size, LOCAL_WRITE)?;
        let b = pd.reg(buf.addr, size, LOCAL_WRITE)?;
        let hits = a.lkey == first.lkey && b.lkey == first.lkey;
        pd.dereg(b)?;
        pd.dereg(a)?;
        if grew != Some(0) {
            println!(
                "{size} - the cache's entry is pinned ({} bytes more in VmPin): the device did not make it on demand",
                grew.map_or("?".into(), |g| g.to_string())
            );
            continue;
        }
        if !hits {
            println!("{size} - passed through: the cache did not keep the registration");
            continue;
        }
        let t = Instant::now();
        pd.dereg(pd.reg(buf.addr, size, LOCAL_WRITE)?)?;
        let batch = batch_for(t.elapsed().as_nanos() as f64, clock);
        let slice = Duration::from_secs_f64(plan.seconds / 8.0 / CACHED_PHASES as f64);
        let mut ns = Vec::new();
        for _ in 0..CACHED_PHASES {
            ns.push(
                phase(slice, batch, || {
                    pd.dereg(pd.reg(buf.addr, size, LOCAL_WRITE)?)
                })?
                .0,
            );
        }
        let s = Spread::of(&ns);
        println!("{size} {} {} {}", s.median, s.min, s.max);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
