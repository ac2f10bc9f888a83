//! Our jumps in libc's entries: where each was written and what it holds now (another
//! patcher's jump decoded, ours taken back and chained), writing the jump (`patch_at`,
//! `install`) and the check that every one is intact. Our own exported hooks' first bytes
//! are watched in `own_hooks`.

#[cfg(target_arch = "aarch64")]
use super::sites_aarch64::site_intact;
use super::*;
#[cfg(target_arch = "x86_64")]
use crate::monitor::cross_modify::{self, JMP_LEN};
use std::ffi::{CStr, c_void};
#[cfg(target_arch = "x86_64")]
use std::sync::atomic::Ordering::Release;
use std::sync::atomic::{
    AtomicU8, AtomicUsize,
    Ordering::{Acquire, Relaxed},
};

/// What libc's entry of `name` holds, for a memory hook deciding where to forward.
pub enum Site {
    /// Our jump, which replaced the other patcher's hook at this address: call that hook.
    Chained(usize),
    /// Our own jump: calling the entry would come back to us.
    Ours,
    /// Never patched by us, or overwritten since: the entry is libc's (or another's).
    Other,
}

/// Each target's site (its index + 1; 0: not patched), set by `install`: a memory hook
/// finds its site with one load, not a search by name (this runs on every unmap).
pub(super) static TARGET_SITE: [AtomicUsize; PatchTarget::ALL.len()] =
    [const { AtomicUsize::new(0) }; PatchTarget::ALL.len()];

/// The site `install` patched for `target`, with its address.
pub(super) fn site_of(target: PatchTarget) -> Option<(usize, usize)> {
    let i = TARGET_SITE[target as usize].load(Relaxed).checked_sub(1)?;
    Some((i, SITE_AT[i].load(Relaxed)))
}

/// What libc's entry of `target` holds now.
pub fn site(target: PatchTarget) -> Site {
    let Some((i, at)) = site_of(target) else {
        return Site::Other;
    };
    let chained = SITE_CHAINED[i].load(Acquire);
    if chained != 0 {
        Site::Chained(chained)
    } else if site_intact(i, at) {
        Site::Ours
    } else {
        Site::Other
    }
}

#[cfg(target_arch = "x86_64")]
/// Another patcher wrote its jump over one of ours (it installed after our constructor):
/// put ours back and chain to its hook, so both see every call from here on. Only safe
/// before anything is cached (what went through its hook alone in between is not known):
/// the runtime calls it once, before the self-test and the cache. Threads may be running
/// through the other patcher's jump meanwhile: ours replaces its first instruction only
/// (`cross_modify`). Returns false when an overwrite is not a jump we know, or could not be
/// replaced safely: the site then stays "overwritten", and `overwritten()` fails closed.
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
        // Another patcher's jump at the entry: over our jump, or over the instructions we
        // kept before it. A patcher that overwrote a kept endbr64 is not handled.
        let entry = at - SITE_KEEP[i].load(Relaxed);
        let mut have = [0u8; MATCH_LEN];
        for (k, b) in have.iter_mut().enumerate() {
            // SAFETY: patched libc code, never unmapped; volatile: another thread writes.
            *b = unsafe { std::ptr::read_volatile((entry as *const u8).add(k)) };
        }
        let hook = SITE_HOOK[i].load(Relaxed);
        let ours = if entry == at {
            let w = SITE_CODE[i].load(Relaxed).to_le_bytes();
            Ok(std::array::from_fn(|k| w[k]))
        } else {
            jump_to(entry, hook)
        };
        match (foreign_target(entry, &have), foreign_first_len(&have), ours) {
            (Some(t), Some(len), Ok(ours))
                if SITE_ENDBR[i].load(Relaxed) == 0
                    && t != hook
                    && crate::monitor::trampoline::trampoline_hook(t) != Some(hook) =>
            {
                crate::sys::symbol::pin_object_of(t);
                SITE_CHAINED[i].store(t, Release);
                let old = std::array::from_fn(|k| have[k]);
                let began = watch_begin(entry, at + JMP_LEN - entry);
                // SAFETY: our own patch site in libc's code; the other patcher's first
                // instruction is replaced by our jump, whose hook now calls its target.
                let done =
                    unsafe { cross_modify::replace_entry(entry as *mut u8, old, ours, len, None) }
                        .is_ok();
                watch_end(began);
                all &= done;
                if done && entry != at {
                    let mut word = [0u8; 8];
                    word[..JMP_LEN].copy_from_slice(&ours);
                    SITE_ADOPTED[i].store(u64::from_le_bytes(word), Relaxed);
                }
            }
            _ => all = false,
        }
    }
    all
}
/// Nothing is ever patched on other architectures: nothing to take back.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn adopt_overwritten() -> bool {
    true
}

