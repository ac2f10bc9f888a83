//! aarch64: writing our `B` over libc's entries (`patch_at`: over a stub's `svc`, the words
//! before it kept), reading a site back (`load8`, `site_intact`), and taking back an entry
//! another patcher overwrote (`adopt_overwritten`); the rest of `sites` is shared with x86-64.

use super::*;
use crate::monitor::cross_modify::{self, test_break};
use std::sync::atomic::Ordering::{Relaxed, Release};

/// How many words of a function start are read (the longest prologue, and UCX's
/// `movz; movk; movk; movk; br` jump is five).
const WORDS: usize = 6;

fn read_words(at: usize) -> [u32; WORDS] {
    // SAFETY: the caller's function start: every function we look at is longer than six
    // instructions (a stub and its error path), and code pages are readable.
    std::array::from_fn(|k| unsafe { std::ptr::read_volatile((at as *const u32).add(k)) })
}

/// Our `B` at `site` to `hook`: direct when the hook is within +-128 MiB, else to a
/// trampoline slot mapped near `site`.
fn branch_to(site: usize, hook: usize) -> Result<u32, PatchError> {
    if let Some(b) = aarch64::b_to(site, hook) {
        return Ok(b);
    }
    let t = crate::monitor::trampoline::trampoline(site, hook).ok_or(PatchError::Far)?;
    aarch64::b_to(site, t).ok_or(PatchError::Far)
}

/// Whether the jump another patcher left at an entry leads somewhere other than `hook`
/// (directly, or through one of our trampolines).
fn not_ours(t: usize, hook: usize) -> bool {
    t != hook && crate::monitor::trampoline::trampoline_hook(t) != Some(hook)
}

/// The function's words at `code`, with a `BRK` already over a word one of `prologues`
/// keeps (a uprobe attached before this process started, a debugger's breakpoint: whoever
/// put it there runs the file's word and writes it back) read as that prologue's word; and
/// the prologue they match.
fn unbreak(
    prologues: &'static [aarch64::Prologue],
    code: [u32; WORDS],
) -> ([u32; WORDS], Option<&'static aarch64::Prologue>) {
    for p in prologues {
        let mut c = code;
        for (k, w) in c.iter_mut().enumerate().take(p.keep()) {
            if aarch64::is_brk(*w) {
                *w = p.words[k];
            }
        }
        if aarch64::matches(p, &c) {
            return (c, Some(p));
        }
    }
    (code, None)
}

/// Overwrite the function at `f` (named `target.name`) with a `B` to `target.hook`, if it
/// starts with one of `target.prologues` (or another patcher's jump we know: chained): over
/// the `svc #0` of a system call stub, the words before it kept (`Prologue::keep`), else
/// over its first word.
///
/// # Safety
/// `f` points at the entry of a function at least six instructions long that is never
/// executed past the replaced word afterwards (the hook replaces the rest). Other threads
/// may run it.
pub unsafe fn patch_at(f: *mut u8, target: &Target) -> Result<(), PatchError> {
    let entry = f as usize;
    if entry % 4 != 0 {
        return Err(PatchError::Unexpected);
    }
    let (code, known) = unbreak(target.prologues, read_words(entry));
    let keep = known.map_or(0, |p| p.keep());
    let known = test_break::mode() == test_break::ANY_PROLOGUE || known.is_some();
    let foreign = if known {
        None
    } else {
        match aarch64::foreign_target(entry, &code) {
            Some(t) if not_ours(t, target.hook) => Some(t),
            _ => return Err(PatchError::Unexpected),
        }
    };
    if let Some(t) = foreign {
        crate::sys::symbol::pin_object_of(t);
    }
    let site = entry + 4 * keep;
    let b = branch_to(site, target.hook)?;
    // Watched from before the write (a `try_clean` racing it must fail).
    widen(LIBC_SPAN, entry, site + 4);
    let began = watch_begin(entry, site + 4 - entry);
    // SAFETY: a word of a function we recognised (the only one that changes); the `B`
    // leads to its hook, which replaces the rest of the function.
    let written = unsafe { cross_modify::replace_word(site as *mut u32, code[keep], b) };
    watch_end(began);
    if let Err(e) = written
        && !e.written()
    {
        return Err(e);
    }
    for i in 0..SITES {
        if SITE_AT[i]
            .compare_exchange(0, site, Relaxed, Relaxed)
            .is_ok()
        {
            SITE_HOOK[i].store(target.hook, Relaxed);
            SITE_CODE[i].store(b as u64, Relaxed);
            SITE_NAME[i].store(target.name.as_ptr() as usize, Relaxed);
            SITE_ENDBR[i].store(0, Relaxed);
            SITE_KEEP[i].store(4 * keep, Relaxed);
            // The kept words as the function has them (a `BRK` already there taken back).
            let kept = |k: usize| if k < keep { code[k] as u64 } else { 0 };
            SITE_KEPT[i][0].store(kept(0) | kept(1) << 32, Relaxed);
            SITE_KEPT[i][1].store(kept(2) | kept(3) << 32, Relaxed);
            SITE_BREAK_OK[i].store(foreign.is_none(), Relaxed);
            SITE_CHAINED[i].store(foreign.unwrap_or(0), Release);
            break;
        }
    }
    written
}

