//! Call trace records: what a hook says about one interposed call, as a fixed-size record
//! pushed into a bounded lock-free ring (`TraceRing`). Hooks never format or allocate; a
//! writer thread pops the records and formats them into lines. A full ring drops the new
//! record and counts it: tracing never blocks and never changes what the app sees.

use crate::ring::{self, Next, Ring};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// The interposed calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Call {
    /// `ibv_reg_mr`.
    RegMr = 1,
    /// `ibv_reg_mr_iova`.
    RegMrIova,
    /// `ibv_reg_mr_iova2`.
    RegMrIova2,
    /// `ibv_dereg_mr`.
    DeregMr,
    /// `ibv_rereg_mr`.
    ReregMr,
    /// `ibv_reg_dmabuf_mr`.
    RegDmabufMr,
    /// `ibv_dealloc_pd`.
    DeallocPd,
    /// `ibv_close_device`.
    CloseDevice,
    /// `ibv_fork_init`.
    ForkInit,
    /// `munmap`.
    Munmap,
    /// `madvise`.
    Madvise,
    /// `mremap`.
    Mremap,
    /// `mmap` (over an existing mapping).
    Mmap,
    /// `brk`.
    Brk,
    /// `sbrk`.
    Sbrk,
    /// `shmat`.
    Shmat,
    /// `shmdt`.
    Shmdt,
    /// `realloc` (of a block it moves).
    Realloc,
}

const CALLS: [Call; 18] = [
    Call::RegMr,
    Call::RegMrIova,
    Call::RegMrIova2,
    Call::DeregMr,
    Call::ReregMr,
    Call::RegDmabufMr,
    Call::DeallocPd,
    Call::CloseDevice,
    Call::ForkInit,
    Call::Munmap,
    Call::Madvise,
    Call::Mremap,
    Call::Mmap,
    Call::Brk,
    Call::Sbrk,
    Call::Shmat,
    Call::Shmdt,
    Call::Realloc,
];

impl Call {
    /// The C function's name.
    pub fn name(self) -> &'static str {
        match self {
            Call::RegMr => "ibv_reg_mr",
            Call::RegMrIova => "ibv_reg_mr_iova",
            Call::RegMrIova2 => "ibv_reg_mr_iova2",
            Call::DeregMr => "ibv_dereg_mr",
            Call::ReregMr => "ibv_rereg_mr",
            Call::RegDmabufMr => "ibv_reg_dmabuf_mr",
            Call::DeallocPd => "ibv_dealloc_pd",
            Call::CloseDevice => "ibv_close_device",
            Call::ForkInit => "ibv_fork_init",
            Call::Munmap => "munmap",
            Call::Madvise => "madvise",
            Call::Mremap => "mremap",
            Call::Mmap => "mmap",
            Call::Brk => "brk",
            Call::Sbrk => "sbrk",
            Call::Shmat => "shmat",
            Call::Shmdt => "shmdt",
            Call::Realloc => "realloc",
        }
    }

    /// Argument names, in record order.
    fn args(self) -> &'static [&'static str] {
        match self {
            Call::RegMr => &["pd", "addr", "len", "access"],
            Call::RegMrIova | Call::RegMrIova2 => &["pd", "addr", "len", "iova", "access"],
            Call::DeregMr => &["mr"],
            Call::ReregMr => &["mr", "flags", "addr", "len"],
            Call::RegDmabufMr => &["pd", "offset", "len", "fd"],
            Call::DeallocPd => &["pd"],
            Call::CloseDevice => &["context"],
            Call::ForkInit => &[],
            Call::Munmap => &["addr", "len"],
            Call::Madvise => &["addr", "len", "advice"],
            Call::Mremap => &["old", "old_len", "new_len", "flags"],
            Call::Mmap => &["addr", "len", "flags"],
            Call::Brk => &["addr"],
            Call::Sbrk => &["incr"],
            Call::Shmat => &["shmid", "addr", "flags"],
            Call::Shmdt => &["addr"],
            Call::Realloc => &["ptr", "size"],
        }
    }

    fn from_u8(v: u8) -> Option<Call> {
        CALLS.iter().copied().find(|c| *c as u8 == v)
    }
}

