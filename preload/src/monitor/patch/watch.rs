//! The watch on the code we patched: one word a hit reads instead of every site, set by the
//! hooks that change a watched page (`watch_begin`, `watch_end`), over the spans of pages it
//! covers. `pages` clears it after a look at the mappings and re-checks it.

use super::*;
use std::sync::atomic::{
    AtomicU64, AtomicUsize,
    Ordering::{Relaxed, SeqCst},
};

/// The watch on the code we patched (see docs/design/monitor.md, "The patch check"): instead
/// of reading every site on every hit, a hit reads this one word. Bit 0 (`SUSPECT`): some
/// watched page may be writable or replaced, or was since the last full check: check every
/// site (`overwritten`). The next bits count the calls in flight that change a watched page
/// (between their hook's start and end), the rest counts such calls. Set by the hooks of
/// everything that makes a page writable or replaces it (`watch_begin`/`watch_end`:
/// mprotect, pkey_mprotect, and each unmap hook's range), cleared only by `try_clean` when
/// nothing is in flight, every site is intact and every watched page is mapped, not
/// writable and still the page we patched (`pages_ok`): whatever writes one of our jumps
/// afterwards needs a call those hooks see first, or one the drain's re-check of the pages
/// (`drain_tick`) sees within a cycle.
pub(super) static WATCH: AtomicU64 = AtomicU64::new(SUSPECT);
pub(super) const SUSPECT: u64 = 1;
pub(super) const IN_FLIGHT: u64 = 2;
pub(super) const IN_FLIGHT_MASK: u64 = ((1 << 20) - 1) << 1;
pub(super) const EVENT: u64 = 1 << 21;

/// The pages the watch covers: libc's patched entries (and the endbr64 and padding around
/// them) and mrcache's watched hooks, as two spans of whole pages `[lo, hi)` (over-watching
/// only costs a full check until the next `try_clean`). Set in the constructor.
pub(super) static SPAN: [[AtomicUsize; 2]; 2] = [
    [AtomicUsize::new(usize::MAX), AtomicUsize::new(0)],
    [AtomicUsize::new(usize::MAX), AtomicUsize::new(0)],
];
pub(super) const LIBC_SPAN: usize = 0;
pub(super) const HOOK_SPAN: usize = 1;

pub(super) fn widen(span: usize, lo: usize, hi: usize) {
    SPAN[span][0].fetch_min(crate::sys::page_down(lo), Relaxed);
    SPAN[span][1].fetch_max(crate::sys::page_up(hi), Relaxed);
}

/// Whether `[start, start + len)` touches a watched page.
#[inline]
pub fn watched(start: usize, len: usize) -> bool {
    let end = start.saturating_add(len.max(1));
    SPAN.iter()
        .any(|s| start < s[1].load(Relaxed) && s[0].load(Relaxed) < end)
}

/// A hook is about to change the protection of `[start, start + len)`: if that touches a
/// watched page, every hit from now on checks every site, and no `try_clean` can succeed
/// until `watch_end`. Returns whether it did (for `watch_end`). Lock-free,
/// allocation-free: any hook may call it.
#[inline]
pub fn watch_begin(start: usize, len: usize) -> bool {
    if !watched(start, len) {
        return false;
    }
    let _ = WATCH.fetch_update(SeqCst, SeqCst, |w| {
        Some((w | SUSPECT).wrapping_add(IN_FLIGHT + EVENT))
    });
    true
}

/// The call `watch_begin` announced is done (its system call returned): still suspect.
#[inline]
pub fn watch_end(began: bool) {
    if began {
        let _ = WATCH.fetch_update(SeqCst, SeqCst, |w| {
            Some((w | SUSPECT).wrapping_sub(IN_FLIGHT).wrapping_add(EVENT))
        });
    }
}

/// Whether a hit may skip the site check: no watched page changed protection or mapping
/// since the last `try_clean`, which found every site intact and every page read-only.
#[inline]
pub fn watch_clean() -> bool {
    WATCH.load(SeqCst) & SUSPECT == 0
}

/// `MRCACHE_PATCH_CHECK=every-hit`: never clear (every hit reads every site).
pub static EVERY_HIT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether libc's own `mprotect` entry was patched (`MPROTECT`): without it a call through
/// libc's entry (glibc's internal `__mprotect`, `dlsym` on libc's handle) would make a
/// watched page writable unseen, so the word is never cleared.
pub static MPROTECT_PATCHED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// glibc's mprotect (2.36 and 2.41): `mov eax, 10; syscall; cmp rax, -4095; jae`.
#[cfg(target_arch = "x86_64")]
pub static MPROTECT: [Prologue; STUB_FORMS] = stub_past_mov(syscall_stub(0x0a));

/// glibc 2.41's arm64 mprotect: `bti c; mov x8, #226; svc #0; cmn x0, #0xfff; b.cs +8; ret`
/// (llvm-objdump of Debian 13's libc6:arm64 2.41-12; 2.36's is not recorded here, so on
/// Debian 12 the watch never clears and every hit reads every site).
#[cfg(target_arch = "aarch64")]
pub static MPROTECT: [Prologue; 1] = [Prologue {
    words: &[
        0xd503245f, 0xd2801c48, 0xd4000001, 0xb13ffc1f, 0x54000042, 0xd65f03c0,
    ],
    any: 0,
}];

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub static MPROTECT: [Prologue; 0] = [];

/// For tests and diagnostics: whether hits skip the site check now.
pub extern "C" fn mrcache_patch_watch_clean() -> std::ffi::c_int {
    watch_clean() as std::ffi::c_int
}
