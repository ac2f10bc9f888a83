//! Host-side stale-registration checks with a registrar that pins pages the way an HCA
//! does: io_uring fixed buffers (IORING_REGISTER_BUFFERS pins with FOLL_LONGTERM). A
//! READ_FIXED from a file into a registered buffer goes to the pinned pages, so data that
//! does not show up at the buffer's address proves the registration is stale.
//!
//! For each way memory goes away, the cache is told exactly as the preload's hooks tell it
//! (invalidate_begin before the change, invalidate_end after), and the next registration
//! must reach the new pages. The same scenario without the invalidation is the negative
//! control: the cache then hands back the old registration and the data must NOT arrive,
//! which proves the check can fail. As root, /proc/self/pagemap confirms the frames.
//!
//! A test target of its own (not a module of tests/cache/): each scenario unmaps an
//! address and maps it again, which another test's mmap on a parallel thread could take.

use io_uring::{IoUring, opcode, types};
use mrcache::access::LOCAL_WRITE;
use mrcache::cache::{Cache, Limits, Mr, Outcome, Registrar, Request};
use std::collections::HashMap;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::Mutex;

const LEN: usize = 1 << 20;

/// One io_uring instance with one fixed buffer per registration.
struct IoUringHca {
    rings: Mutex<HashMap<usize, (IoUring, usize, usize)>>,
    next: Mutex<usize>,
}

impl Registrar for &IoUringHca {
    fn register(&self, req: &Request) -> Result<Mr, i32> {
        let ring = IoUring::new(4).map_err(|e| e.raw_os_error().unwrap_or(5))?;
        let iov = libc::iovec {
            iov_base: req.addr as *mut _,
            iov_len: req.len,
        };
        // SAFETY: the iovec describes mapped memory the test owns.
        unsafe { ring.submitter().register_buffers(&[iov]) }
            .map_err(|e| e.raw_os_error().unwrap_or(5))?;
        let mut n = self.next.lock().unwrap();
        *n += 1;
        let ptr = *n * 64;
        self.rings
            .lock()
            .unwrap()
            .insert(ptr, (ring, req.addr, req.len));
        Ok(Mr {
            ptr,
            via_wrapper: false,
        })
    }
    fn deregister(&self, mr: Mr) -> Result<(), i32> {
        self.rings
            .lock()
            .unwrap()
            .remove(&mr.ptr)
            .map(|_| ())
            .ok_or(22)
    }
    fn alloc_shadow(&self) -> Option<usize> {
        None
    }
    fn fill_shadow(&self, _: usize, _: Mr, _: usize, _: usize) -> bool {
        false
    }
}

impl IoUringHca {
    /// READ_FIXED `LEN` bytes of `file` into the registration's buffer, as a NIC's DMA would.
    fn dma_from(&self, mr: usize, file: &std::fs::File) {
        let mut rings = self.rings.lock().unwrap();
        let (ring, addr, len) = rings.get_mut(&mr).expect("live registration");
        let read = opcode::ReadFixed::new(
            types::Fd(file.as_raw_fd()),
            *addr as *mut u8,
            *len as u32,
            0,
        )
        .offset(0)
        .build();
        // SAFETY: the buffer is registered and stays so until the completion is reaped.
        unsafe { ring.submission().push(&read).expect("queue") };
        ring.submit_and_wait(1).expect("submit");
        let cqe = ring.completion().next().expect("completion");
        assert_eq!(cqe.result(), *len as i32, "READ_FIXED failed");
    }
}

fn map(at: usize) -> usize {
    let flags = libc::MAP_PRIVATE
        | libc::MAP_ANONYMOUS
        | if at != 0 {
            libc::MAP_FIXED_NOREPLACE
        } else {
            0
        };
    // SAFETY: a fresh anonymous mapping (at an address we just unmapped, if given).
    let p = unsafe {
        libc::mmap(
            at as *mut _,
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    assert!(
        at == 0 || p as usize == at,
        "could not map again at {at:#x}"
    );
    // SAFETY: just mapped, LEN bytes.
    unsafe { std::ptr::write_bytes(p as *mut u8, 0x11, LEN) };
    p as usize
}

fn frame(addr: usize) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 8];
    let f = std::fs::File::open("/proc/self/pagemap").unwrap();
    f.read_exact_at(&mut b, (addr / 4096 * 8) as u64).unwrap();
    u64::from_le_bytes(b) & ((1 << 55) - 1)
}

