//! Where log, trace and statistics lines go (`MRCACHE_LOG_FILE`, else stderr), and the
//! trace ring's writer.
//!
//! At `MRCACHE_LOG=trace` each hook pushes a fixed-size record into a bounded lock-free
//! ring (`mrcache::trace::TraceRing`): no formatting, no allocation, no lock in the hook. A
//! writer thread formats and writes them; records left at exit are written by an atexit
//! handler; a full ring drops records and counts them. The ring exists only after the first
//! verbs call in a process that asked for a trace: elsewhere the hooks see a null pointer.

use mrcache::config::LogLevel;
use mrcache::log::{LogFormat, Logger};
use mrcache::stats::expand_path;
use mrcache::trace::{Call, Outcome, Record, TraceRing, format};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering::*};
use std::sync::{Mutex, OnceLock};

static RING: AtomicPtr<TraceRing> = AtomicPtr::new(std::ptr::null_mut());
static T0: AtomicU64 = AtomicU64::new(0);
static WRITER_RUNNING: AtomicBool = AtomicBool::new(false);

/// The open log file (None: stderr) and the pattern it came from.
struct Sink {
    pattern: Option<String>,
    file: Option<std::fs::File>,
}

static SINK: Mutex<Sink> = Mutex::new(Sink {
    pattern: None,
    file: None,
});

pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes.
    if unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn open(pattern: &str) -> Option<std::fs::File> {
    let path = expand_path(pattern, std::process::id(), &host_name());
    match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!("mrcache: cannot open MRCACHE_LOG_FILE {path}: {e}; logging to stderr");
            None
        }
    }
}

/// Called once, at the first verbs call, with MRCACHE_LOG_FILE.
pub fn set_log_file(pattern: Option<&str>) {
    let mut s = SINK.lock().unwrap_or_else(|e| e.into_inner());
    s.pattern = pattern.map(str::to_string);
    s.file = pattern.and_then(open);
}

/// Append one line to the log sink.
/// Where log and trace lines go through `tracing` (`mrcache::log`): set up with the
/// runtime when `MRCACHE_LOG` is not off.
static LOGGER: OnceLock<Logger> = OnceLock::new();

pub fn set_logger(filter: &str, format: LogFormat) {
    if let Some((filter, _)) = mrcache::log::parse_filter(filter) {
        let _ = LOGGER.set(Logger::new(filter, format, write_line));
    }
}

/// One of the library's own lines at `level` (the filter decides whether it is written).
pub fn log_line(level: LogLevel, line: &str) {
    if let Some(logger) = LOGGER.get() {
        logger.line(level, line);
    }
}

pub fn write_line(line: &str) {
    let mut s = SINK.lock().unwrap_or_else(|e| e.into_inner());
    let ok = match s.file.as_mut() {
        Some(f) => writeln!(f, "{line}").is_ok(),
        None => false,
    };
    if !ok {
        eprintln!("{line}");
    }
}

pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills ts; async-signal-safe, no allocation.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[inline]
pub fn enabled() -> bool {
    !RING.load(Relaxed).is_null()
}

/// Record one interposed call that started at `start` (from `now_ns`). Lock-free.
#[inline]
pub fn emit(call: Call, outcome: Outcome, args: [u64; 5], result: i64, start: u64) {
    let ring = RING.load(Acquire);
    if ring.is_null() {
        return;
    }
    let end = now_ns();
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    let r = Record {
        at_ns: start.saturating_sub(T0.load(Relaxed)),
        dur_ns: end.saturating_sub(start),
        call,
        outcome,
        tid,
        args,
        result,
    };
    // SAFETY: the ring is leaked when created and never freed.
    unsafe { (*ring).push(&r) };
}

/// Start tracing (MRCACHE_LOG=trace), at the first verbs call.
pub fn start(records: usize) {
    if enabled() {
        return;
    }
    T0.store(now_ns(), Relaxed);
    let ring = Box::leak(Box::new(TraceRing::new(records)));
    RING.store(ring, Release);
    // SAFETY: registering a plain extern "C" fn.
    unsafe { libc::atexit(flush_at_exit) };
    ensure_writer();
}

pub fn dropped() -> u64 {
    let ring = RING.load(Acquire);
    // SAFETY: leaked, never freed.
    if ring.is_null() {
        0
    } else {
        unsafe { (*ring).dropped.load(Relaxed) }
    }
}

/// One consumer at a time (the writer thread, the exit flush): the ring's pop is
/// single-consumer, and lines must come out in the order the calls were recorded.
static DRAINING: Mutex<()> = Mutex::new(());

fn drain() {
    let ring = RING.load(Acquire);
    if ring.is_null() {
        return;
    }
    let _one = DRAINING.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    // SAFETY: leaked, never freed.
    while let Some(r) = unsafe { (*ring).pop() } {
        match LOGGER.get() {
            Some(logger) => logger.record(pid, &r),
            None => write_line(&format!("mrcache[{pid}]: {}", format(&r))),
        }
    }
}

pub fn ensure_writer() {
    if !enabled() || WRITER_RUNNING.load(Relaxed) || WRITER_RUNNING.swap(true, Relaxed) {
        return;
    }
    crate::runtime::spawn_settled(c"mrcache-trace", || {
        loop {
            let asked = FLUSH_ASKED.load(Acquire);
            drain();
            FLUSH_DONE.fetch_max(asked, Release);
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    });
}

/// Exit flushes the writer has done: `flush_at_exit` asks, the writer answers after a drain.
static FLUSH_ASKED: AtomicU64 = AtomicU64::new(0);
static FLUSH_DONE: AtomicU64 = AtomicU64::new(0);

/// The records still in the ring at exit are written by the writer thread when there is
/// one: by now glibc's `exit` has run this thread's thread-local destructors, and `tracing`
/// finds its dispatcher (and the fmt layer its buffer) through thread-locals, so lines
/// written from here went nowhere. Waits at most a second, then drains here.
extern "C" fn flush_at_exit() {
    if WRITER_RUNNING.load(Relaxed) {
        let asked = FLUSH_ASKED.fetch_add(1, AcqRel) + 1;
        for _ in 0..1000 {
            if FLUSH_DONE.load(Acquire) >= asked {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    drain();
    let d = dropped();
    if d > 0 {
        write_line(&format!(
            "mrcache[{}]: trace ring overflow: {d} records dropped",
            std::process::id()
        ));
    }
}

/// The log sink's lock, held across a fork (taken in the prepare handler) so that the
/// child never inherits it locked by a thread that does not exist there.
pub struct ForkSink(std::sync::MutexGuard<'static, Sink>);

/// In a `_Fork()` child: the writer thread is gone (an atomic store, signal-safe).
pub fn writer_gone() {
    WRITER_RUNNING.store(false, Relaxed);
}

pub fn prepare_fork() -> ForkSink {
    ForkSink(SINK.lock().unwrap_or_else(|e| e.into_inner()))
}

impl ForkSink {
    pub fn parent(self) {}

    /// In the child: its own file when the name has %p; the writer thread is gone.
    pub fn child(mut self) {
        WRITER_RUNNING.store(false, Relaxed);
        if let Some(p) = self.0.pattern.clone()
            && p.contains("%p")
        {
            self.0.file = open(&p);
        }
        drop(self);
        ensure_writer();
    }
}
