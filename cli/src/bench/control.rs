//! The control of `mrcache bench`: what an application without the preload pays, measured
//! in the same time window as the cached figure (docs/design/bench.md, "Three
//! figures, paired").
//!
//! A co-process the measuring process starts (this same command, without libmrcache.so in
//! `LD_PRELOAD`): it opens the device through the process's own libibverbs (the base
//! link-map namespace, as an application calls it) and serves, on request over a pipe, one
//! phase of `ibv_reg_mr` + `ibv_dereg_mr` pairs timed plainly (a clock reading at each end,
//! the phase's figure its total over its pairs, as `timing::phase`).
//! The measuring process asks for one such phase in every round of every row, between its
//! libibverbs-alone (`dlmopen`) phase and its cached phase (the order rotated every round),
//! with as many pairs as its libibverbs-alone phase did, so that each round's no-preload
//! and cached figures come from the same few tens of milliseconds: a stall of the machine
//! or a drift of the device's speed weighs on both. The speed-up is the median over the
//! rounds of the per-round ratio no-preload / cached (`paired_ratio`).
//!
//! Protocol (one line each way, text): the control starts with `ready <clock ns> <path of
//! its libibverbs>`; `row <size> <local|remote>` maps and warms that row's buffer, answered
//! `ok`; `phase <pairs> <batch>` answers the ns per pair (the phase's total over its
//! pairs; `batch`, the measuring process's batch, is checked and not otherwise used);
//! end of input ends it (exit 0). An error
//! is one `mrcache: ...` line on stderr and exit 2.

use super::Plan;
use super::admission::{Access, access_name, flags};
use super::preload::is_ours;
use super::timing::{Spread, clock_ns, counted_phase};
use super::verbs::{Buffer, Copy, Verbs};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// Agreement: the copies differ when both hold (docs/design/bench.md): the one copy was the
/// slower in more rounds than chance gives (a sign test, `Z_MAX` standard deviations over
/// half the rounds) and the median of the per-round ratios is off 1 by more than `SPREAD`.
pub const Z_MAX: f64 = 3.5;
/// The spread the namespace comparison is stated at.
pub const NAMESPACE_SPREAD: f64 = 0.05;

/// How two figures compare over a set of rounds.
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
        Agreement {
            rounds: n,
            first_slower: slower,
            z,
            median_ratio: paired_ratio(&pairs),
            spread,
        }
    }

    /// The two differ: consistently (the sign test) and by more than their spread.
    pub fn differ(&self) -> bool {
        self.z.abs() > Z_MAX && (self.median_ratio - 1.0).abs() > self.spread
    }
}

/// The median over the rounds of first / second, each round's two figures measured in the
/// same window (NaN without a round of two positive, finite figures).
pub fn paired_ratio(pairs: &[(f64, f64)]) -> f64 {
    let ratios: Vec<f64> = pairs
        .iter()
        .filter(|(a, b)| a.is_finite() && b.is_finite() && *a > 0.0 && *b > 0.0)
        .map(|(a, b)| a / b)
        .collect();
    Spread::of(&ratios).median
}

/// One answer of the control: a positive, finite number of ns (anything else is an error
/// naming what came).
pub fn parse_ns(line: &str) -> Result<f64, String> {
    line.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
        .ok_or_else(|| {
            format!(
                "the control process answered {:?}, not a positive number of ns per pair",
                line.trim()
            )
        })
}

/// The variable a test sets to stall every other phase of the control by its value in ms
/// once, inside the phase's timing.
pub const STALL_MARK: &str = "_MRCACHE_BENCH_CONTROL_STALL_MS";

/// The control's injected stall, in ms, when a test set `STALL_MARK` (the control inherits
/// the measuring process's environment); --json shows it (`injected_stall_ms`), so that
/// figures taken with it cannot pass for real ones.
pub fn injected_stall_ms() -> Option<u64> {
    std::env::var(STALL_MARK)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
}

/// The measuring process's end of the control co-process.
pub struct Peer {
    child: Child,
    to: Option<ChildStdin>,
    from: BufReader<ChildStdout>,
    pub clock_ns: f64,
    pub base_from: String,
}