/// The ways memory goes away; each leaves new pages at `p`. Returns the changed range.
fn change(kind: &str, p: usize) -> (usize, usize) {
    // SAFETY (all arms): operations on the test's own mapping at p, LEN bytes.
    unsafe {
        match kind {
            "munmap" => {
                libc::munmap(p as *mut _, LEN);
                map(p);
            }
            "madvise" => {
                libc::madvise(p as *mut _, LEN, libc::MADV_DONTNEED);
                std::ptr::write_bytes(p as *mut u8, 0x22, LEN);
            }
            "map_fixed" => {
                let q = libc::mmap(
                    p as *mut _,
                    LEN,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                );
                assert_eq!(q as usize, p);
                std::ptr::write_bytes(p as *mut u8, 0x22, LEN);
            }
            "mremap" => {
                let away = map(0);
                let q = libc::mremap(
                    p as *mut _,
                    LEN,
                    LEN,
                    libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                    away as *mut libc::c_void,
                );
                assert_eq!(q as usize, away);
                map(p);
            }
            _ => unreachable!(),
        }
    }
    (p, p + LEN)
}

/// Register, release, change the memory (telling the cache or not), register again, DMA.
/// Returns whether the data reached the pages now at the address.
fn scenario(kind: &str, tell_the_cache: bool) -> bool {
    // One scenario at a time: each unmaps an address and maps it again, and a parallel
    // test's mmap could take that address in between.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut file = tempfile();
    file.write_all(&vec![0x5a; LEN]).unwrap();
    let hca = IoUringHca {
        rings: Mutex::new(HashMap::new()),
        next: Mutex::new(0),
    };
    let cache = Cache::new(
        &hca,
        Limits {
            max_entries: 8,
            max_bytes: 1 << 30,
            shadow: false,
            remote_superset: false,
        },
    );
    let p = map(0);
    let req = Request {
        pd: 1,
        context: 1,
        addr: p,
        len: LEN,
        iova: p as u64,
        access: LOCAL_WRITE,
    };
    let (h, _) = cache.acquire(&req).unwrap();
    let old_frame = frame(p);
    cache.release(h);
    if tell_the_cache {
        cache.invalidate_begin(p, p + LEN);
        change(kind, p);
        cache.invalidate_end();
    } else {
        change(kind, p);
    }
    let (h, outcome) = cache.acquire(&req).unwrap();
    assert_eq!(outcome == Outcome::Hit, !tell_the_cache);
    hca.dma_from(h, &file);
    // SAFETY: p is mapped, LEN bytes.
    let arrived = unsafe { std::slice::from_raw_parts(p as *const u8, LEN) }
        .iter()
        .all(|&b| b == 0x5a);
    let new_frame = frame(p);
    if old_frame != 0 {
        // Root: pagemap shows frames. The address is backed by new pages in every scenario.
        assert_ne!(
            old_frame, new_frame,
            "{kind}: the change did not replace the pages"
        );
    }
    cache.release(h);
    cache.flush_all();
    // SAFETY: our mapping.
    unsafe { libc::munmap(p as *mut _, LEN) };
    arrived
}

fn tempfile() -> std::fs::File {
    let path = std::env::temp_dir().join(format!(
        "mrcache-iouring-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let _ = std::fs::remove_file(&path);
    f
}

fn io_uring_available() -> bool {
    match IoUring::new(2) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("io_uring unavailable here ({e}); the host-side pinning checks need it");
            false
        }
    }
}

#[test]
fn invalidated_ranges_reach_the_new_pages() {
    assert!(
        io_uring_available(),
        "io_uring is required (kernel.io_uring_disabled=0)"
    );
    for kind in ["munmap", "madvise", "map_fixed", "mremap"] {
        assert!(
            scenario(kind, true),
            "{kind}: the registration after the change did not reach the new pages"
        );
    }
}

#[test]
fn without_invalidation_the_stale_registration_is_detected() {
    assert!(
        io_uring_available(),
        "io_uring is required (kernel.io_uring_disabled=0)"
    );
    for kind in ["munmap", "madvise", "map_fixed", "mremap"] {
        assert!(
            !scenario(kind, false),
            "{kind}: a stale registration went unnoticed: the check cannot fail"
        );
    }
}
