//! Tests of `patch`: patching code pages of our own, decoding other patchers' jumps.

use super::*;
use crate::monitor::cross_modify::{self, JMP_LEN};
use std::ffi::{c_int, c_void};
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

pub(super) static CALLS: AtomicUsize = AtomicUsize::new(0);
/// Held by tests that change a patched site: the others read every site at once.
pub(super) static SITE_WRITES: std::sync::Mutex<()> = std::sync::Mutex::new(());
thread_local! {
    /// This thread's calls of `test_hook` and the last length it passed: a test that makes
    /// one call counts its own, while other tests' threads call `test_hook` in rounds.
    pub(super) static MY_CALLS: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

pub(super) extern "C" fn test_hook(_addr: *mut c_void, len: usize) -> c_int {
    CALLS.fetch_add(1, Relaxed);
    MY_CALLS.with(|c| c.set((c.get().0 + 1, len)));
    0
}

pub(super) fn my_calls() -> usize {
    MY_CALLS.with(|c| c.get().0)
}

/// A function in executable memory made of `code` (padded with `int3`).
pub(super) fn code_page(code: &[u8]) -> *mut u8 {
    // SAFETY: a fresh anonymous mapping, written, then made read+execute.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        ) as *mut u8;
        assert_ne!(p as *mut c_void, libc::MAP_FAILED);
        std::ptr::write_bytes(p, 0xcc, 4096);
        std::ptr::copy_nonoverlapping(code.as_ptr(), p, code.len());
        assert_eq!(
            libc::mprotect(p as *mut c_void, 4096, libc::PROT_READ | libc::PROT_EXEC),
            0
        );
        p
    }
}

// A CET build's munmap: endbr64, then glibc's stub (ret at once: never reached here).
const CET_MUNMAP: [u8; 20] = [
    0xf3, 0x0f, 0x1e, 0xfa, 0xb8, 0x0b, 0, 0, 0, 0x0f, 0x05, 0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff,
    0x73, 0x01, 0xc3,
];
static MUNMAP_STUB: [Prologue; 1] = [syscall_stub(0x0b)];

#[test]
fn endbr64_stub_is_patched_and_keeps_endbr64_at_the_entry() {
    let f = code_page(&CET_MUNMAP);
    let target = Target {
        name: c"test_cet_munmap",
        prologues: &MUNMAP_STUB,
        hook: test_hook as *const () as usize,
    };
    // SAFETY: f is our own function of 20 bytes that no thread runs.
    assert_eq!(unsafe { patch_at(f, &target) }, Ok(()));
    // SAFETY: f's code is readable.
    let entry = unsafe { std::slice::from_raw_parts(f, 4) };
    assert_eq!(entry, ENDBR64, "endbr64 must stay at the entry");
    // SAFETY: f now jumps to test_hook, which has this prototype.
    let call: extern "C" fn(*mut c_void, usize) -> c_int = unsafe { std::mem::transmute(f) };
    let before = my_calls();
    assert_eq!(call(std::ptr::null_mut(), 12345), 0);
    assert_eq!(my_calls(), before + 1, "the hook caught the call");
    assert_eq!(MY_CALLS.with(|c| c.get().1), 12345);
}

#[test]
fn overwriting_only_the_kept_endbr64_is_noticed() {
    let f = code_page(&CET_MUNMAP);
    let target = Target {
        name: c"test_cet_munmap_2",
        prologues: &MUNMAP_STUB,
        hook: test_hook as *const () as usize,
    };
    let _writes = SITE_WRITES.lock().unwrap();
    // SAFETY: our own function.
    assert_eq!(unsafe { patch_at(f, &target) }, Ok(()));
    assert_eq!(overwritten(), None);
    // Another patcher puts a 2-byte short jump (to its stub in the padding) at the
    // entry, over endbr64: calls no longer reach our jump.
    // SAFETY: our own code page.
    unsafe {
        assert_eq!(
            libc::mprotect(
                f as *mut c_void,
                4096,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC
            ),
            0
        );
        *f = 0xeb;
        *f.add(1) = 0x40;
    }
    assert_eq!(
        overwritten(),
        Some(c"test_cet_munmap_2"),
        "entry overwritten, not noticed"
    );
    // Put back: `adopt_overwritten` in other tests looks at every site.
    // SAFETY: our own code page, still writable.
    unsafe { std::ptr::copy_nonoverlapping(ENDBR64.as_ptr(), f, 4) };
}

