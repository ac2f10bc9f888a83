//! Trampolines: a hook beyond the reach of the jump written at a site (`jmp rel32`, +-2 GiB,
//! on x86-64; `B`, +-128 MiB, on aarch64) is reached through a slot (`jmp [rip+0]` and the
//! 8-byte address; `ldr x16, #8; br x16` and the address) in a page mapped within reach. A
//! slot is written completely before the jump that leads to it exists, so no thread can see
//! it half written.

#[cfg(target_arch = "x86_64")]
use crate::monitor::cross_modify::jmp_rel32;
use crate::monitor::cross_modify::{make_writable, restore_executable};
use crate::sys::{page_down, page_size, syscall6};
use std::sync::atomic::{
    AtomicBool, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};

/// Trampoline pages: (base, slots used). A slot is 16 bytes: `jmp [rip+0]` and the hook
/// (x86-64), `ldr x16, #8; br x16` and the hook (aarch64).
const PAGES: usize = 4;
const SLOT: usize = 16;
static PAGE_BASE: [AtomicUsize; PAGES] = [const { AtomicUsize::new(0) }; PAGES];
static PAGE_USED: [AtomicUsize; PAGES] = [const { AtomicUsize::new(0) }; PAGES];
/// Held while a slot is taken (the constructor, and unit tests on several threads).
static TAKING: AtomicBool = AtomicBool::new(false);

/// Within `jmp rel32` reach of `site`, with a slot's length to spare.
#[cfg(target_arch = "x86_64")]
fn reaches(site: usize, to: usize) -> bool {
    jmp_rel32(site, to).is_some() && jmp_rel32(site, to + SLOT).is_some()
}

/// Within a `B`'s reach of `site` (+-128 MiB), with a slot's length to spare.
#[cfg(target_arch = "aarch64")]
fn reaches(site: usize, to: usize) -> bool {
    let b = |to| crate::monitor::patch::aarch64::b_to(site, to).is_some();
    b(to) && b(to + SLOT)
}

/// A trampoline slot's code: a jump to `hook` through its address, stored in the slot.
#[cfg(target_arch = "x86_64")]
fn slot_code(hook: usize) -> [u8; SLOT] {
    let mut code = [0xccu8; SLOT];
    code[..6].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
    code[6..14].copy_from_slice(&(hook as u64).to_le_bytes());
    code
}
#[cfg(target_arch = "x86_64")]
const SLOT_HOOK_AT: usize = 6;

#[cfg(target_arch = "aarch64")]
fn slot_code(hook: usize) -> [u8; SLOT] {
    let words = crate::monitor::patch::aarch64::trampoline(hook);
    std::array::from_fn(|k| words[k / 4].to_le_bytes()[k % 4])
}
#[cfg(target_arch = "aarch64")]
const SLOT_HOOK_AT: usize = 8;

/// The trampoline page whose next free slot our jump at `site` reaches, or an unmapped one
/// (base 0). The slot itself is checked, not the page's base: a page whose first slot is in
/// reach can have its later slots beyond it (on aarch64 a later slot out of +-128 MiB would
/// be written and jumped to by a `B` that cannot encode it).
#[cfg(test)]
fn page_for(site: usize, pages: &[(usize, usize)], slots_per_page: usize) -> Option<usize> {
    page_for_n(site, pages, slots_per_page, 1)
}

/// `page_for` with room for `n` consecutive slots.
fn page_for_n(
    site: usize,
    pages: &[(usize, usize)],
    slots_per_page: usize,
    n: usize,
) -> Option<usize> {
    pages.iter().position(|&(base, used)| {
        base == 0 || (used + n <= slots_per_page && reaches(site, base + used * SLOT))
    })
}

/// Trampolines that take back a kept instruction's effect first (`undo_then`): two slots
/// each, with no hook address where `trampoline_hook` looks.
const UNDOS: usize = 8;
static UNDO_AT: [AtomicUsize; UNDOS] = [const { AtomicUsize::new(0) }; UNDOS];

/// A trampoline that our jump at `site` reaches, which runs `undo` (at most 18 bytes: code
/// that takes back what the instructions kept before the jump did to the stack) and then
/// jumps to `hook` through its address (two slots).
#[cfg(target_arch = "x86_64")]
pub fn undo_then(site: usize, undo: &[u8], hook: usize) -> Option<usize> {
    let mut code = [0xccu8; 2 * SLOT];
    let n = undo.len();
    if n + 14 > code.len() {
        return None;
    }
    code[..n].copy_from_slice(undo);
    code[n..n + 6].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
    code[n + 6..n + 14].copy_from_slice(&(hook as u64).to_le_bytes());
    let slot = locked(|| take_slots(site, &code))?;
    UNDO_AT
        .iter()
        .find(|u| u.compare_exchange(0, slot, Relaxed, Relaxed).is_ok())?;
    Some(slot)
}

