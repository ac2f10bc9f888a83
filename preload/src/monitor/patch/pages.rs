//! The watched pages, looked at: `try_clean` clears the watch word (`watch`) when every
//! site is intact and every watched page is as we left it, read from the mappings
//! (`/proc/self/maps` or PROCMAP_QUERY); the drain thread re-checks them (`drain_tick`).

use super::*;
use std::ffi::c_void;
use std::sync::atomic::{
    AtomicI32, AtomicI64, AtomicU64,
    Ordering::{Relaxed, SeqCst},
};

/// Clear `SUSPECT` when it is safe: nothing in flight, libc's mprotect entry patched, every
/// site intact, every watched page mapped, not writable, not shared and still backed by
/// the mapping it had at the first clean, and each page holding a site still the private
/// copy our write made (`pages_ok`), and no watched call began or ended since the word was
/// read (the compare-and-swap fails otherwise). Reads `/proc/self/maps` (or queries it):
/// the runtime's set-up and the background drain thread only, never a hook or the hit.
/// errno is the caller's afterwards: the set-up runs inside the app's first verbs call, and
/// a kernel without PROCMAP_QUERY answers the probe with ENOTTY (qemu-user: ENOSYS).
pub fn try_clean() -> bool {
    let errno = crate::sys::errno();
    let clean = try_clean_now();
    crate::sys::set_errno(errno);
    clean
}

pub(super) fn try_clean_now() -> bool {
    let w = WATCH.load(SeqCst);
    if w & SUSPECT == 0 {
        return true;
    }
    if w & IN_FLIGHT_MASK != 0
        || EVERY_HIT.load(Relaxed)
        || !MPROTECT_PATCHED.load(Relaxed)
        || SITE_AT[0].load(Relaxed) == 0
    {
        return false;
    }
    if !pages_ok(true) || overwritten().is_some() {
        return false;
    }
    WATCH
        .compare_exchange(w, (w & !SUSPECT).wrapping_add(EVENT), SeqCst, SeqCst)
        .is_ok()
}

/// The drain thread's part, once a cycle (20 ms), after its check of every site: while the
/// word is clean, check the watched pages again (protection and identity, `pages_ok`), so a
/// page made writable or replaced past every hook (a raw `syscall`) makes hits check every
/// site from the next cycle on: one PROCMAP_QUERY ioctl per mapping of the watched spans
/// every cycle, or, on kernels without it, a read of `/proc/self/maps` every
/// `MAPS_RECHECK` cycles. While suspect, `try_clean`, backing off (1, 2, 4 ... up to
/// `MAPS_RECHECK` cycles) while it keeps failing on the pages with no watched call since.
pub fn drain_tick() {
    static TICK: AtomicU64 = AtomicU64::new(0);
    static NEXT_TRY: AtomicU64 = AtomicU64::new(0);
    static BACKOFF: AtomicU64 = AtomicU64::new(1);
    static LAST_EVENTS: AtomicU64 = AtomicU64::new(u64::MAX);
    let tick = TICK.fetch_add(1, Relaxed) + 1;
    let w = WATCH.load(SeqCst);
    if w & SUSPECT == 0 {
        let query = matches!(query_fd(), Some(fd) if fd >= 0);
        if (query || tick % MAPS_RECHECK == 0) && !pages_ok(false) {
            let _ = WATCH.fetch_update(SeqCst, SeqCst, |w| Some((w | SUSPECT).wrapping_add(EVENT)));
        }
        return;
    }
    let events = w >> 21;
    if events != LAST_EVENTS.swap(events, Relaxed) {
        // A watched call since the last try: try now.
        BACKOFF.store(1, Relaxed);
        NEXT_TRY.store(0, Relaxed);
    }
    if tick < NEXT_TRY.load(Relaxed) {
        return;
    }
    if !try_clean() {
        let b = BACKOFF.load(Relaxed);
        NEXT_TRY.store(tick + b, Relaxed);
        BACKOFF.store((b * 2).min(MAPS_RECHECK), Relaxed);
    }
}

/// Drain cycles between two reads of `/proc/self/maps` while clean, and the longest
/// back-off while suspect (50 cycles of 20 ms: one second).
pub(super) const MAPS_RECHECK: u64 = 50;

/// One mapping over a watched span, as `/proc/self/maps` or PROCMAP_QUERY give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Vma {
    pub start: usize,
    pub end: usize,
    pub writable: bool,
    pub shared: bool,
    /// `major << 32 | minor`.
    pub dev: u64,
    pub inode: u64,
    pub offset: u64,
}

