//! `dlclose`: the loader unmaps an unloaded object's segments with its own internal munmap,
//! which none of the memory hooks sees. A registered static buffer of a plugin would then
//! stay cached while another object is loaded at the same address. The hook reports the
//! object's whole footprint (the span of its PT_LOAD segments), and that of every object
//! loaded after it (dependencies the loader unloads with it), as going away before the real
//! dlclose and ends the report after it. Objects that stay loaded only have their entries
//! invalidated, which is harmless.
//!
//! Like a memory hook it allocates nothing and takes no lock of ours; it does nothing extra
//! until a cache exists.

use crate::monitor::memory::{QUEUE, REPORTING};
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering::*;

/// The start of glibc's `struct link_map` (stable public ABI, <link.h>).
#[repr(C)]
struct LinkMap {
    l_addr: usize,
    l_name: *const libc::c_char,
}

/// Spans reported for one dlclose; more objects than this are merged into the last.
const SPANS: usize = 32;

/// What the `dl_iterate_phdr` callback looks for and finds: the object's span and those of
/// every object loaded after it (its dependencies, which the loader unloads with it when
/// nothing else uses them).
struct Search {
    addr: usize,
    name: *const libc::c_char,
    found: bool,
    spans: [(usize, usize); SPANS],
    n: usize,
}

impl Search {
    fn add(&mut self, span: (usize, usize)) {
        if self.n < SPANS {
            self.spans[self.n] = span;
            self.n += 1;
        } else {
            let last = &mut self.spans[SPANS - 1];
            *last = (last.0.min(span.0), last.1.max(span.1));
        }
    }
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: data is the &mut Search passed to dl_iterate_phdr; info is the loader's
    // description of one loaded object, valid during the call.
    let (search, info) = unsafe { (&mut *(data as *mut Search), &*info) };
    if !search.found {
        if info.dlpi_addr as usize != search.addr || info.dlpi_name != search.name {
            return 0;
        }
        search.found = true;
    }
    let base = info.dlpi_addr as usize;
    let (mut lo, mut hi) = (usize::MAX, 0usize);
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type == libc::PT_LOAD {
            let start = base.wrapping_add(ph.p_vaddr as usize);
            let (first, end) = crate::sys::page_span(start, ph.p_memsz as usize);
            lo = lo.min(first);
            hi = hi.max(end);
        }
    }
    if hi > lo {
        search.add((lo, hi));
    }
    0
}

/// The spans of the loaded object behind `handle` and of the objects loaded after it.
fn footprint(handle: *mut c_void) -> Option<Search> {
    let mut map: *const LinkMap = std::ptr::null();
    // SAFETY: RTLD_DI_LINKMAP stores the object's struct link_map pointer into `map`.
    let rc = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            &mut map as *mut _ as *mut c_void,
        )
    };
    if rc != 0 || map.is_null() {
        return None;
    }
    // SAFETY: map is the loader's link_map of a loaded object; we read its first two fields.
    let (addr, name) = unsafe { ((*map).l_addr, (*map).l_name) };
    let mut search = Search {
        addr,
        name,
        found: false,
        spans: [(0, 0); SPANS],
        n: 0,
    };
    // SAFETY: visit matches dl_iterate_phdr's callback type and only reads what it is given.
    unsafe { crate::sys::elf::iterate_phdr(visit, &mut search as *mut Search as *mut c_void) };
    search.found.then_some(search)
}

/// The `dlclose` hook's body (`abi::dlclose`): the object's span reported around the real
/// call.
pub fn dlclose(handle: *mut c_void) -> c_int {
    let Some(real) = crate::sys::symbol::DLCLOSE.get() else {
        return -1;
    };
    let found = if !handle.is_null() && QUEUE.is_active() && REPORTING.load(Relaxed) {
        footprint(handle)
    } else {
        None
    };
    let spans = found.as_ref().map_or(&[][..], |s| &s.spans[..s.n]);
    let mut watched = 0;
    for &(start, end) in spans {
        watched += crate::monitor::memory::report_begin(start, end) as usize;
    }
    // SAFETY: the app's own dlclose call, forwarded.
    let rc = unsafe { real(handle) };
    for k in 0..spans.len() {
        crate::monitor::memory::report_end(k < watched);
    }
    rc
}
