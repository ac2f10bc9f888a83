//! aarch64: writing our `B` over libc's entries (`patch_at`), reading a site back (`load8`),
//! and taking back an entry another patcher overwrote (`adopt_overwritten`); the rest of
//! `sites` is shared with x86-64.

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

/// Overwrite the function at `f` (named `target.name`) with a `B` to `target.hook`, if it
/// starts with one of `target.prologues` (or another patcher's jump we know: chained).
///
/// # Safety
/// `f` points at the entry of a function at least six instructions long that is never
/// executed past its first instruction afterwards (the hook replaces it). Other threads may
/// run it.
pub unsafe fn patch_at(f: *mut u8, target: &Target) -> Result<(), PatchError> {
    let site = f as usize;
    if site % 4 != 0 {
        return Err(PatchError::Unexpected);
    }
    let code = read_words(site);
    let known = test_break::mode() == test_break::ANY_PROLOGUE
        || target.prologues.iter().any(|p| aarch64::matches(p, &code));
    let foreign = if known {
        None
    } else {
        match aarch64::foreign_target(site, &code) {
            Some(t) if not_ours(t, target.hook) => Some(t),
            _ => return Err(PatchError::Unexpected),
        }
    };
    if let Some(t) = foreign {
        crate::monitor::dl::pin_object_of(t);
    }
    let b = branch_to(site, target.hook)?;
    // Watched from before the write (a `try_clean` racing it must fail).
    widen(LIBC_SPAN, site, site + 4);
    let began = watch_begin(site, 4);
    // SAFETY: the entry of a function we recognised (its first word is the only one that
    // changes); the `B` leads to its hook, which replaces it.
    let written = unsafe { cross_modify::replace_word(f as *mut u32, code[0], b) };
    watch_end(began);
    written?;
    for i in 0..SITES {
        if SITE_AT[i]
            .compare_exchange(0, site, Relaxed, Relaxed)
            .is_ok()
        {
            SITE_HOOK[i].store(target.hook, Relaxed);
            SITE_CODE[i].store(b as u64, Relaxed);
            SITE_NAME[i].store(target.name.as_ptr() as usize, Relaxed);
            SITE_ENDBR[i].store(0, Relaxed);
            SITE_CHAINED[i].store(foreign.unwrap_or(0), Release);
            break;
        }
    }
    Ok(())
}

/// Four bytes of code at `at` (4-aligned: a site) in the low half, as another thread may be
/// writing them: one single-copy-atomic load the compiler can neither merge nor drop.
pub(super) fn load8(at: usize) -> u64 {
    // SAFETY: a site we patched in libc (or a test's page), which a patcher may change but
    // never unmaps; a volatile aligned word load.
    (unsafe { std::ptr::read_volatile(at as *const u32) }) as u64
}

/// Another patcher wrote its jump over one of ours (it installed after our constructor):
/// put ours back and chain to its hook, as on x86-64 (`sites::adopt_overwritten`). Its
/// first word is seldom one the architecture lets us replace under execution (a `movz` or
/// `ldr`): `replace_word` then refuses unless the process has one thread, and the site
/// stays "overwritten" (fail closed).
pub fn adopt_overwritten() -> bool {
    let mut all = true;
    for i in 0..SITES {
        let at = SITE_AT[i].load(Relaxed);
        if at == 0 {
            break;
        }
        let ours = SITE_CODE[i].load(Relaxed) as u32;
        let have = read_words(at);
        if have[0] == ours {
            continue;
        }
        match aarch64::foreign_target(at, &have) {
            Some(t) if not_ours(t, SITE_HOOK[i].load(Relaxed)) => {
                crate::monitor::dl::pin_object_of(t);
                SITE_CHAINED[i].store(t, Release);
                let began = watch_begin(at, 4);
                // SAFETY: our own patch site in libc's code; the other patcher's first
                // instruction is replaced by our `B`, whose hook now calls its target.
                let r = unsafe { cross_modify::replace_word(at as *mut u32, have[0], ours) };
                watch_end(began);
                if r.is_err() {
                    SITE_CHAINED[i].store(0, Release);
                    all = false;
                }
            }
            _ => all = false,
        }
    }
    all
}