/// For `dlsym`: libc's entry of `name` in place of `found` when `found` is our own exported
/// hook of that name and libc's entry still leads to it (our jump, or our jump chained to
/// another patcher's hook). Calling either reaches our hook; but a patcher that writes its
/// jump over the function `dlsym` gave it (UCX's bistro) then writes over libc's entry,
/// which we take back and chain to, and not over our hook, where nothing of ours would run.
pub fn libc_entry_instead(target: PatchTarget, found: usize) -> Option<usize> {
    let named = |slot: &AtomicUsize| {
        // SAFETY: the name slots hold pointers of `&'static CStr`s stored with them.
        (unsafe { CStr::from_ptr(slot.load(Relaxed) as *const _) }) == target.name()
    };
    (0..HOOKS)
        .take_while(|&i| HOOK_AT[i].load(Relaxed) != 0)
        .find(|&i| HOOK_AT[i].load(Relaxed) == found && named(&HOOK_NAME[i]))?;
    let (i, at) = site_of(target)?;
    (SITE_CHAINED[i].load(Acquire) != 0 || site_intact(i, at))
        .then(|| at - SITE_ENDBR[i].load(Relaxed) - SITE_KEEP[i].load(Relaxed))
}

/// Why each target of `install` was not patched (a `PatchError` code, 0 = patched).
pub(super) static REFUSED: [AtomicU8; SITES] = [const { AtomicU8::new(0) }; SITES];

/// Overwrite libc's `target.name` with a jump to `target.hook`.
pub fn patch(libc_handle: *mut c_void, target: &Target) -> Result<(), PatchError> {
    let f = crate::sys::symbol::address(libc_handle, target.name) as *mut u8;
    if f.is_null() {
        return Err(PatchError::NotFound);
    }
    // SAFETY: f is the start of a libc function; every function we look for is longer
    // than the bytes read (a stub plus its error path), and code pages are readable.
    unsafe { patch_at(f, target) }
}

