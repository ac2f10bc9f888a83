//! aarch64 patching under running threads (run under qemu-user by `ci/aarch64 unit`): a
//! copy of glibc 2.41's munmap stub in a page of our own, patched by `patch_at` as libc's
//! is. `MRCACHE_TEST_A64_BREAK=tear|no-flush|any-prologue` switches on a deliberately broken
//! variant (`cross_modify::test_break`); each makes its test here fail.

use crate::monitor::cross_modify::{self, test_break};
use crate::monitor::patch::aarch64::{self, glibc};
use crate::monitor::patch::sites_aarch64::site_intact;
use crate::monitor::patch::*;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU8, Ordering::Relaxed};

/// One test at a time: the break mode and `LAST_SYNC` are process-wide.
static ONE: Mutex<()> = Mutex::new(());

fn break_mode() -> u8 {
    let mode = match std::env::var("MRCACHE_TEST_A64_BREAK").as_deref() {
        Ok("tear") => test_break::TEAR,
        Ok("no-flush") => test_break::NO_FLUSH,
        Ok("any-prologue") => test_break::ANY_PROLOGUE,
        _ => test_break::OFF,
    };
    cross_modify::test_break::MODE.store(mode, Relaxed);
    mode
}

const MARK: isize = 0x5a;
extern "C" fn test_hook(_addr: usize, _len: usize) -> isize {
    MARK
}

static STUB_PROLOGUES: [Prologue; 1] = [glibc::MUNMAP_241];
fn stub_target() -> Target {
    Target {
        name: c"test_munmap",
        prologues: &STUB_PROLOGUES,
        hook: test_hook as *const () as usize,
    }
}

/// A fresh executable page holding `words` at its start, then `ret` (the stub's error path)
/// and `udf #0` to its end.
fn code_page(words: &[u32]) -> *mut u32 {
    // SAFETY: a private anonymous page of our own.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            crate::sys::page_size(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let code = p as *mut u32;
    for (k, &w) in words.iter().chain(&[0xd65f_03c0]).enumerate() {
        // SAFETY: within the page.
        unsafe { code.add(k).write(w) };
    }
    aarch64::sync_icache(p as usize, crate::sys::page_size());
    // SAFETY: our page.
    assert_eq!(
        unsafe {
            libc::mprotect(
                p,
                crate::sys::page_size(),
                libc::PROT_READ | libc::PROT_EXEC,
            )
        },
        0
    );
    code
}

fn word(code: *mut u32, k: usize) -> u32 {
    // SAFETY: a word of a code page of ours.
    unsafe { std::ptr::read_volatile(code.add(k)) }
}

/// The stub called as munmap(0, 0): the kernel's -EINVAL, or our hook's mark once patched.
fn call(code: *mut u32) -> isize {
    // SAFETY: the page holds the stub (or our `B` to the hook); munmap(0, 0) changes nothing.
    let f: extern "C" fn(usize, usize) -> isize = unsafe { std::mem::transmute(code) };
    f(0, 0)
}