impl Vma {
    /// What a page keeps across splits and merges of its mapping: the file, and the file
    /// offset of address 0 (so two mappings of one file at the same place give the same).
    fn identity(&self) -> [u64; 3] {
        [
            self.dev,
            self.inode,
            self.offset.wrapping_sub(self.start as u64),
        ]
    }
}

/// The identity of each span's mapping at the first clean (`Vma::identity`, all zero: not
/// recorded yet).
pub(super) static IDENTITY: [[AtomicU64; 3]; 2] = [
    [const { AtomicU64::new(0) }; 3],
    [const { AtomicU64::new(0) }; 3],
];

/// Whether every page of the watched spans is mapped, not writable, private, backed by a
/// file (libc's and libmrcache.so's code), and by the same file at the same place as at
/// the first clean (`record`: record it if not yet). A page replaced by a read-only view of
/// a memfd or of another file, or by an anonymous copy, fails: its identity differs.
pub(super) fn pages_ok(record: bool) -> bool {
    let mut ok = true;
    for (i, s) in SPAN.iter().enumerate() {
        let (lo, hi) = (s[0].load(Relaxed), s[1].load(Relaxed));
        if lo >= hi {
            continue;
        }
        let want: [u64; 3] = std::array::from_fn(|k| IDENTITY[i][k].load(Relaxed));
        let mut first: Option<[u64; 3]> = None;
        let covered = each_vma(lo, hi, |v| {
            let id = v.identity();
            let same = match first {
                None => {
                    first = Some(id);
                    true
                }
                Some(f) => f == id,
            };
            same && !v.writable && !v.shared && v.inode != 0 && (want == [0; 3] || want == id)
        });
        ok &= covered;
        if covered
            && record
            && want == [0; 3]
            && let Some(id) = first
        {
            for (k, x) in id.iter().enumerate() {
                IDENTITY[i][k].store(*x, Relaxed);
            }
        }
    }
    ok && sites_private_copies()
}

/// Whether each page holding a site is still the private, anonymous copy of libc's page
/// our write made (`/proc/self/pagemap`: present or swapped, bit 61 "file page or shared
/// anonymous" clear): a page of the same file mapped again over it, not yet written, is a
/// file page that follows its file.
pub(super) fn sites_private_copies() -> bool {
    // SAFETY: a constant NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/pagemap".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return false;
    }
    let mut ok = true;
    for site in &SITE_AT {
        let at = site.load(Relaxed);
        if at == 0 {
            break;
        }
        let page_size = crate::sys::page_size();
        for page in [at / page_size, (at + 7) / page_size] {
            let mut entry = 0u64;
            // SAFETY: reads 8 bytes into `entry` from our own descriptor.
            let n = unsafe {
                libc::pread(
                    fd,
                    &mut entry as *mut u64 as *mut c_void,
                    8,
                    (page * 8) as libc::off_t,
                )
            };
            let mapped = entry & (1 << 63 | 1 << 62) != 0;
            ok &= n == 8 && mapped && entry & (1 << 61) == 0;
        }
    }
    // SAFETY: the descriptor just opened.
    unsafe { libc::close(fd) };
    ok
}

/// Calls `f` on each mapping over `[lo, hi)` in address order; true when they cover it
/// without a hole and `f` accepted every one. PROCMAP_QUERY where the kernel has it (6.11),
/// else a read of `/proc/self/maps`.
pub(super) fn each_vma(lo: usize, hi: usize, mut f: impl FnMut(&Vma) -> bool) -> bool {
    if let Some(fd) = query_fd()
        && fd >= 0
    {
        let mut at = lo;
        while at < hi {
            let Some(v) = query(fd, at) else {
                return false;
            };
            if v.start > at || v.end <= at || !f(&v) {
                return false;
            }
            at = v.end;
        }
        return true;
    }
    maps_file_cover(c"/proc/self/maps", lo, hi, f)
}

/// `maps_cover` over the file at `path`, read as bytes: a mapped file's name may hold any
/// byte (read as UTF-8, one such name failed every read, so the watch never cleared), and
/// only the first five fields, always ASCII, are parsed.
fn maps_file_cover(
    path: &std::ffi::CStr,
    lo: usize,
    hi: usize,
    f: impl FnMut(&Vma) -> bool,
) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()));
    let Ok(maps) = std::fs::read(path) else {
        return false;
    };
    maps_cover(&String::from_utf8_lossy(&maps), lo, hi, f)
}