/// Overwrite the function at `f` (named `target.name`) with a jump to `target.hook`, if it
/// starts with one of `target.prologues`.
///
/// # Safety
/// `f` points at the entry of a function at least 18 bytes long that is never executed past
/// its first instruction afterwards (the hook replaces it). Other threads may run it.
#[cfg(target_arch = "x86_64")]
pub unsafe fn patch_at(f: *mut u8, target: &Target) -> Result<(), PatchError> {
    let mut head = [0u8; ENDBR64.len() + MATCH_LEN];
    // SAFETY: the caller guarantees f has at least that many readable bytes.
    unsafe { std::ptr::copy_nonoverlapping(f, head.as_mut_ptr(), head.len()) };
    unbreak(target.prologues, &mut head);
    // An entry another patcher already took (its constructor ran first): take it over
    // and chain to its hook.
    let foreign = match site_offset(target.prologues, &head) {
        Some(_) => None,
        None => match foreign_target(f as usize, &head) {
            Some(t)
                if t != target.hook
                    && crate::monitor::trampoline::trampoline_hook(t) != Some(target.hook) =>
            {
                Some(t)
            }
            _ => return Err(PatchError::Unexpected),
        },
    };
    if let Some(t) = foreign {
        crate::sys::symbol::pin_object_of(t);
    }
    let (skip, keep, first, pad, undo) = match usable_start(target.prologues, &head, f as usize) {
        Some((skip, p)) => (
            skip,
            p.keep as usize,
            p.replaced as usize,
            (p.pad, pad_end(p, f as usize, skip)),
            p.undo,
        ),
        // Known bytes, but not the padding a short replaced instruction needs.
        None if foreign.is_none() => return Err(PatchError::Busy),
        None => (
            0,
            0,
            foreign_first_len(&head).ok_or(PatchError::Unexpected)?,
            (&[][..], f as usize),
            &[][..],
        ),
    };
    // SAFETY: inside the function (checked above).
    let site = unsafe { f.add(skip + keep) };
    let old: [u8; JMP_LEN] = std::array::from_fn(|k| head[skip + keep + k]);
    let hook = if undo.is_empty() {
        target.hook
    } else {
        crate::monitor::trampoline::undo_then(site as usize, undo, target.hook)
            .ok_or(PatchError::Far)?
    };
    let (code, pad_jump) = if first >= JMP_LEN {
        (jump_to(site as usize, hook)?, None)
    } else {
        // A `jmp rel8` over the short replaced instruction, to a `jmp rel32` in the padding.
        let (pad, end) = pad;
        let at = end.wrapping_sub(JMP_LEN);
        if pad.len() < JMP_LEN || !padding_ends_at(end, pad) {
            return Err(PatchError::Busy);
        }
        let short = cross_modify::jmp_rel8(site as usize, at).ok_or(PatchError::Busy)?;
        let mut code = old;
        code[..2].copy_from_slice(&short);
        (code, Some((at, jump_to(at, hook)?)))
    };
    // Watched from before the write (a `try_clean` racing it must fail).
    let lo = (f as usize).saturating_sub(JMP_LEN);
    let hi = pad_jump.map_or(site as usize, |(at, _)| at.max(site as usize)) + JMP_LEN;
    widen(LIBC_SPAN, lo, hi);
    let began = watch_begin(lo, hi - lo);
    // SAFETY: the function's instruction at `site` is `first` bytes long (only its bytes
    // change); the jump leads to its hook (after `undo`), which replaces the rest of the
    // function; the padding before or after the function is dead code.
    let written = unsafe { cross_modify::replace_entry(site, old, code, first, pad_jump) };
    watch_end(began);
    if let Err(e) = written
        && !e.written()
    {
        return Err(e);
    }
    let mut word = [0u8; 8];
    word[..JMP_LEN].copy_from_slice(&code);
    for i in 0..SITES {
        if SITE_AT[i]
            .compare_exchange(0, site as usize, Relaxed, Relaxed)
            .is_ok()
        {
            SITE_HOOK[i].store(target.hook, Relaxed);
            SITE_CODE[i].store(u64::from_le_bytes(word), Relaxed);
            SITE_NAME[i].store(target.name.as_ptr() as usize, Relaxed);
            SITE_ENDBR[i].store(skip, Relaxed);
            record_kept(i, &head[..skip + keep], foreign.is_none());
            SITE_CHAINED[i].store(foreign.unwrap_or(0), Release);
            break;
        }
    }
    written
}

/// Site `i`'s kept bytes, from the entry on, as the function has them (an `int3` already
/// there taken back: `unbreak`); `own`: the function's own code (not another patcher's jump).
#[cfg(target_arch = "x86_64")]
fn record_kept(i: usize, kept: &[u8], own: bool) {
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    let len = kept.len();
    SITE_KEEP[i].store(len - SITE_ENDBR[i].load(Relaxed), Relaxed);
    SITE_KEPT[i][0].store(word(&kept[..len.min(8)]), Relaxed);
    SITE_KEPT[i][1].store(if len > 8 { word(&kept[len - 8..]) } else { 0 }, Relaxed);
    SITE_BREAK_OK[i].store(own, Relaxed);
}