/// Every byte of our jump and of the endbr64 kept before it is checked: any one of them
/// changed makes the site overwritten.
#[test]
fn a_change_to_any_byte_of_the_site_is_noticed() {
    let f = code_page(&CET_MUNMAP);
    let target = Target {
        name: c"test_cet_munmap_3",
        prologues: &MUNMAP_STUB,
        hook: test_hook as *const () as usize,
    };
    let _writes = SITE_WRITES.lock().unwrap();
    // SAFETY: our own function.
    assert_eq!(unsafe { patch_at(f, &target) }, Ok(()));
    let i = (0..SITES)
        .find(|&i| SITE_AT[i].load(Relaxed) == f as usize + 4)
        .unwrap();
    assert!(site_intact(i, f as usize + 4));
    // SAFETY: our own code page, made writable; each byte is put back after.
    unsafe {
        let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
        assert_eq!(libc::mprotect(f as *mut c_void, 4096, rwx), 0);
        for k in 0..ENDBR64.len() + JMP_LEN {
            *f.add(k) ^= 0x40;
            assert!(
                !site_intact(i, f as usize + 4),
                "byte {k} changed, not noticed"
            );
            *f.add(k) ^= 0x40;
            assert!(site_intact(i, f as usize + 4), "byte {k} restored");
        }
    }
}

#[test]
fn unknown_prologue_is_refused_untouched() {
    let mut code = CET_MUNMAP;
    code[5] = 0x0c; // another system call number
    let f = code_page(&code);
    let target = Target {
        name: c"test_other",
        prologues: &MUNMAP_STUB,
        hook: test_hook as *const () as usize,
    };
    // SAFETY: as above.
    assert_eq!(unsafe { patch_at(f, &target) }, Err(PatchError::Unexpected));
    // SAFETY: readable.
    assert_eq!(unsafe { std::slice::from_raw_parts(f, 20) }, &code[..]);
}

#[test]
fn the_jump_is_not_libfabrics_signature() {
    // libfabric's memhooks takes 49 bb at 0 and 41 ff e3 at 10 as its own patch.
    let j = jump_to(0x1000_0000, 0x1122_3344).unwrap();
    assert_eq!(j[0], 0xe9, "a jmp rel32");
}

#[test]
fn other_patchers_jumps_are_decoded() {
    // UCX 1.13's bistro: jmp rel32, here backwards.
    let mut code = [0u8; MATCH_LEN];
    code[..5].copy_from_slice(&[0xe9, 0xfb, 0xff, 0xff, 0xff]);
    assert_eq!(foreign_target(0x1000, &code), Some(0x1000));
    // libfabric's memhooks: movabs r11, imm64; jmp r11.
    let mut code = [0u8; MATCH_LEN];
    code[..2].copy_from_slice(&[0x49, 0xbb]);
    code[2..10].copy_from_slice(&0x7f00_1234_5678u64.to_le_bytes());
    code[10..13].copy_from_slice(&[0x41, 0xff, 0xe3]);
    assert_eq!(foreign_target(0, &code), Some(0x7f00_1234_5678));
    // Our own form decodes to our hook (the caller then sees it is ours).
    let mut ours = [0u8; MATCH_LEN];
    ours[..JMP_LEN].copy_from_slice(&jump_to(0, 0xabcd).unwrap());
    assert_eq!(foreign_target(0, &ours), Some(0xabcd));
    // A function's own code is not a jump.
    let stub = syscall_stub(0x0b);
    assert_eq!(foreign_target(0, &stub.bytes), None);
    code[12] = 0xe2;
    assert_eq!(foreign_target(0, &code), None);
}

#[test]
fn brk_prologue_ignores_the_got_displacement() {
    let mut head = [0u8; 18];
    head[..14].copy_from_slice(&[
        0xb8, 0x0c, 0, 0, 0, 0x0f, 0x05, 0x48, 0x8b, 0x15, 0xe2, 0x51, 0x0d, 0,
    ]);
    assert_eq!(site_offset(&[BRK], &head), Some(0));
    head[8] = 0x89;
    assert_eq!(site_offset(&[BRK], &head), None);
}