fn locked<T>(f: impl FnOnce() -> T) -> T {
    while TAKING
        .compare_exchange_weak(false, true, Acquire, Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
    let r = f();
    TAKING.store(false, Release);
    r
}

/// A trampoline to `hook` that our jump at `site` reaches (`jmp rel32` on x86-64, `B` on
/// aarch64), written and executable.
pub fn trampoline(site: usize, hook: usize) -> Option<usize> {
    locked(|| take_slots(site, &slot_code(hook)))
}

/// Consecutive slots within reach of `site`, holding `code` (whole slots).
fn take_slots(site: usize, code: &[u8]) -> Option<usize> {
    let n = code.len().div_ceil(SLOT);
    let pages: [(usize, usize); PAGES] =
        std::array::from_fn(|p| (PAGE_BASE[p].load(Relaxed), PAGE_USED[p].load(Relaxed)));
    let page = page_for_n(site, &pages, page_size() / SLOT, n)?;
    if PAGE_BASE[page].load(Relaxed) == 0 {
        PAGE_BASE[page].store(map_near(site)?, Relaxed);
    }
    let base = PAGE_BASE[page].load(Relaxed);
    let slot = base + PAGE_USED[page].load(Relaxed) * SLOT;
    // Other slots of the page may be running: it stays executable while written.
    make_writable(base, page_size()).ok()?;
    // SAFETY: a slot of our own page, writable now, that no jump leads to yet.
    unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), slot as *mut u8, code.len()) };
    // Fetched by other cores only after the `B` that leads here is stored and synchronised.
    #[cfg(target_arch = "aarch64")]
    crate::monitor::patch::aarch64::sync_icache(slot, code.len());
    // Refused: the page stays writable (said in one line); the slot is not used, and the
    // site is refused (`Far`), which fails that path closed.
    restore_executable(base, page_size()).ok()?;
    PAGE_USED[page].fetch_add(n, Relaxed);
    Some(slot)
}

/// The hook that `at`, if one of our trampolines, leads to (None for one that runs code
/// of its own first, `undo_then`).
pub fn trampoline_hook(at: usize) -> Option<usize> {
    let undo = |a: usize| UNDO_AT.iter().any(|u| u.load(Relaxed) == a);
    if undo(at) || undo(at.wrapping_sub(SLOT)) {
        return None;
    }
    (0..PAGES).find_map(|p| {
        let base = PAGE_BASE[p].load(Relaxed);
        let used = PAGE_USED[p].load(Relaxed);
        (base != 0 && at >= base && at < base + used * SLOT && (at - base) % SLOT == 0).then(|| {
            // SAFETY: a written slot of our own trampoline page: its address field.
            unsafe { std::ptr::read_volatile((at + SLOT_HOOK_AT) as *const u64) as usize }
        })
    })
}

/// A fresh page within reach of `site`: tried at hints a step apart on either side (16 MiB
/// on x86-64, 2 MiB on aarch64)
/// (MAP_FIXED_NOREPLACE; an older kernel takes it as a hint, checked).
fn map_near(site: usize) -> Option<usize> {
    // 60 hints on either side: up to 960 MiB away on x86-64, 120 MiB (of 128) on aarch64.
    #[cfg(target_arch = "x86_64")]
    const STEP: usize = 16 << 20;
    #[cfg(not(target_arch = "x86_64"))]
    const STEP: usize = 2 << 20;
    for k in 1..=120usize {
        let off = k.div_ceil(2) * STEP;
        let hint = if k % 2 == 1 {
            page_down(site).checked_sub(off)
        } else {
            page_down(site).checked_add(off)
        };
        let Some(hint) = hint.filter(|&h| h >= 1 << 20) else {
            continue;
        };
        let p = syscall6(
            libc::SYS_mmap,
            hint,
            page_size(),
            (libc::PROT_READ | libc::PROT_WRITE) as usize,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as usize,
            usize::MAX, // fd -1
            0,
        );
        if p < 0 {
            continue;
        }
        let p = p as usize;
        if reaches(site, p) {
            return Some(p);
        }
        syscall6(libc::SYS_munmap, p, page_size(), 0, 0, 0, 0);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page whose first slot is in reach but whose next free slot is not (placed by
    /// searching for the first unreachable address, so the test holds for both jumps'
    /// reaches) is passed over for the next page.
    #[test]
    fn a_page_is_taken_only_if_its_next_free_slot_is_in_reach() {
        let site = 0x40_0000_0000usize;
        let (mut near, mut far) = (0usize, 1usize << 40);
        while far - near > 1 {
            let mid = near + (far - near) / 2;
            if reaches(site, site + mid) {
                near = mid
            } else {
                far = mid
            }
        }
        let base = site + near - 3 * SLOT;
        assert!(reaches(site, base) && !reaches(site, base + 4 * SLOT));
        let (pages, slots) = ([(base, 4), (0, 0)], page_size() / SLOT);
        assert_eq!(
            page_for(site, &pages, slots),
            Some(1),
            "slot 4 of page {base:#x} is beyond reach of {site:#x}: the next page must be taken"
        );
        assert_eq!(page_for(site, &[(base, 3), (0, 0)], slots), Some(0));
        assert_eq!(
            page_for(site, &[(base, 0), (0, 0)], 0),
            Some(1),
            "a full page is skipped"
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_trampoline_is_within_reach_and_leads_to_its_hook() {
        let site = a_trampoline_is_within_reach_and_leads_to_its_hook as *const () as usize;
        let t = trampoline(site, 0x1122_3344_5566_7788).expect("a trampoline page");
        assert!(jmp_rel32(site, t).is_some());
        // SAFETY: our own trampoline slot, readable.
        let code = unsafe { std::slice::from_raw_parts(t as *const u8, 14) };
        assert_eq!(&code[..6], &[0xff, 0x25, 0, 0, 0, 0]);
        assert_eq!(&code[6..], &0x1122_3344_5566_7788u64.to_le_bytes());
    }
}