/// A breakpoint already at the entry when we patch (a uprobe attached system-wide before
/// this process started, a debugger's): an `int3` over the first byte of an `endbr64`, or of
/// a first instruction that one of `prologues` keeps (we never write there, and whoever put
/// the `int3` runs the file's instruction and writes its byte back), is read as the byte
/// that prologue has there. Any other `int3` stays, and the start is not recognised.
#[cfg(target_arch = "x86_64")]
fn unbreak(prologues: &[Prologue], head: &mut [u8; ENDBR64.len() + MATCH_LEN]) {
    if head[0] == 0xcc && head[1..4] == ENDBR64[1..] {
        head[0] = ENDBR64[0];
    }
    let skip = if head[..4] == ENDBR64 { 4 } else { 0 };
    if head[skip] != 0xcc {
        return;
    }
    for p in prologues.iter().filter(|p| p.keep > 0) {
        let mut code = [0u8; MATCH_LEN];
        code.copy_from_slice(&head[skip..skip + MATCH_LEN]);
        code[0] = p.bytes[0];
        if matches(p, &code) {
            head[skip] = p.bytes[0];
            return;
        }
    }
}

/// A mask of the low `n` bytes of a word.
#[cfg(target_arch = "x86_64")]
fn low_bytes(n: usize) -> u64 {
    if n >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * n)) - 1
    }
}