#[test]
fn sbrk_prologues_match_glibc_236_and_241() {
    // The first 18 bytes of sbrk in Debian 12's libc.so.6 (2.36-9+deb12u14) and Debian 13's
    // (2.41-12+deb13u5), from objdump.
    let v236 = [
        0x41, 0x54, 0x4c, 0x8b, 0x25, 0xa7, 0x51, 0x0d, 0x00, 0x80, 0x3d, 0xbe, 0x42, 0x0e, 0x00,
        0x00, 0x55, 0x53,
    ];
    let v241 = [
        0x80, 0x3d, 0x82, 0x5e, 0x0e, 0x00, 0x00, 0x41, 0x54, 0x55, 0x53, 0x48, 0x89, 0xfb, 0x75,
        0x28, 0x48, 0x85,
    ];
    let sbrk = PatchTarget::Sbrk.prologues();
    assert_eq!(site_offset(sbrk, &v236), Some(0));
    assert_eq!(site_offset(sbrk, &v241), Some(0));
    // Displacements may differ; instructions may not.
    let (mut a, mut b) = (v236, v241);
    a[5] ^= 0xff;
    b[3] ^= 0xff;
    assert_eq!(site_offset(sbrk, &a), Some(0));
    assert_eq!(site_offset(sbrk, &b), Some(0));
    a[9] = 0x81;
    b[7] = 0x40;
    assert_eq!(site_offset(sbrk, &a), None);
    assert_eq!(site_offset(sbrk, &b), None);
    // shmat: the pointer-returning stub with its own system call number.
    let shmat = [
        0xb8, 0x1e, 0, 0, 0, 0x0f, 0x05, 0x48, 0x3d, 0x00, 0xf0, 0xff, 0xff, 0x77, 0x01, 0xc3,
        0x48, 0x8b,
    ];
    assert_eq!(site_offset(PatchTarget::Shmat.prologues(), &shmat), Some(0));
    assert_eq!(site_offset(PatchTarget::Shmdt.prologues(), &shmat), None);
}

pub(super) static FOREIGN_CALLS: AtomicUsize = AtomicUsize::new(0);

pub(super) extern "C" fn foreign_hook(_addr: *mut c_void, _len: usize) -> c_int {
    FOREIGN_CALLS.fetch_add(1, Relaxed);
    0
}

/// getpid's stub in glibc's form: `mov eax, 39; syscall; cmp rax, -4095; jae +1; ret`.
const GETPID_STUB: [u8; 16] = [
    0xb8, 0x27, 0, 0, 0, 0x0f, 0x05, 0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff, 0x73, 0x01, 0xc3,
];
static GETPID: [Prologue; 1] = [syscall_stub(0x27)];

/// `pages` fresh read+write pages within `jmp rel32` reach of `near`.
fn pages_near(near: usize, pages: usize) -> *mut u8 {
    for k in 1..64usize {
        let hint = (near & !4095) + k * (16 << 20);
        // SAFETY: a fresh anonymous mapping where nothing is mapped (NOREPLACE).
        let p = unsafe {
            libc::mmap(
                hint as *mut c_void,
                pages * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            assert!(cross_modify::jmp_rel32(p as usize + pages * 4096, near).is_some());
            return p as *mut u8;
        }
    }
    panic!("no pages near {near:#x}");
}

static CURRENT: AtomicUsize = AtomicUsize::new(0);

/// Page `r` of `region`, made a copy of `code`, read+execute: a fresh function each round.
fn fresh_function(region: *mut u8, r: usize, code: &[u8]) -> usize {
    let f = region as usize + r * 4096;
    // SAFETY: a page of our own read+write region, that no thread runs yet.
    unsafe {
        std::ptr::copy_nonoverlapping(code.as_ptr(), f as *mut u8, code.len());
        let rx = libc::PROT_READ | libc::PROT_EXEC;
        assert_eq!(libc::mprotect(f as *mut c_void, 4096, rx), 0);
    }
    f
}

/// Waits until `calls` has counted `more` calls past `seen`.
fn wait_for_calls(calls: &AtomicUsize, seen: usize, more: usize) {
    while calls.load(Relaxed) < seen + more {
        std::hint::spin_loop();
    }
}

/// Two threads calling the function whose address `slot` holds (0: none yet) until `stop`.
fn calling_threads(
    slot: &'static AtomicUsize,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<u64>> {
    (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Relaxed) {
                    let at = slot.load(Acquire);
                    if at != 0 {
                        // SAFETY: a stub, or a jump to a hook, of this prototype.
                        let call: extern "C" fn(*mut c_void, usize) -> c_int =
                            unsafe { std::mem::transmute(at) };
                        call(std::ptr::null_mut(), 1);
                        n += 1;
                    }
                }
                n
            })
        })
        .collect()
}

