//! Tests of `patch` at entries patched after their first instruction: a breakpoint over the
//! kept instruction is no overwrite, and a kept instruction's stack effect is taken back
//! before the hook (docs/design/monitor.md, "Where the jump goes").

use super::tests::{
    FOREIGN_CALLS, MY_CALLS, SITE_WRITES, code_page, foreign_hook, my_calls, test_hook,
};
use super::*;
use crate::monitor::cross_modify::JMP_LEN;
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering::Relaxed;

/// glibc 2.36's munmap after GNU as's padding (NOP10_NOP2), 16-aligned: `mov eax, 11;
/// syscall; cmp rax, -4095; jae +1; ret`.
const PADDED_MUNMAP: [u8; 32] = [
    0xcc, 0xcc, 0xcc, 0xcc, // the end of a function before
    0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0, 0x66, 0x90, // padding
    0xb8, 0x0b, 0, 0, 0, 0x0f, 0x05, 0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff, 0x73, 0x01, 0xc3,
];
static MUNMAP_PAST_MOV: [Prologue; STUB_FORMS] = stub_past_mov(syscall_stub(0x0b));

/// The index of the site patched at `at`.
fn site_index(at: usize) -> usize {
    (0..SITES)
        .find(|&i| SITE_AT[i].load(Relaxed) == at)
        .unwrap()
}

/// A stub is patched after its first instruction, which stays as it is: a uprobe's `int3`
/// over the entry's first byte runs it out of line and resumes on our jump, and the byte
/// written back when the probe goes is the one there before. An `int3` there is not an
/// overwrite; any other change to the kept instruction, or an `int3` on our jump, is.
#[test]
fn a_stub_keeps_its_first_instruction_and_a_breakpoint_there_is_no_overwrite() {
    let p = code_page(&PADDED_MUNMAP);
    // SAFETY: inside our own code page.
    let f = unsafe { p.add(16) };
    let target = Target {
        name: c"test_munmap_past_mov",
        prologues: &MUNMAP_PAST_MOV,
        hook: test_hook as *const () as usize,
    };
    let _writes = SITE_WRITES.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: our own function, padded before and 16 bytes long.
    assert_eq!(unsafe { patch_at(f, &target) }, Ok(()));
    // SAFETY: readable.
    let code = unsafe { std::slice::from_raw_parts(p, 32) };
    assert_eq!(&code[16..21], &PADDED_MUNMAP[16..21], "mov eax, 11 kept");
    let jmp: &[u8] = &[0xeb, 0xf4];
    assert_eq!(&code[21..23], jmp, "syscall became jmp rel8 to the padding");
    assert_eq!(
        &code[23..],
        &PADDED_MUNMAP[23..],
        "nothing after it changed"
    );
    assert_eq!(code[11], 0xe9, "jmp rel32 in the padding");
    // SAFETY: the entry runs `mov eax, 11` and then jumps to test_hook (this prototype).
    let call: extern "C" fn(*mut c_void, usize) -> c_int = unsafe { std::mem::transmute(f) };
    let before = my_calls();
    assert_eq!(call(std::ptr::null_mut(), 4242), 0);
    assert_eq!(my_calls(), before + 1, "the hook caught the call");
    let site = f as usize + 5;
    let i = site_index(site);
    assert!(site_intact(i, site));
    // SAFETY: our own code page, made writable; each byte is put back after.
    unsafe {
        let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
        assert_eq!(libc::mprotect(p as *mut c_void, 4096, rwx), 0);
        *f = 0xcc;
        assert!(site_intact(i, site), "a breakpoint on the kept instruction");
        *f = 0xb8;
        for k in 0..5 + JMP_LEN {
            *f.add(k) ^= 0x40;
            assert!(!site_intact(i, site), "byte {k} changed, not noticed");
            *f.add(k) ^= 0x40;
        }
        for k in 1..5 + JMP_LEN {
            let was = *f.add(k);
            *f.add(k) = 0xcc;
            assert!(!site_intact(i, site), "int3 at byte {k}, not noticed");
            *f.add(k) = was;
        }
        assert!(site_intact(i, site));
    }
}

/// `push r12; mov rax, 39; syscall; pop r12; ret` (getpid): patched after its `push r12`,
/// taken back by `pop r12` before the hook (a wrong stack would make the hook return into
/// the pushed value).
const PUSH_FIRST: [u8; 16] = [
    0x41, 0x54, 0x48, 0xc7, 0xc0, 0x27, 0, 0, 0, 0x0f, 0x05, 0x41, 0x5c, 0xc3, 0xcc, 0xcc,
];
static PUSH_KEPT: [Prologue; 1] = [Prologue {
    bytes: [
        0x41, 0x54, 0x48, 0xc7, 0xc0, 0x27, 0, 0, 0, 0x0f, 0x05, 0x41, 0x5c, 0xc3,
    ],
    any: 0,
    keep: 2,
    replaced: 7,
    pad: &[],
    undo: &[0x41, 0x5c],
}];