/// What the library did with the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Outcome {
    /// Served by a cached registration of the same range.
    Hit = 1,
    /// Served by a cached registration of a containing range.
    HitContaining,
    /// Registered and cached.
    Miss,
    /// Registered, not cached.
    Uncached,
    /// Passed to libibverbs untouched (not for the cache).
    Bypass,
    /// The provider refused it.
    Failed,
    /// Released; the registration stays cached.
    Kept,
    /// Released and deregistered.
    Deregistered,
    /// Passed to the real function, nothing for the cache to do.
    Passthrough,
    /// A second `ibv_dereg_mr` of the same handle.
    DoubleDereg,
    /// A memory hook that removed cached ranges.
    Invalidate,
    /// A PD or context teardown that flushed cached entries.
    Flush,
}

const OUTCOMES: [Outcome; 12] = [
    Outcome::Hit,
    Outcome::HitContaining,
    Outcome::Miss,
    Outcome::Uncached,
    Outcome::Bypass,
    Outcome::Failed,
    Outcome::Kept,
    Outcome::Deregistered,
    Outcome::Passthrough,
    Outcome::DoubleDereg,
    Outcome::Invalidate,
    Outcome::Flush,
];

impl Outcome {
    /// The outcome as trace lines write it.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Hit => "hit",
            Outcome::HitContaining => "hit-containing",
            Outcome::Miss => "miss",
            Outcome::Uncached => "uncached",
            Outcome::Bypass => "bypass",
            Outcome::Failed => "failed",
            Outcome::Kept => "kept",
            Outcome::Deregistered => "deregistered",
            Outcome::Passthrough => "passthrough",
            Outcome::DoubleDereg => "double-dereg",
            Outcome::Invalidate => "invalidate",
            Outcome::Flush => "flush",
        }
    }

    fn from_u8(v: u8) -> Option<Outcome> {
        OUTCOMES.iter().copied().find(|o| *o as u8 == v)
    }
}

/// One interposed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Nanoseconds since the trace started.
    pub at_ns: u64,
    /// How long the call took.
    pub dur_ns: u64,
    /// Which call.
    pub call: Call,
    /// What the library did with it.
    pub outcome: Outcome,
    /// The calling thread.
    pub tid: u32,
    /// The call's arguments (pointers and lengths as integers).
    pub args: [u64; 5],
    /// Its return value.
    pub result: i64,
}

const WORDS: usize = 9;

/// Bounded multi-producer ring of records (`ring::Ring`); one consumer (the writer thread).
pub struct TraceRing {
    ring: Ring<WORDS, Box<[ring::Slot<WORDS>]>>,
    /// Records dropped because the ring was full.
    pub dropped: AtomicU64,
}

impl TraceRing {
    /// An empty ring of `capacity` records.
    pub fn new(capacity: usize) -> TraceRing {
        TraceRing {
            ring: Ring::with_slots((0..capacity).map(ring::Slot::new).collect()),
            dropped: AtomicU64::new(0),
        }
    }

    /// Lock-free, allocation-free; a full ring drops the record and counts it.
    pub fn push(&self, r: &Record) {
        let mut w = [0u64; WORDS];
        w[0] = r.at_ns;
        w[1] = r.dur_ns;
        w[2] = r.call as u64 | (r.outcome as u64) << 8 | (r.tid as u64) << 32;
        w[3..8].copy_from_slice(&r.args);
        w[8] = r.result as u64;
        if !self.ring.push(w) {
            self.dropped.fetch_add(1, Relaxed);
        }
    }