/// glibc 2.41's munmap copied into a page, patched while 3 threads call it: every call
/// returns -EINVAL or the mark, every call that starts after `patch_at` returned gets the
/// mark (the SYNC_CORE membarrier), and the `B` over its `svc #0` (word 2, after `bti c;
/// mov x8`) is the only changed word, flushed (`LAST_SYNC`). Then the `B` is taken back and
/// stored again 300 times under the callers (`replace_word` each time: `svc` and `B` are both
/// on the architecture's list).
/// tear: a caller runs a half-written word (SIGILL/SIGSEGV or a wrong value);
/// no-flush: the flush check fails.
#[test]
fn patched_stub_reaches_the_hook_from_every_thread() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let mode = break_mode();
    let code = code_page(glibc::MUNMAP_241.words);
    assert_eq!(call(code), -(libc::EINVAL as isize));
    // 0: not patched yet, 1: patch_at returned, 2: the B is being taken back and restored.
    let phase = AtomicU8::new(0);
    let stop = AtomicBool::new(false);
    let at = code as usize;
    let bad = AtomicIsize::new(0);
    /// Stops the callers however the scope ends (a failed assert must not leave them
    /// spinning while the scope waits for them).
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Relaxed);
        }
    }
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for _ in 0..3 {
            s.spawn(|| {
                while !stop.load(Relaxed) {
                    let before = phase.load(Relaxed);
                    let v = call(at as *mut u32);
                    let strict = before == 1 && phase.load(Relaxed) == 1;
                    let ok = v == MARK || (!strict && v == -(libc::EINVAL as isize));
                    if !ok && bad.load(Relaxed) == 0 {
                        bad.store(v | (strict as isize) << 40, Relaxed);
                    }
                }
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        // SAFETY: the stub's entry in our page; it is never run past its first word after.
        let r = unsafe { patch_at(code as *mut u8, &stub_target()) };
        phase.store(1, Relaxed);
        assert_eq!(r, Ok(()), "patch_at under running threads");
        let b = word(code, 2);
        assert_eq!(
            aarch64::b_target(code as usize + 8, b).map(|_| ()),
            Some(()),
            "{b:#010x} is a B"
        );
        assert_eq!(call(code), MARK);
        for k in (0..glibc::MUNMAP_241.words.len()).filter(|&k| k != 2) {
            assert_eq!(
                word(code, k),
                glibc::MUNMAP_241.words[k],
                "word {k} changed"
            );
        }
        if mode != test_break::TEAR {
            assert_eq!(
                aarch64::LAST_SYNC.load(Relaxed),
                code as usize + 8,
                "the patched word was not flushed to instruction fetch"
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        phase.store(2, Relaxed);
        for _ in 0..300 {
            // SAFETY: our stub's `svc`: it and `B` are both safe to swap under execution.
            unsafe {
                let svc = code.add(2);
                let _ = cross_modify::replace_word(svc, b, aarch64::SVC0);
                assert_eq!(cross_modify::replace_word(svc, aarch64::SVC0, b), Ok(()));
            }
        }
        stop.store(true, Relaxed);
    });
    assert_eq!(
        bad.load(Relaxed),
        0,
        "a caller saw neither -EINVAL nor the mark (bit 40: a call that started after patch_at returned)"
    );
    assert_eq!(call(code), MARK);
}

/// A stub whose words are not a prologue we know (2.41's munmap with another system call
/// number; 2.36's brk, its GOT load changed into a store) is refused and left as it was.
/// any-prologue: it is patched.
#[test]
fn unknown_first_words_are_refused_untouched() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    break_mode();
    let mut other_call = glibc::MUNMAP_241.words.to_vec();
    other_call[1] = 0xd2801b08; // mov x8, #216
    let mut store = glibc::BRK_236.words.to_vec();
    store[4] = 0xf9070c42; // str x2, [x2, #..] for ldr
    for words in [other_call, store] {
        let code = code_page(&words);
        // SAFETY: our page; refused before anything is written.
        let r = unsafe { patch_at(code as *mut u8, &stub_target()) };
        assert_eq!(r, Err(PatchError::Unexpected), "{words:08x?}");
        for (k, &w) in words.iter().enumerate() {
            assert_eq!(word(code, k), w, "word {k} of {words:08x?}");
        }
    }
}

/// An entry another patcher took before us (UCX's `movz/movk x15; br x15`) is taken over
/// and chained to (its first word is an ordinary `movz`: only without other threads) —
/// here the test harness's threads exist, so it is refused with `Alone`.
#[test]
fn a_foreign_movz_jump_is_not_replaced_while_threads_run() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    break_mode();
    let h = 0x0000_fffe_1234_5678u64;
    let part = |hw: u64| ((h >> (hw * 16)) & 0xffff) as u32;
    let ucx = [
        0xd2e0000f | part(3) << 5,
        0xf2c0000f | part(2) << 5,
        0xf2a0000f | part(1) << 5,
        0xf280000f | part(0) << 5,
        0xd61f01e0,
        0xd503201f,
    ];
    let code = code_page(&ucx);
    let spin = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(200)));
    // SAFETY: our page; refused before anything is written (another thread exists).
    let r = unsafe { patch_at(code as *mut u8, &stub_target()) };
    spin.join().unwrap();
    assert_eq!(r, Err(PatchError::Alone));
    assert_eq!(word(code, 0), ucx[0]);
}

/// Writes `w` over word `k` of our code page at `code` (made writable for it, then read+exec).
fn poke(code: *mut u32, k: usize, w: u32) {
    let page = (code as usize) & !(crate::sys::page_size() - 1);
    let (rw, rx) = (
        libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
        libc::PROT_READ | libc::PROT_EXEC,
    );
    // SAFETY: our own code page; only word `k` of it changes.
    unsafe {
        assert_eq!(
            libc::mprotect(page as *mut _, crate::sys::page_size(), rw),
            0
        );
        code.add(k).write_volatile(w);
        assert_eq!(
            libc::mprotect(page as *mut _, crate::sys::page_size(), rx),
            0
        );
    }
    aarch64::sync_icache(code as usize + 4 * k, 4);
}

/// The site `patch_at` recorded at `at`.
fn site_index(at: usize) -> usize {
    (0..SITES)
        .find(|&i| SITE_AT[i].load(Relaxed) == at)
        .expect("a site at the svc")
}