impl Peer {
    /// Start this same command as the control, with `LD_PRELOAD` set to `preload` (the
    /// measuring process's without any copy of libmrcache), and wait for it to be ready.
    pub fn start(preload: Option<std::ffi::OsString>) -> Result<Peer, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot locate myself: {e}"))?;
        let mut cmd = Command::new(&exe);
        cmd.args(std::env::args_os().skip(1))
            .env(super::CHILD_MARK, super::CONTROL_MARK)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        match preload {
            Some(p) => cmd.env("LD_PRELOAD", p),
            None => cmd.env_remove("LD_PRELOAD"),
        };
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
        let to = child
            .stdin
            .take()
            .ok_or("the control process has no input")?;
        let from = BufReader::new(
            child
                .stdout
                .take()
                .ok_or("the control process has no output")?,
        );
        let mut peer = Peer {
            child,
            to: Some(to),
            from,
            clock_ns: f64::NAN,
            base_from: String::new(),
        };
        let ready = peer.line()?;
        let mut w = ready.trim().splitn(3, ' ');
        match (w.next(), w.next().map(parse_ns), w.next()) {
            (Some("ready"), Some(Ok(clock)), Some(from)) if !from.is_empty() => {
                peer.clock_ns = clock;
                peer.base_from = from.to_string();
                Ok(peer)
            }
            _ => Err(format!(
                "the control process started with {:?}, not \"ready <clock ns> <libibverbs>\"",
                ready.trim()
            )),
        }
    }

    /// The next line the control wrote; its end (with how it ended) is an error.
    fn line(&mut self) -> Result<String, String> {
        let mut s = String::new();
        match self.from.read_line(&mut s) {
            Ok(n) if n > 0 => Ok(s),
            r => {
                let status = self.child.wait();
                Err(format!(
                    "the control process of mrcache bench (libibverbs without the preload) ended{}: {}",
                    r.err().map(|e| format!(" ({e})")).unwrap_or_default(),
                    status.map_or_else(|e| e.to_string(), |s| s.to_string())
                ))
            }
        }
    }

    fn ask(&mut self, request: &str) -> Result<String, String> {
        let sent = self
            .to
            .as_mut()
            .is_some_and(|to| writeln!(to, "{request}").and_then(|_| to.flush()).is_ok());
        if !sent {
            // It is gone: its status says why.
            return self.line();
        }
        self.line()
    }

    /// Map and warm the row's buffer in the control.
    pub fn row(&mut self, size: usize, access: Access) -> Result<(), String> {
        let r = self.ask(&format!("row {size} {}", access_name(access)))?;
        if r.trim() == "ok" {
            Ok(())
        } else {
            Err(format!(
                "the control process answered {:?} to a row",
                r.trim()
            ))
        }
    }

    /// One no-preload phase of `pairs` pairs on the row's buffer: its total over its pairs
    /// (`timing::counted_phase`).
    pub fn phase(&mut self, pairs: usize, batch: usize) -> Result<f64, String> {
        let r = self.ask(&format!("phase {} {}", pairs.max(1), batch.max(1)))?;
        parse_ns(&r)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // The end of its input ends it.
        drop(self.to.take());
        let _ = self.child.wait();
    }
}