/// Taking a foreign jump back under running threads: libfabric's memhooks jump (`movabs r11, hook; jmp r11`) sits over one of our
/// sites while two threads call through it in a loop (some preempted between its two
/// instructions, to resume at `jmp r11`); `adopt_overwritten` takes the site back. Each
/// round uses a fresh copy of the function. Every call must land in the other patcher's
/// hook or ours; a torn write or one over the `jmp r11` boundary kills the test process
/// (SIGSEGV/SIGILL).
#[test]
fn taking_a_jump_back_never_breaks_the_threads_running_it() {
    let _writes = SITE_WRITES.lock().unwrap_or_else(|e| e.into_inner());
    let hook = test_hook as *const () as usize;
    let mut code = [0xccu8; 16];
    code[..2].copy_from_slice(&[0x49, 0xbb]);
    code[2..10].copy_from_slice(&(foreign_hook as *const () as u64).to_le_bytes());
    code[10..13].copy_from_slice(&[0x41, 0xff, 0xe3]);
    let rounds = 1500;
    let region = pages_near(hook, rounds);
    // A site of our own for the test, as patch_at would have made it.
    let first = region as usize;
    let target = Target {
        name: c"test_adopt",
        prologues: &GETPID,
        hook,
    };
    // SAFETY: our own fresh page, made a getpid stub first.
    unsafe {
        std::ptr::copy_nonoverlapping(GETPID_STUB.as_ptr(), region, GETPID_STUB.len());
        assert_eq!(
            libc::mprotect(
                first as *mut c_void,
                4096,
                libc::PROT_READ | libc::PROT_EXEC
            ),
            0
        );
        assert_eq!(patch_at(region, &target), Ok(()));
    }
    let i = (0..SITES)
        .find(|&i| SITE_AT[i].load(Relaxed) == first)
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let callers = calling_threads(&CURRENT, &stop);
    for r in 1..rounds {
        let f = fresh_function(region, r, &code);
        let seen = FOREIGN_CALLS.load(Relaxed);
        CURRENT.store(f, Release);
        wait_for_calls(&FOREIGN_CALLS, seen, 20);
        let ours = jump_to(f, hook).unwrap();
        let mut word = [0u8; 8];
        word[..JMP_LEN].copy_from_slice(&ours);
        SITE_CHAINED[i].store(0, Relaxed);
        SITE_CODE[i].store(u64::from_le_bytes(word), Relaxed);
        SITE_AT[i].store(f, Release);
        assert!(adopt_overwritten(), "a jump we know was not taken back");
        assert_eq!(
            SITE_CHAINED[i].load(Relaxed),
            foreign_hook as *const () as usize
        );
        let seen = CALLS.load(Relaxed);
        wait_for_calls(&CALLS, seen, 20);
    }
    stop.store(true, Relaxed);
    let calls: u64 = callers.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(calls > rounds as u64 * 20);
    // Leave the first page as the site: a patch of ours, no chain (other tests read sites).
    SITE_AT[i].store(first, Release);
    let ours = jump_to(first, hook).unwrap();
    let mut word = [0u8; 8];
    word[..JMP_LEN].copy_from_slice(&ours);
    SITE_CODE[i].store(u64::from_le_bytes(word), Relaxed);
    SITE_CHAINED[i].store(0, Relaxed);
    assert!(site_intact(i, first));
}

