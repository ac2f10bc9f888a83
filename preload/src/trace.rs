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
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering::*};

static RING: AtomicPtr<TraceRing> = AtomicPtr::new(std::ptr::null_mut());
static T0: AtomicU64 = AtomicU64::new(0);
static WRITER_RUNNING: AtomicBool = AtomicBool::new(false);

/// The log file's descriptor (-1: stderr) and the pattern it came from. No lock: a line is
/// one `write(2)` (O_APPEND, so lines from several threads and processes do not
/// interleave), and a fork child never inherits a lock of the sink's held by a thread it
/// does not have (its logging, its exit summary would wait forever).
static LOG_FD: AtomicI32 = AtomicI32::new(-1);
static PATTERN: OnceLock<String> = OnceLock::new();

pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes.
    if unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The file named by `pattern` for this process, opened for appending: its descriptor.
fn open(pattern: &str) -> Option<i32> {
    let path = expand_path(pattern, std::process::id(), &host_name());
    match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        Ok(f) => Some(std::os::fd::IntoRawFd::into_raw_fd(f)),
        Err(e) => {
            write_fd(
                2,
                &format!("mrcache: cannot open MRCACHE_LOG_FILE {path}: {e}; logging to stderr"),
            );
            None
        }
    }
}

/// Called once, at the first verbs call, with MRCACHE_LOG_FILE.
pub fn set_log_file(pattern: Option<&str>) {
    let Some(pattern) = pattern else { return };
    let _ = PATTERN.set(pattern.to_string());
    if let Some(fd) = open(pattern) {
        let old = LOG_FD.swap(fd, SeqCst);
        if old >= 0 {
            // SAFETY: our own descriptor, replaced above.
            unsafe { libc::close(old) };
        }
    }
}

/// In a fork child: its own log file when the name has %p. The new file takes the old
/// descriptor's number (`dup3`), so a line being written meanwhile goes to one or the
/// other, never to a descriptor closed or reused under it.
fn reopen_in_child() {
    let Some(p) = PATTERN.get().filter(|p| p.contains("%p")) else {
        return;
    };
    let old = LOG_FD.load(SeqCst);
    match open(p) {
        Some(fd) if old >= 0 => {
            // SAFETY: plain descriptor calls on our own descriptors.
            unsafe {
                // dup3, not dup2: the descriptor stays close-on-exec, as std opened it.
                libc::dup3(fd, old, libc::O_CLOEXEC);
                libc::close(fd);
            }
        }
        Some(fd) => LOG_FD.store(fd, SeqCst),
        None => {
            let old = LOG_FD.swap(-1, SeqCst);
            if old >= 0 {
                // SAFETY: our own descriptor (the parent's file), replaced above.
                unsafe { libc::close(old) };
            }
        }
    }
}

/// `line` and a newline in one `write(2)` to `fd`; false if it could not be written.
fn write_fd(fd: i32, line: &str) -> bool {
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line.as_bytes());
    buf.push(b'\n');
    let mut at = 0;
    while at < buf.len() {
        // SAFETY: writes from a live buffer of that length.
        let n = unsafe { libc::write(fd, buf[at..].as_ptr().cast(), buf.len() - at) };
        if n > 0 {
            at += n as usize;
        } else if n < 0 && crate::sys::errno() == libc::EINTR {
            continue;
        } else {
            return false;
        }
    }
    true
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

/// The log file, else stderr (straight to descriptor 2: std's stderr takes a lock).
pub fn write_line(line: &str) {
    let fd = LOG_FD.load(Relaxed);
    if fd < 0 || !write_fd(fd, line) {
        write_fd(2, line);
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
    if ring.is_null() {
        0
    } else {
        // SAFETY: a published ring is leaked, never freed.
        unsafe { (*ring).dropped.load(Relaxed) }
    }
}

/// One consumer at a time (the writer thread, the exit flush): the ring's pop is
/// single-consumer, and lines must come out in the order the calls were recorded. A flag,
/// not a lock: a fork child, whose writer thread is gone, clears it (`writer_gone`), and a
/// drain never waits for it.
static DRAINING: AtomicBool = AtomicBool::new(false);
/// The most records one drain writes before it lets the flag go (the exit flush may be
/// waiting for it while other threads keep the ring full).
const DRAIN_BATCH: usize = 4096;

/// Writes what the ring holds, at most `DRAIN_BATCH` records; true when it found no more
/// (or there is no ring), false when more are left or another consumer is draining.
fn drain() -> bool {
    let ring = RING.load(Acquire);
    if ring.is_null() {
        return true;
    }
    if DRAINING.swap(true, Acquire) {
        return false;
    }
    let pid = std::process::id();
    let mut emptied = false;
    for _ in 0..DRAIN_BATCH {
        // SAFETY: leaked, never freed.
        let Some(r) = (unsafe { (*ring).pop() }) else {
            emptied = true;
            break;
        };
        match LOGGER.get() {
            Some(logger) => logger.record(pid, &r),
            None => write_line(&format!("mrcache[{pid}]: {}", format(&r))),
        }
    }
    DRAINING.store(false, Release);
    emptied
}

pub fn ensure_writer() {
    if !enabled() || WRITER_RUNNING.load(Relaxed) || WRITER_RUNNING.swap(true, Relaxed) {
        return;
    }
    crate::sys::thread::spawn_settled(c"mrcache-trace", || {
        loop {
            let asked = FLUSH_ASKED.load(Acquire);
            while !drain() {
                if DRAINING.load(Relaxed) {
                    std::thread::yield_now();
                }
            }
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
    // At most a second more: another thread may hold the drain, or keep the ring full.
    for _ in 0..1000 {
        if drain() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let d = dropped();
    if d > 0 {
        write_line(&format!(
            "mrcache[{}]: trace ring overflow: {d} records dropped",
            std::process::id()
        ));
    }
}

/// In a fork child (`_Fork()` too, maybe in a signal handler: atomic stores only): the
/// writer thread is gone, and with it any drain it was in.
pub fn writer_gone() {
    WRITER_RUNNING.store(false, Relaxed);
    DRAINING.store(false, Release);
}

/// In a `fork()` child, after `writer_gone`: its own file when the name has %p, and a
/// writer of its own.
pub fn after_fork_child() {
    reopen_in_child();
    ensure_writer();
}