/// The control process: serve phases until the end of its input.
pub fn serve(plan: &Plan) -> Result<(), String> {
    let base = Verbs::open(Copy::Global)?;
    if is_ours(&base.reg_from) || is_ours(&base.dereg_from) {
        return Err(format!(
            "the control process of mrcache bench (libibverbs without the preload) resolves ibv_reg_mr to {}: remove it from LD_PRELOAD",
            base.reg_from
        ));
    }
    let ctx = base.open_device(plan.device.as_deref())?;
    let pd = ctx.alloc_pd()?;
    let clock = clock_ns();
    let out = std::io::stdout();
    let mut out = out.lock();
    let say = |out: &mut std::io::StdoutLock, s: &str| -> Result<(), String> {
        writeln!(out, "{s}")
            .and_then(|_| out.flush())
            .map_err(|e| format!("the control process cannot answer: {e}"))
    };
    // Warm before the first row (in a run on rxe without this, the first row's median was
    // 9x the next one's): 200 ms of 4 KiB pairs, untimed.
    {
        let buf = Buffer::new(4096)?;
        let f = flags(Access::Local);
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(200) {
            pd.dereg(pd.reg(buf.addr, 4096, f)?)?;
        }
    }
    say(&mut out, &format!("ready {clock:.0} {}", base.reg_from))?;
    // A test's injection (docs/testing.md): every other phase stalls this long once, as a
    // machine busy for that phase would stall it, so the row's figures range wide.
    let stall = injected_stall_ms().map(Duration::from_millis);
    let mut phases = 0u64;
    let mut row: Option<(Buffer, usize, u32)> = None;
    for line in std::io::stdin().lock().lines() {
        let line =
            line.map_err(|e| format!("the control process cannot read its requests: {e}"))?;
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["row", size, access] => {
                let size: usize = size.parse().map_err(|_| {
                    format!("the control process was asked for a row of {size:?} bytes")
                })?;
                let access = match *access {
                    "local" => Access::Local,
                    "remote" => Access::Remote,
                    a => return Err(format!("the control process was asked for {a:?} access")),
                };
                // The last row's buffer goes first (it may be large).
                drop(row.take());
                let buf = Buffer::new(size)?;
                let f = flags(access);
                // Warm: the first pins of the pages.
                for _ in 0..2 {
                    pd.dereg(pd.reg(buf.addr, size, f)?)?;
                }
                row = Some((buf, size, f));
                say(&mut out, "ok")?;
            }
            ["phase", n, batch] => {
                let count = |v: &str| v.parse::<usize>().ok().filter(|&n| n > 0);
                let (n, _batch) = count(n).zip(count(batch)).ok_or_else(|| {
                    format!("the control process was asked for {n:?} pairs in batches of {batch:?}")
                })?;
                let (buf, size, f) = row
                    .as_ref()
                    .ok_or("the control process was asked for a phase before a row")?;
                // The injection: one stall in every other phase, inside its timing.
                let slow = stall.filter(|_| phases % 2 == 1);
                let mut i = 0usize;
                let ns = counted_phase(n, || {
                    if let Some(d) = slow.filter(|_| i == 0) {
                        std::thread::sleep(d);
                    }
                    i += 1;
                    pd.dereg(pd.reg(buf.addr, *size, *f)?)
                })?;
                phases += 1;
                say(&mut out, &format!("{ns:.1}"))?;
            }
            _ => return Err(format!("the control process was asked {line:?}")),
        }
    }
    drop(row);
    Ok(())
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
        // Always slower by 3%: consistent, within the namespace's spread.
        let near: Vec<(f64, f64)> = (0..50).map(|_| (103.0, 100.0)).collect();
        assert!(!of(&near).differ());
        assert!(Agreement::of(&near, 0.02).differ());
        // Faster by 10% differs as well.
        let fast: Vec<(f64, f64)> = (0..50).map(|_| (90.0, 100.0)).collect();
        assert!(of(&fast).differ());
        // Too few rounds cannot differ.
        assert!(!of(&slow[..10]).differ());
        assert_eq!(of(&[]).rounds, 0);
    }

    /// The speed-up is the median over the rounds of each round's no-preload / cached:
    /// a stall that hits one phase of a round moves that round's ratio only.
    #[test]
    fn speedup_is_the_median_of_paired_ratios() {
        // True ratio 0.25 (remote 4 KiB on rxe: the cache 4x dearer than libibverbs); in
        // 6 rounds of 25 the no-preload phase stalls (x20), in 6 others the cached one.
        let pairs: Vec<(f64, f64)> = (0..25)
            .map(|i| match i % 4 {
                1 if i < 24 => (1000.0, 200.0),
                3 => (50.0, 4000.0),
                _ => (50.0, 200.0),
            })
            .collect();
        assert_eq!(paired_ratio(&pairs), 0.25);
        // What bench_control recomputes from the JSON rounds: a divisor 1.5x the paired
        // one (or the control's dlmopen figure) does not pass for it.
        let biased: Vec<(f64, f64)> = pairs.iter().map(|p| (p.0 * 1.5, p.1)).collect();
        assert_eq!(paired_ratio(&biased), 0.375);
        assert!(paired_ratio(&[]).is_nan());
        assert!(paired_ratio(&[(0.0, 1.0), (f64::NAN, 1.0)]).is_nan());
        assert_eq!(paired_ratio(&[(0.0, 1.0), (3.0, 2.0)]), 1.5);
    }

    /// The control's answers: a positive number of ns, else an error naming what came.
    #[test]
    fn answers_are_positive_figures() {
        assert_eq!(parse_ns("1234.5\n").unwrap(), 1234.5);
        for bad in ["", "0", "0.0", "-3", "nan", "inf", "x", "12 13"] {
            let e = parse_ns(bad).unwrap_err();
            assert!(
                e.contains("not a positive number of ns per pair") && !e.contains('\n'),
                "{bad}: {e}"
            );
        }
    }
}