/// Patching under running threads: our jump written over a system call stub while two threads call it in a
/// loop (inside its `syscall` much of the time, to return to the instruction after it),
/// each round on a fresh copy of the stub. A write over any later instruction boundary, or
/// one a thread can see half done, kills the test process (SIGSEGV/SIGILL).
#[test]
fn patching_a_function_threads_are_running_never_breaks_them() {
    let hook = test_hook as *const () as usize;
    let rounds = 3000;
    let region = pages_near(hook, rounds);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    static RUNNING: AtomicUsize = AtomicUsize::new(0);
    let callers = calling_threads(&RUNNING, &stop);
    for r in 0..rounds {
        let f = fresh_function(region, r, &GETPID_STUB);
        RUNNING.store(f, Release);
        // Let the threads into the stub (a few hundred system calls).
        for _ in 0..20_000 {
            std::hint::spin_loop();
        }
        let jump = jump_to(f, hook).unwrap();
        let old = std::array::from_fn(|k| GETPID_STUB[k]);
        // SAFETY: the stub's entry; its first instruction (`mov eax, 39`) is 5 bytes, and the
        // jump leads to a function of its prototype.
        assert_eq!(
            unsafe { cross_modify::replace_entry(f as *mut u8, old, jump, 5, None) },
            Ok(())
        );
        let seen = CALLS.load(Relaxed);
        wait_for_calls(&CALLS, seen, 10);
    }
    stop.store(true, Relaxed);
    let calls: u64 = callers.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(calls > rounds as u64 * 10);
}

/// A function whose first instruction is 2 bytes, after GNU as's 10-byte padding:
/// `push r12; mov eax, 39; syscall; pop r12; ret` (getpid).
const SHORT_FIRST: [u8; 24] = [
    0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0, // padding
    0x41, 0x54, 0xb8, 0x27, 0, 0, 0, 0x0f, 0x05, 0x41, 0x5c, 0xc3, 0xcc, 0xcc,
];
static SHORT: [Prologue; 1] = [Prologue {
    bytes: [
        0x41, 0x54, 0xb8, 0x27, 0, 0, 0, 0x0f, 0x05, 0x41, 0x5c, 0xc3, 0xcc, 0xcc,
    ],
    any: 0,
    keep: 0,
    replaced: 2,
    pad: &NOP10,
    undo: &[],
}];

#[test]
fn a_short_first_instruction_becomes_a_short_jump_to_the_padding() {
    let f = code_page(&SHORT_FIRST);
    // SAFETY: inside our own code page.
    let entry = unsafe { f.add(10) };
    let target = Target {
        name: c"test_short_first",
        prologues: &SHORT,
        hook: test_hook as *const () as usize,
    };
    // SAFETY: our own function, 14 bytes past the padding.
    assert_eq!(unsafe { patch_at(entry, &target) }, Ok(()));
    // SAFETY: readable.
    let code = unsafe { std::slice::from_raw_parts(f, 24) };
    assert_eq!(
        &code[10..12],
        &[0xeb, 0xf9],
        "jmp rel8 to the padding's last 5 bytes"
    );
    assert_eq!(
        &code[12..],
        &SHORT_FIRST[12..],
        "nothing past the first instruction changed"
    );
    assert_eq!(code[5], 0xe9, "jmp rel32 in the padding");
    // SAFETY: now a jump to test_hook, which has this prototype.
    let call: extern "C" fn(*mut c_void, usize) -> c_int = unsafe { std::mem::transmute(entry) };
    let before = my_calls();
    assert_eq!(call(std::ptr::null_mut(), 777), 0);
    assert_eq!(my_calls(), before + 1);
    // Without the padding it knows, the function is refused untouched.
    let mut bare = SHORT_FIRST;
    bare[..10].fill(0x90);
    let g = code_page(&bare);
    // SAFETY: as above.
    let r = unsafe { patch_at(g.add(10), &target) };
    assert_eq!(r, Err(PatchError::Busy));
    // SAFETY: readable.
    assert_eq!(unsafe { std::slice::from_raw_parts(g, 24) }, &bare[..]);
}

/// Patching under running threads with a short first instruction (glibc 2.36's sbrk, mmap,
/// mremap), and a CLONE_VM task that no thread count sees: two threads run the function
/// (some preempted after its `push r12`, to resume at +2) while the short jump is written,
/// 3,000 rounds on fresh copies.
#[test]
fn a_short_first_instruction_is_replaced_under_running_threads() {
    let hook = test_hook as *const () as usize;
    let rounds = 3000;
    let region = pages_near(hook, rounds);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    static SHORT_AT: AtomicUsize = AtomicUsize::new(0);
    let callers = calling_threads(&SHORT_AT, &stop);
    for r in 0..rounds {
        let entry = fresh_function(region, r, &SHORT_FIRST) + 10;
        SHORT_AT.store(entry, Release);
        for _ in 0..20_000 {
            std::hint::spin_loop();
        }
        let old: [u8; JMP_LEN] = std::array::from_fn(|k| SHORT_FIRST[10 + k]);
        let mut code = old;
        code[..2].copy_from_slice(&cross_modify::jmp_rel8(entry, entry - 5).unwrap());
        let pad = (entry - 5, jump_to(entry - 5, hook).unwrap());
        // SAFETY: the function's entry, whose first instruction (2 bytes) alone changes; the
        // padding before it is dead; both jumps lead to a function of its prototype.
        let r = unsafe { cross_modify::replace_entry(entry as *mut u8, old, code, 2, Some(pad)) };
        assert_eq!(r, Ok(()));
        let seen = CALLS.load(Relaxed);
        wait_for_calls(&CALLS, seen, 10);
    }
    stop.store(true, Relaxed);
    let calls: u64 = callers.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(calls > rounds as u64 * 10);
}