/// Whether the mappings over `[lo, hi)` in `maps` (`/proc/self/maps`) cover it without a
/// hole and `f` accepts each.
pub(crate) fn maps_cover(
    maps: &str,
    lo: usize,
    hi: usize,
    mut f: impl FnMut(&Vma) -> bool,
) -> bool {
    let mut covered = lo;
    for line in maps.lines() {
        let Some(v) = parse_maps_line(line) else {
            return false;
        };
        if v.end <= lo || v.start >= hi {
            continue;
        }
        if v.start > covered || !f(&v) {
            return false;
        }
        covered = covered.max(v.end);
    }
    covered >= hi
}

pub(super) fn parse_maps_line(line: &str) -> Option<Vma> {
    let mut fields = line.split_ascii_whitespace();
    let (range, perms, offset, dev, inode) = (
        fields.next()?,
        fields.next()?.as_bytes(),
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let (a, b) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    Some(Vma {
        start: usize::from_str_radix(a, 16).ok()?,
        end: usize::from_str_radix(b, 16).ok()?,
        writable: perms.get(1) != Some(&b'-'),
        shared: perms.get(3) != Some(&b'p'),
        dev: u64::from_str_radix(major, 16).ok()? << 32 | u64::from_str_radix(minor, 16).ok()?,
        inode: inode.parse().ok()?,
        offset: u64::from_str_radix(offset, 16).ok()?,
    })
}

/// `struct procmap_query` (linux/fs.h, Linux 6.11).
#[repr(C)]
#[derive(Default)]
pub(super) struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `_IOWR('f', 17, struct procmap_query)`.
pub(super) const PROCMAP_QUERY: u64 =
    3 << 30 | (size_of::<ProcmapQuery>() as u64) << 16 | (b'f' as u64) << 8 | 17;
pub(super) const PROCMAP_QUERY_VMA_WRITABLE: u64 = 0x02;
pub(super) const PROCMAP_QUERY_VMA_SHARED: u64 = 0x08;
pub(super) const PROCMAP_QUERY_COVERING_OR_NEXT_VMA: u64 = 0x10;

static MAPS_FD: AtomicI64 = AtomicI64::new(-2);
static MAPS_PID: AtomicI32 = AtomicI32::new(0);
// The open file's identity: a descriptor number is only ours while it still names it.
static MAPS_DEV: AtomicU64 = AtomicU64::new(0);
static MAPS_INO: AtomicU64 = AtomicU64::new(0);

/// In a fork child, at the fork (our child handler or `_Fork`'s, before the program can
/// reuse the number): close the parent's /proc/self/maps descriptor, inherited. Only
/// atomics, fstat and close: async-signal-safe.
pub(super) fn forget_inherited_maps_fd() {
    let fd = MAPS_FD.swap(-2, Relaxed);
    if fd >= 0 && identity(fd as i32) == Some((MAPS_DEV.load(Relaxed), MAPS_INO.load(Relaxed))) {
        // SAFETY: the number still names the file we opened: our inherited copy.
        unsafe { libc::close(fd as i32) };
    }
}

/// This process's `/proc/self/maps`, opened once for PROCMAP_QUERY (again in a fork child:
/// the file stands for the process that opened it). Some(-1): the kernel has no
/// PROCMAP_QUERY (read the file instead); None: it could not be opened.
pub(super) fn query_fd() -> Option<i32> {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let fd = MAPS_FD.load(Relaxed);
    if fd >= 0 {
        let ours = identity(fd as i32) == Some((MAPS_DEV.load(Relaxed), MAPS_INO.load(Relaxed)));
        if ours && MAPS_PID.load(Relaxed) == pid {
            return Some(fd as i32);
        }
        // Not ours any more: the program closed it (a daemon's close loop), and the
        // number may be one of its own files now; or a child the fork handlers did not
        // see (a raw clone), where even a matching file may be the child's own open of
        // the parent's maps. Never closed here: at worst one close-on-exec descriptor
        // stays open in such a child.
    } else if fd == -1 && MAPS_PID.load(Relaxed) == pid {
        return Some(-1);
    }
    // SAFETY: a constant NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // Any refusal of the probe (there is always a mapping to find) means the file is read
    // instead: ENOTTY or EINVAL from a kernel before 6.11, ENOSYS from qemu-user, which
    // passes no ioctl it does not know (before, only ENOTTY and EINVAL counted: under
    // qemu-user every later query failed and the watch never cleared), EPERM or another
    // errno from a seccomp filter.
    let probe = query(fd, 0);
    let id = identity(fd);
    let fd = if probe.is_none() || id.is_none() {
        // SAFETY: the descriptor just opened.
        unsafe { libc::close(fd) };
        -1
    } else {
        fd
    };
    let (dev, ino) = id.unwrap_or((0, 0));
    MAPS_DEV.store(dev, Relaxed);
    MAPS_INO.store(ino, Relaxed);
    MAPS_PID.store(pid, Relaxed);
    MAPS_FD.store(fd as i64, Relaxed);
    Some(fd)
}

/// The (device, inode) a descriptor names, or None if it is not open.
fn identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer; a closed number only makes fstat fail.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// The mapping covering `at`, or the next one after it (PROCMAP_QUERY on `fd`).
pub(super) fn query(fd: i32, at: usize) -> Option<Vma> {
    let mut q = ProcmapQuery {
        size: size_of::<ProcmapQuery>() as u64,
        query_flags: PROCMAP_QUERY_COVERING_OR_NEXT_VMA,
        query_addr: at as u64,
        ..Default::default()
    };
    crate::sys::set_errno(0);
    // SAFETY: PROCMAP_QUERY reads and writes one `struct procmap_query` of the size given,
    // with no name or build-id buffer (both sizes 0).
    if unsafe { libc::ioctl(fd, PROCMAP_QUERY as _, &mut q as *mut ProcmapQuery) } != 0 {
        return None;
    }
    Some(Vma {
        start: q.vma_start as usize,
        end: q.vma_end as usize,
        writable: q.vma_flags & PROCMAP_QUERY_VMA_WRITABLE != 0,
        shared: q.vma_flags & PROCMAP_QUERY_VMA_SHARED != 0,
        dev: (q.dev_major as u64) << 32 | q.dev_minor as u64,
        inode: q.inode,
        offset: q.vma_offset,
    })
}

/// Whether `[lo, hi)` is covered, in `maps`, by mappings none of which is writable.
#[cfg(test)]
pub(super) fn range_read_only(maps: &str, lo: usize, hi: usize) -> bool {
    maps_cover(maps, lo, hi, |v| !v.writable)
}

#[cfg(test)]
#[test]
pub(super) fn read_only_needs_every_page_mapped_and_none_writable() {
    let maps = "1000-3000 r-xp 00000000 08:01 1 /lib/libc.so.6\n\
                3000-4000 r--p 00000000 08:01 1 /lib/libc.so.6\n\
                5000-6000 rwxp 00000000 00:00 0\n";
    assert!(range_read_only(maps, 0x1000, 0x4000));
    assert!(range_read_only(maps, 0x2000, 0x3000));
    // A hole (4000-5000 unmapped) or a writable page is not read-only.
    assert!(!range_read_only(maps, 0x3000, 0x5000));
    assert!(!range_read_only(maps, 0x5000, 0x6000));
    assert!(!range_read_only(maps, 0x1000, 0x6000));
    assert!(!range_read_only("", 0x1000, 0x2000));
}

#[cfg(test)]
#[test]
pub(super) fn maps_lines_give_the_mapping_identity() {
    let maps = "1000-3000 r-xp 00001000 08:01 77 /lib/libc.so.6\n\
                3000-4000 r-xp 00003000 08:01 77 /lib/libc.so.6\n\
                4000-5000 r-xs 00000000 00:01 9 /memfd:libc-page (deleted)\n\
                5000-6000 r-xp 00000000 00:00 0\n";
    let mut seen = Vec::new();
    assert!(maps_cover(maps, 0x1000, 0x6000, |v| {
        seen.push(*v);
        true
    }));
    // Split mappings of one file at the same place have one identity; a memfd view or an
    // anonymous copy at the same address has another, and a shared one says so.
    assert_eq!(seen[0].identity(), seen[1].identity());
    assert_eq!(seen[0].identity(), [8 << 32 | 1, 77, 0]);
    assert!(seen[2].shared && !seen[0].shared && !seen[2].writable);
    assert_ne!(seen[2].identity(), seen[0].identity());
    assert_eq!(seen[3].inode, 0);
    assert!(!maps_cover("zz-1 r-xp", 0x1000, 0x2000, |_| true));
}

#[cfg(test)]
#[test]
pub(super) fn a_mapping_name_that_is_not_utf8_is_read() {
    let path = std::env::temp_dir().join(format!("mrcache-maps-{}", std::process::id()));
    std::fs::write(
        &path,
        b"1000-3000 r-xp 00000000 08:01 1 /lib/libc.so.6\n\
          3000-4000 r--p 00000000 08:01 2 /tmp/data-\xff\xfe\n",
    )
    .unwrap();
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let covered = maps_file_cover(&c, 0x1000, 0x4000, |v| !v.writable);
    std::fs::remove_file(&path).unwrap();
    assert!(
        covered,
        "a name of bytes that are not UTF-8 made the read fail"
    );
}
