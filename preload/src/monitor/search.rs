//! Which definition `dlsym(RTLD_NEXT, name)` from a caller would return, for the one case
//! where our `dlsym` answers differently: when that definition is our own memory hook (see
//! `patch::libc_entry_instead`). Only objects loaded before libmrcache.so can find it next
//! (the program, or a library preloaded before ours); the walk reads each object's own
//! symbol table, with no lock and no allocation.

use std::ffi::{CStr, c_int, c_void};

struct Walk {
    caller: usize,
    ours: usize,
    name: &'static CStr,
    seen: bool,
    /// Some(true): ours is the first definition after the caller; Some(false): another.
    answer: Option<bool>,
}

/// True when the first object after the caller's that defines `name` is libmrcache.so (the
/// one containing `ours`, our definition), in load order, which for the objects loaded
/// before ours (the program and the preloaded libraries) is the search order.
pub fn ours_comes_next(caller: usize, name: &'static CStr, ours: usize) -> bool {
    let mut walk = Walk {
        caller,
        ours,
        name,
        seen: false,
        answer: None,
    };
    // SAFETY: visit matches dl_iterate_phdr's callback type and only reads what it is given.
    unsafe { crate::sys::elf::iterate_phdr(visit, &mut walk as *mut Walk as *mut c_void) };
    walk.answer == Some(true)
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: data is the &mut Walk passed to dl_iterate_phdr; info is the loader's
    // description of one loaded object, valid during the call.
    let (walk, info) = unsafe { (&mut *(data as *mut Walk), &*info) };
    // SAFETY: as above.
    let (lo, hi) = unsafe { crate::sys::elf::span(info) };
    let contains = |a: usize| (lo..hi).contains(&a);
    if !walk.seen {
        walk.seen = contains(walk.caller);
        // The caller is libmrcache.so itself: nothing of ours comes after it.
        if walk.seen && contains(walk.ours) {
            walk.answer = Some(false);
            return 1;
        }
        return 0;
    }
    if contains(walk.ours) {
        walk.answer = Some(true);
        return 1;
    }
    // SAFETY: as above.
    match unsafe { crate::sys::elf::defines(info, walk.name) } {
        Some(false) => 0,
        // Defined here, or this object's table cannot be read: not ours.
        _ => {
            walk.answer = Some(false);
            1
        }
    }
}