/// The page of `f`'s line in /proc/self/maps, its permissions ("r-xp").
fn perms_of(f: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .find_map(|l| {
            let (range, rest) = l.split_once(' ')?;
            let (lo, hi) = range.split_once('-')?;
            let (lo, hi) = (
                usize::from_str_radix(lo, 16).ok()?,
                usize::from_str_radix(hi, 16).ok()?,
            );
            (lo <= f && f < hi).then(|| rest[..4].to_string())
        })
        .unwrap()
}

/// The restoring `mprotect(PROT_READ|PROT_EXEC)` refused after the write (the same call
/// passed before it): the jump stays, the error says the page is writable, and
/// `left_writable` names it for the runtime's line. Before, the result was ignored: Ok.
#[test]
fn a_refused_restore_after_the_write_is_an_error_that_names_the_page() {
    let f = code_page(&GETPID_STUB) as usize;
    let hook = test_hook as *const () as usize;
    let jump = jump_to(f, hook).unwrap();
    let old = std::array::from_fn(|k| GETPID_STUB[k]);
    cross_modify::test_refuse::RESTORE.set(true);
    // SAFETY: our own stub's entry, a 5-byte first instruction, no other thread runs it.
    let r = unsafe { cross_modify::replace_entry(f as *mut u8, old, jump, 5, None) };
    cross_modify::test_refuse::RESTORE.set(false);
    assert_eq!(r, Err(PatchError::Writable));
    assert!(PatchError::Writable.written());
    // SAFETY: the stub's first bytes, readable.
    assert_eq!(
        unsafe { std::slice::from_raw_parts(f as *const u8, JMP_LEN) },
        jump
    );
    assert_eq!(perms_of(f), "rwxp");
    assert!(cross_modify::left_writable().is_some());
    // SAFETY: our own page, back to read+execute.
    unsafe { libc::mprotect(f as *mut c_void, 4096, libc::PROT_READ | libc::PROT_EXEC) };
}

/// The SYNC_CORE barrier failing after the write (it passed when the process registered):
/// the jump stays, and the error says other threads may not run it. Before, Ok.
#[test]
fn a_failed_barrier_after_the_write_is_an_error() {
    let f = code_page(&GETPID_STUB) as usize;
    let hook = test_hook as *const () as usize;
    let jump = jump_to(f, hook).unwrap();
    let old = std::array::from_fn(|k| GETPID_STUB[k]);
    let spare = code_page(&GETPID_STUB) as usize;
    let spare_jump = jump_to(spare, hook).unwrap();
    // SAFETY: as below; registers for the barrier (and checks it works) first.
    let first = unsafe { cross_modify::replace_entry(spare as *mut u8, old, spare_jump, 5, None) };
    assert_eq!(first, Ok(()), "this machine has SYNC_CORE membarrier");
    cross_modify::test_refuse::SYNC_CORE.set(true);
    // SAFETY: our own stub's entry, a 5-byte first instruction, no other thread runs it.
    let r = unsafe { cross_modify::replace_entry(f as *mut u8, old, jump, 5, None) };
    cross_modify::test_refuse::SYNC_CORE.set(false);
    assert_eq!(r, Err(PatchError::Unsynced));
    assert!(PatchError::Unsynced.written());
    // SAFETY: the stub's first bytes, readable.
    assert_eq!(
        unsafe { std::slice::from_raw_parts(f as *const u8, JMP_LEN) },
        jump
    );
    assert_eq!(perms_of(f), "r-xp");
}