/// Whether the bytes kept before site `i`'s jump at `at` are as recorded, but for an `int3`
/// over the first byte of a kept instruction of the function's own (`SITE_BREAK_OK`): a
/// breakpoint, which runs that instruction elsewhere and resumes on our jump.
#[cfg(target_arch = "x86_64")]
fn kept_intact(i: usize, at: usize) -> bool {
    let endbr = SITE_ENDBR[i].load(Relaxed);
    let len = endbr + SITE_KEEP[i].load(Relaxed);
    if len == 0 {
        return true;
    }
    let entry = at - len;
    let want = SITE_KEPT[i][0].load(Relaxed);
    let mut have = load8(entry) & low_bytes(len);
    if have != want && SITE_BREAK_OK[i].load(Relaxed) {
        // The instructions kept start at the entry and after an endbr64.
        for start in [0, endbr] {
            let shift = 8 * start as u32;
            if start < len.min(8) && (have >> shift) & 0xff == 0xcc {
                have = have & !(0xff << shift) | want & (0xff << shift);
            }
        }
    }
    have == want && (len <= 8 || load8(entry + len - 8) == SITE_KEPT[i][1].load(Relaxed))
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub unsafe fn patch_at(_f: *mut u8, _target: &Target) -> Result<(), PatchError> {
    Err(PatchError::Unexpected)
}

/// Patch each of `targets` (`PatchTarget::ALL`'s, in its order); returns the bitmask of
/// those patched. Constructor.
pub fn install(libc_handle: *mut c_void, targets: &[Target]) -> usize {
    let mut done = 0;
    for (i, t) in targets.iter().enumerate().take(TARGET_SITE.len()) {
        let r = patch(libc_handle, t);
        if r.is_ok() || r.is_err_and(PatchError::written) {
            done |= 1 << i;
            // The site patch_at just filled is the last one in use.
            let used = (0..SITES)
                .take_while(|&s| SITE_AT[s].load(Relaxed) != 0)
                .count();
            TARGET_SITE[i].store(used, Relaxed);
        }
        if let Err(e) = r {
            REFUSED[i].store(e as u8, Relaxed);
        }
    }
    done
}

/// Why the patch of each target that is in place is not to be trusted (its jump written,
/// then the barrier or the restoring `mprotect` failed), and the code left writable, if
/// any: one clause each for the line that turns caching off (empty: none).
pub fn hazards() -> Vec<String> {
    let mut why = Vec::new();
    let written: Vec<(&str, PatchError)> = PatchTarget::ALL
        .iter()
        .filter_map(|&t| Some((t.name().to_str().ok()?, refused(t as usize)?)))
        .filter(|r| r.1.written())
        .collect();
    for e in [PatchError::Unsynced, PatchError::Writable] {
        let names: Vec<&str> = written.iter().filter(|r| r.1 == e).map(|r| r.0).collect();
        if !names.is_empty() {
            why.push(format!(
                "libc's {} patched, but {}",
                names.join(", "),
                e.why()
            ));
        }
    }
    if let Some(at) = crate::monitor::cross_modify::left_writable()
        && !written.iter().any(|r| r.1 == PatchError::Writable)
    {
        why.push(format!(
            "code at {at:#x} stays writable and executable (mprotect(PROT_READ|PROT_EXEC) after a patch was refused)"
        ));
    }
    why
}

/// Why target `i` of `install` was not patched (None: patched, or never tried).
pub fn refused(i: usize) -> Option<PatchError> {
    PatchError::from_code(REFUSED.get(i)?.load(Relaxed))
}

/// Eight bytes of code at `at` (any alignment), read as another thread may be writing
/// them: one plain load the compiler can neither merge nor drop (this runs on every
/// registration, hits included; byte-wise volatile reads cost ten times as much).
#[cfg(target_arch = "x86_64")]
pub(super) fn load8(at: usize) -> u64 {
    let word: u64;
    // SAFETY: `at..at + 8` is code we patched in libc (or the endbr64 kept before it and
    // our jump after it), which a patcher may change but never unmaps; a load, nothing else.
    unsafe {
        std::arch::asm!(
            "mov {word}, qword ptr [{at}]",
            word = out(reg) word,
            at = in(reg) at,
            options(nostack, preserves_flags, readonly),
        )
    };
    word
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(super) fn load8(at: usize) -> u64 {
    // Nothing is patched here (`patch_at` refuses); read byte by byte all the same.
    let mut b = [0u8; 8];
    for (k, x) in b.iter_mut().enumerate() {
        // SAFETY: as above.
        *x = unsafe { std::ptr::read_volatile((at as *const u8).add(k)) };
    }
    u64::from_le_bytes(b)
}

/// Whether site `i` (patched at `at`) still holds our jump, and the bytes kept before it
/// (`kept_intact`). Two or three loads: the jump (with the three bytes after it, masked
/// off) and the kept bytes.
#[cfg(target_arch = "x86_64")]
pub(super) fn site_intact(i: usize, at: usize) -> bool {
    const MASK: u64 = (1 << (8 * JMP_LEN)) - 1;
    let adopted = SITE_ADOPTED[i].load(Relaxed);
    (load8(at) & MASK == SITE_CODE[i].load(Relaxed) && kept_intact(i, at))
        || (adopted != 0 && load8(at - SITE_KEEP[i].load(Relaxed)) & MASK == adopted)
}

/// Nothing is patched on other architectures: whether the recorded word is there.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(super) fn site_intact(i: usize, at: usize) -> bool {
    load8(at) & 0xffff_ffff == SITE_CODE[i].load(Relaxed)
}

/// Whether any jump was written into libc (or a hook taken over): a fork child of a patch
/// in progress knows from it whether its libc is still as libc was.
pub fn any_site_written() -> bool {
    SITE_AT[0].load(Relaxed) != 0
}

/// The first of our jumps that is no longer in place (another patcher wrote over it), by
/// function name. A few byte compares per patched function: cheap enough for every
/// registration. No allocation, no lock.
pub fn overwritten() -> Option<&'static CStr> {
    for i in 0..SITES {
        let at = SITE_AT[i].load(Relaxed);
        if at == 0 {
            break;
        }
        if !site_intact(i, at) {
            // SAFETY: SITE_NAME holds the pointer of a `&'static CStr` stored with it.
            return Some(unsafe { CStr::from_ptr(SITE_NAME[i].load(Relaxed) as *const _) });
        }
    }
    for i in 0..HOOKS {
        let at = HOOK_AT[i].load(Relaxed);
        if at == 0 {
            break;
        }
        if read16(at)
            != [
                HOOK_BYTES[i][0].load(Relaxed),
                HOOK_BYTES[i][1].load(Relaxed),
            ]
        {
            // SAFETY: a &'static CStr stored with it.
            return Some(unsafe { CStr::from_ptr(HOOK_NAME[i].load(Relaxed) as *const _) });
        }
    }
    None
}