#[test]
fn a_kept_push_is_taken_back_before_the_hook() {
    let f = code_page(&PUSH_FIRST);
    let target = Target {
        name: c"test_push_kept",
        prologues: &PUSH_KEPT,
        hook: test_hook as *const () as usize,
    };
    // SAFETY: our own function.
    assert_eq!(unsafe { patch_at(f, &target) }, Ok(()));
    // SAFETY: readable.
    let code = unsafe { std::slice::from_raw_parts(f, 16) };
    assert_eq!(&code[..2], &[0x41, 0x54], "push r12 kept");
    assert_eq!(code[2], 0xe9, "jmp rel32 over mov rax, 39");
    assert_eq!(&code[7..], &PUSH_FIRST[7..]);
    // SAFETY: push r12, then the undo trampoline (pop r12) and test_hook (this prototype).
    let call: extern "C" fn(*mut c_void, usize) -> c_int = unsafe { std::mem::transmute(f) };
    let before = my_calls();
    for _ in 0..3 {
        assert_eq!(call(std::ptr::null_mut(), 99), 0);
    }
    assert_eq!(my_calls(), before + 3);
    assert_eq!(MY_CALLS.with(|c| c.get().1), 99);
}

/// libfabric's memhooks form (`movabs r11, hook; jmp r11`, 13 bytes) written at the entry of a
/// stub we patched after its `mov eax, 11` (over the kept instruction and our jump):
/// `adopt_overwritten` takes it back at the entry and chains to its hook; when that patcher
/// later writes back the bytes it had found (our first layout), the site is intact too.
#[test]
fn a_jump_over_the_kept_instruction_is_taken_back_at_the_entry() {
    let p = code_page(&PADDED_MUNMAP);
    // SAFETY: inside our own code page.
    let f = unsafe { p.add(16) };
    let target = Target {
        name: c"test_adopt_kept",
        prologues: &MUNMAP_PAST_MOV,
        hook: test_hook as *const () as usize,
    };
    let _writes = SITE_WRITES.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: our own function, padded before.
    assert_eq!(unsafe { patch_at(f, &target) }, Ok(()));
    let site = f as usize + 5;
    let i = site_index(site);
    let mut found = [0u8; 13];
    let mut other = [0u8; 13];
    other[..2].copy_from_slice(&[0x49, 0xbb]);
    other[2..10].copy_from_slice(&(foreign_hook as *const () as u64).to_le_bytes());
    other[10..].copy_from_slice(&[0x41, 0xff, 0xe3]);
    // SAFETY: our own code page, made writable; the other patcher's plain copy.
    unsafe {
        let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
        assert_eq!(libc::mprotect(p as *mut c_void, 4096, rwx), 0);
        std::ptr::copy_nonoverlapping(f, found.as_mut_ptr(), 13);
        std::ptr::copy_nonoverlapping(other.as_ptr(), f, 13);
    }
    assert!(!site_intact(i, site));
    adopt_overwritten();
    assert!(site_intact(i, site), "not taken back");
    assert_eq!(
        SITE_CHAINED[i].load(Relaxed),
        foreign_hook as *const () as usize
    );
    // SAFETY: readable.
    assert_eq!(unsafe { *f }, 0xe9, "our jump at the entry");
    // SAFETY: the entry jumps to test_hook (this prototype).
    let call: extern "C" fn(*mut c_void, usize) -> c_int = unsafe { std::mem::transmute(f) };
    let (before, foreign) = (my_calls(), FOREIGN_CALLS.load(Relaxed));
    assert_eq!(call(std::ptr::null_mut(), 7), 0);
    assert_eq!(my_calls(), before + 1);
    assert_eq!(
        FOREIGN_CALLS.load(Relaxed),
        foreign,
        "the hook, not the test, chains"
    );
    // The other patcher stops: what it found is written back.
    // SAFETY: our own code page, writable again (adopt made it read+exec).
    unsafe {
        let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
        assert_eq!(libc::mprotect(p as *mut c_void, 4096, rwx), 0);
        std::ptr::copy_nonoverlapping(found.as_ptr(), f, 13);
    }
    assert!(
        site_intact(i, site),
        "our first layout, back, taken for an overwrite"
    );
}

/// A breakpoint already over the entry's first byte when we patch (a uprobe attached before
/// the process started): the stub is still recognised and patched after the kept
/// instruction, the `int3` is no overwrite, and neither is the byte written back when the
/// probe goes; another byte there is.
#[test]
fn a_breakpoint_already_at_the_entry_is_patched_past() {
    let mut code = PADDED_MUNMAP;
    code[16] = 0xcc;
    let p = code_page(&code);
    // SAFETY: inside our own code page.
    let f = unsafe { p.add(16) };
    let target = Target {
        name: c"test_munmap_probed",
        prologues: &MUNMAP_PAST_MOV,
        hook: test_hook as *const () as usize,
    };
    let _writes = SITE_WRITES.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: our own function, padded before.
    assert_eq!(unsafe { patch_at(f, &target) }, Ok(()));
    let site = f as usize + 5;
    let i = site_index(site);
    assert!(
        site_intact(i, site),
        "the breakpoint taken for an overwrite"
    );
    // SAFETY: our own code page, made writable: the probe goes, then another byte.
    unsafe {
        let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
        assert_eq!(libc::mprotect(p as *mut c_void, 4096, rwx), 0);
        *f = 0xb8;
        assert!(
            site_intact(i, site),
            "libc's byte written back, taken for an overwrite"
        );
        *f = 0xb9;
        assert!(!site_intact(i, site), "another first byte, not noticed");
        *f = 0xb8;
    }
    // SAFETY: the entry runs `mov eax, 11` and then jumps to test_hook (this prototype).
    let call: extern "C" fn(*mut c_void, usize) -> c_int = unsafe { std::mem::transmute(f) };
    let before = my_calls();
    assert_eq!(call(std::ptr::null_mut(), 5), 0);
    assert_eq!(my_calls(), before + 1);
}