/// Four bytes of code at `at` (4-aligned: a site) in the low half, as another thread may be
/// writing them: one single-copy-atomic load the compiler can neither merge nor drop.
pub(super) fn load8(at: usize) -> u64 {
    // SAFETY: a site we patched in libc (or a test's page), which a patcher may change but
    // never unmaps; a volatile aligned word load.
    (unsafe { std::ptr::read_volatile(at as *const u32) }) as u64
}

/// Whether site `i` (patched at `at`) still holds our `B`, and the words kept before it,
/// but for a `BRK` over a kept word of the function's own (`SITE_BREAK_OK`: a uprobe or a
/// breakpoint, which runs that word elsewhere and resumes after it); or our `B` at the
/// entry, where another patcher's jump there was taken back (`SITE_ADOPTED`).
pub(super) fn site_intact(i: usize, at: usize) -> bool {
    let keep = SITE_KEEP[i].load(Relaxed);
    let adopted = SITE_ADOPTED[i].load(Relaxed);
    (load8(at) == SITE_CODE[i].load(Relaxed) && kept_intact(i, at - keep, keep / 4))
        || (adopted != 0 && load8(at - keep) == adopted)
}

/// Whether the `n` words kept at `entry` for site `i` are as recorded (a `BRK` over one of
/// the function's own words counts as it).
fn kept_intact(i: usize, entry: usize, n: usize) -> bool {
    (0..n).all(|k| {
        let want = (SITE_KEPT[i][k / 2].load(Relaxed) >> (32 * (k % 2))) as u32;
        let have = load8(entry + 4 * k) as u32;
        have == want || (aarch64::is_brk(have) && SITE_BREAK_OK[i].load(Relaxed))
    })
}

/// Another patcher wrote its jump over one of ours (it installed after our constructor), at
/// the entry (over the words we kept, and our `B` if it is long enough): put ours back at
/// the entry and chain to its hook, as on x86-64 (`sites::adopt_overwritten`). Its first
/// word is seldom one the architecture lets us replace under execution (a `movz` or `ldr`):
/// `replace_word` then refuses unless the process has one thread, and the site stays
/// "overwritten" (fail closed).
pub fn adopt_overwritten() -> bool {
    let mut all = true;
    for i in 0..SITES {
        let at = SITE_AT[i].load(Relaxed);
        if at == 0 {
            break;
        }
        if site_intact(i, at) {
            continue;
        }
        let entry = at - SITE_KEEP[i].load(Relaxed);
        let have = read_words(entry);
        let hook = SITE_HOOK[i].load(Relaxed);
        let ours = if entry == at {
            Ok(SITE_CODE[i].load(Relaxed) as u32)
        } else {
            branch_to(entry, hook)
        };
        match (aarch64::foreign_target(entry, &have), ours) {
            (Some(t), Ok(ours)) if not_ours(t, hook) => {
                crate::sys::symbol::pin_object_of(t);
                SITE_CHAINED[i].store(t, Release);
                let began = watch_begin(entry, at + 4 - entry);
                // SAFETY: our own patch site in libc's code; the other patcher's first
                // instruction is replaced by our `B`, whose hook now calls its target.
                let r = unsafe { cross_modify::replace_word(entry as *mut u32, have[0], ours) };
                watch_end(began);
                // Our `B` in place (the failure came after the write): the chain stays.
                if r.is_err_and(|e| !e.written()) {
                    SITE_CHAINED[i].store(0, Release);
                } else if entry != at {
                    SITE_ADOPTED[i].store(ours as u64, Relaxed);
                }
                all &= r.is_ok();
            }
            _ => all = false,
        }
    }
    all
}