    /// The next record, if one is complete.
    pub fn pop(&self) -> Option<Record> {
        let Next::Ready(w) = self.ring.pop() else {
            return None;
        };
        let tag = w[2];
        Some(Record {
            at_ns: w[0],
            dur_ns: w[1],
            call: Call::from_u8(tag as u8)?,
            outcome: Outcome::from_u8((tag >> 8) as u8)?,
            tid: (tag >> 32) as u32,
            args: std::array::from_fn(|i| w[3 + i]),
            result: w[8] as i64,
        })
    }
}

/// One line for a record: `+<ms> [<tid>] call(arg=value, ...) = result outcome <ns>ns`.
pub fn format(r: &Record) -> String {
    let mut s = String::with_capacity(128);
    let _ = write!(
        s,
        "+{}.{:06}ms [{}] {}(",
        r.at_ns / 1_000_000,
        r.at_ns % 1_000_000,
        r.tid,
        r.call.name()
    );
    for (i, name) in r.call.args().iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let v = r.args[i];
        match *name {
            "len" | "old_len" | "new_len" | "size" | "fd" | "shmid" | "advice" => {
                let _ = write!(s, "{name}={v}");
            }
            "incr" => {
                let _ = write!(s, "{name}={}", v as i64);
            }
            _ => {
                let _ = write!(s, "{name}={v:#x}");
            }
        }
    }
    let result = match r.call {
        Call::RegMr
        | Call::RegMrIova
        | Call::RegMrIova2
        | Call::RegDmabufMr
        | Call::Mremap
        | Call::Mmap
        | Call::Sbrk
        | Call::Shmat
        | Call::Realloc => {
            format!("{:#x}", r.result)
        }
        _ => r.result.to_string(),
    };
    let _ = write!(s, ") = {result} {} {}ns", r.outcome.name(), r.dur_ns);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(call: Call, outcome: Outcome, args: [u64; 5], result: i64) -> Record {
        Record {
            at_ns: 1_500_000,
            dur_ns: 812,
            call,
            outcome,
            tid: 7,
            args,
            result,
        }
    }

    #[test]
    fn lines_have_exact_fields() {
        let r = rec(
            Call::RegMr,
            Outcome::Hit,
            [0x10, 0x7f00, 4096, 3, 0],
            0x5500,
        );
        assert_eq!(
            format(&r),
            "+1.500000ms [7] ibv_reg_mr(pd=0x10, addr=0x7f00, len=4096, access=0x3) = 0x5500 hit 812ns"
        );
        let r = rec(
            Call::Munmap,
            Outcome::Invalidate,
            [0x7f00, 8192, 0, 0, 0],
            0,
        );
        assert_eq!(
            format(&r),
            "+1.500000ms [7] munmap(addr=0x7f00, len=8192) = 0 invalidate 812ns"
        );
        let r = rec(
            Call::DeregMr,
            Outcome::DoubleDereg,
            [0x5500, 0, 0, 0, 0],
            22,
        );
        assert_eq!(
            format(&r),
            "+1.500000ms [7] ibv_dereg_mr(mr=0x5500) = 22 double-dereg 812ns"
        );
    }

    #[test]
    fn ring_round_trips_and_counts_overflow() {
        let ring = TraceRing::new(4);
        for i in 0..6 {
            ring.push(&rec(Call::Munmap, Outcome::Invalidate, [i, 1, 0, 0, 0], 0));
        }
        assert_eq!(ring.dropped.load(Relaxed), 2);
        let got: Vec<u64> = std::iter::from_fn(|| ring.pop())
            .map(|r| r.args[0])
            .collect();
        assert_eq!(got, vec![0, 1, 2, 3]);
        ring.push(&rec(Call::DeallocPd, Outcome::Flush, [0; 5], 123));
        assert_eq!(
            ring.pop().map(|r| (r.call, r.outcome, r.result)),
            Some((Call::DeallocPd, Outcome::Flush, 123))
        );
        assert_eq!(ring.pop(), None);
    }
}