/// Every stub of Debian 12's and 13's arm64 glibc, copied into a page and patched (the
/// harness's threads are running: the `svc` and the `B` may both be modified under
/// execution, so 2.36's brk, shmat and shmdt, whose first word is an ordinary instruction,
/// are patched too): the `B` replaces the `svc #0`, every other word stays, a call reaches
/// the hook. A uprobe's `BRK #5` over the entry's first word (or any kept word) is no
/// overwrite, nor is the word written back when it goes; another change to a kept word, or a
/// `BRK` over our `B`, is.
#[test]
fn a_stubs_svc_takes_the_branch_and_a_breakpoint_on_its_entry_is_harmless() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    break_mode();
    let stubs = [
        (PatchTarget::Munmap, 0),
        (PatchTarget::Madvise, 0),
        (PatchTarget::Brk, 0),
        (PatchTarget::Shmat, 0),
        (PatchTarget::Shmdt, 0),
        (PatchTarget::Munmap, 1),
        (PatchTarget::Madvise, 1),
        (PatchTarget::Brk, 1),
        (PatchTarget::Shmat, 1),
        (PatchTarget::Shmdt, 1),
    ];
    for (t, v) in stubs {
        let p = &aarch64::prologues(t)[v];
        let keep = p.words.iter().position(|&w| w == aarch64::SVC0).unwrap();
        let code = code_page(p.words);
        let target = Target {
            name: t.name(),
            prologues: aarch64::prologues(t),
            hook: test_hook as *const () as usize,
        };
        // SAFETY: our page, a copy of the stub.
        assert_eq!(
            unsafe { patch_at(code as *mut u8, &target) },
            Ok(()),
            "{t:?} {v}"
        );
        let site = code as usize + 4 * keep;
        let b = word(code, keep);
        assert!(
            aarch64::b_target(site, b).is_some(),
            "{t:?} {v}: {b:#010x} over the svc"
        );
        for (k, &w) in p.words.iter().enumerate().filter(|&(k, _)| k != keep) {
            assert_eq!(word(code, k), w, "{t:?} {v}: word {k} changed");
        }
        assert_eq!(call(code), MARK, "{t:?} {v}");
        let i = site_index(site);
        assert!(site_intact(i, site));
        for k in 0..keep {
            poke(code, k, 0xd42000a0); // brk #5
            assert!(site_intact(i, site), "{t:?} {v}: a breakpoint on word {k}");
            poke(code, k, p.words[k]);
            assert!(site_intact(i, site), "{t:?} {v}: word {k} written back");
            poke(code, k, p.words[k] ^ 1 << 20);
            assert!(
                !site_intact(i, site),
                "{t:?} {v}: word {k} changed, not noticed"
            );
            poke(code, k, p.words[k]);
        }
        poke(code, keep, 0xd42000a0);
        assert!(!site_intact(i, site), "{t:?} {v}: a breakpoint on our B");
        poke(code, keep, b);
        assert!(site_intact(i, site));
        assert_eq!(call(code), MARK);
    }
}

/// A breakpoint already over a stub's entry when we patch (a uprobe attached before the
/// process started) is read as the word it covers: the stub is patched over its `svc`, and
/// the word written back when the probe goes leaves the site intact.
#[test]
fn a_breakpoint_already_on_a_stubs_entry_is_patched_past() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    break_mode();
    let mut words = glibc::SHMDT_241.words.to_vec();
    words[0] = 0xd42000a0;
    let code = code_page(&words);
    let target = Target {
        name: c"test_shmdt_probed",
        prologues: aarch64::prologues(PatchTarget::Shmdt),
        hook: test_hook as *const () as usize,
    };
    // SAFETY: our page, a copy of the stub with a breakpoint on its entry.
    assert_eq!(unsafe { patch_at(code as *mut u8, &target) }, Ok(()));
    let site = code as usize + 8;
    let i = site_index(site);
    assert!(
        site_intact(i, site),
        "the breakpoint taken for an overwrite"
    );
    poke(code, 0, glibc::SHMDT_241.words[0]);
    assert!(
        site_intact(i, site),
        "libc's word written back, taken for an overwrite"
    );
    assert_eq!(call(code), MARK);
}

/// Another patcher's one-word jump (a `B`, which the architecture lets us replace under
/// execution) written over the entry of a stub we patched past its `mov x8`: taken back
/// with our `B` at the entry, chained to its target; when it writes back the words it had
/// found, the site is intact too.
#[test]
fn a_branch_over_the_kept_words_is_taken_back_at_the_entry() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    break_mode();
    let code = code_page(glibc::MADVISE_241.words);
    let target = Target {
        name: c"test_madvise_adopted",
        prologues: aarch64::prologues(PatchTarget::Madvise),
        hook: test_hook as *const () as usize,
    };
    // SAFETY: our page, a copy of the stub.
    assert_eq!(unsafe { patch_at(code as *mut u8, &target) }, Ok(()));
    let site = code as usize + 8;
    let i = site_index(site);
    // The other patcher's hook: `mov x0, #0x5b; ret` further down the page.
    poke(code, 32, 0xd2800b60);
    poke(code, 33, 0xd65f03c0);
    let theirs = aarch64::b_to(code as usize, code as usize + 128).unwrap();
    poke(code, 0, theirs);
    assert!(!site_intact(i, site));
    assert!(adopt_overwritten(), "not taken back");
    assert!(site_intact(i, site));
    assert_eq!(SITE_CHAINED[i].load(Relaxed), code as usize + 128);
    assert_eq!(call(code), MARK, "our B at the entry");
    poke(code, 0, glibc::MADVISE_241.words[0]);
    assert!(
        site_intact(i, site),
        "our first layout, back, taken for an overwrite"
    );
    SITE_CHAINED[i].store(0, Relaxed);
}
