//! The verbs calls of `mrcache bench`, through function pointers taken from one of two
//! copies of libibverbs in this process:
//!
//! - [`Copy::Global`]: the process's own libibverbs (global link-map namespace). With
//!   libmrcache.so preloaded, `dlvsym` of `ibv_reg_mr`/`ibv_dereg_mr` on its handle answers
//!   with the cache's hooks (as for NCCL): registrations through the cache.
//! - [`Copy::Alone`]: the same file loaded with `dlmopen(LM_ID_NEWLM)` into a link-map
//!   namespace of its own, with its own libc and provider. No preload reaches a new
//!   namespace and nothing in it binds to libmrcache.so: libibverbs alone, all of it (its
//!   `ibv_reg_mr` -> `ibv_reg_mr_iova2` with the fork bookkeeping `RDMAV_FORK_SAFE` turns on,
//!   the provider's `reg_mr`, `ibv_dereg_mr` -> `ibv_dofork_range`).
//!
//! Only the calls the bench needs, with `struct` fields read at their offsets in verbs.h
//! (rdma-core's ABI, stable since IBVERBS_1.1; the host test `offsets_match_verbs_h` checks them).

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::ptr::NonNull;

/// `struct ibv_device_attr` (232 bytes in verbs.h; read as bytes, larger).
const DEVICE_ATTR_BYTES: usize = 512;
pub const DEV_FW_VER: usize = 0;
pub const DEV_VENDOR_ID: usize = 96;
pub const DEV_VENDOR_PART_ID: usize = 100;
pub const DEV_HW_VER: usize = 104;
pub const DEV_MAX_MW: usize = 176;
pub const DEV_PHYS_PORT_CNT: usize = 227;
/// `struct ibv_port_attr` (52 bytes; read as bytes, larger): `state` is its first field.
const PORT_ATTR_BYTES: usize = 256;
pub const PORT_STATE: usize = 0;
const IBV_PORT_ACTIVE: u32 = 4;
/// `struct ibv_context`: `ops.poll_cq`, a provider function.
pub const CTX_POLL_CQ: usize = 96;
/// `struct ibv_mr`: `lkey`.
pub const MR_LKEY: usize = 36;

/// Which copy of libibverbs (module documentation).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Copy {
    Global,
    Alone,
}

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type CloseDevice = unsafe extern "C" fn(*mut c_void) -> c_int;
type QueryDevice = unsafe extern "C" fn(*mut c_void, *mut u8) -> c_int;
type QueryPort = unsafe extern "C" fn(*mut c_void, u8, *mut u8) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type DeallocPd = unsafe extern "C" fn(*mut c_void) -> c_int;
type RegMr = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut c_void;
type DeregMr = unsafe extern "C" fn(*mut c_void) -> c_int;

/// One copy of libibverbs and the functions the bench calls.
pub struct Verbs {
    get_device_list: GetDeviceList,
    free_device_list: FreeDeviceList,
    get_device_name: GetDeviceName,
    open_device: OpenDevice,
    close_device: CloseDevice,
    query_device: QueryDevice,
    query_port: QueryPort,
    alloc_pd: AllocPd,
    dealloc_pd: DeallocPd,
    reg_mr: RegMr,
    dereg_mr: DeregMr,
    /// The copy's handle (dlopen or dlmopen; never closed).
    pub(super) handle: *mut c_void,
    /// The objects `reg_mr` and `dereg_mr` are defined in (dladdr).
    pub reg_from: String,
    pub dereg_from: String,
}

fn last_dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// The path of the object holding `p` (dladdr), or "?".
pub fn object_of(p: *const c_void) -> String {
    // SAFETY: dladdr only reads the loader's tables and writes `info` on success.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::dladdr(p, &mut info) } == 0 || info.dli_fname.is_null() {
        return "?".into();
    }
    // SAFETY: dli_fname is the object's NUL-terminated path.
    unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned()
}

impl Verbs {
    pub fn open(copy: Copy) -> Result<Verbs, String> {
        let name = c"libibverbs.so.1";
        // SAFETY: dlopen/dlmopen with a valid name; the handle is never closed (the
        // functions below are used until the process exits).
        let h = unsafe {
            match copy {
                Copy::Global => libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL),
                Copy::Alone => libc::dlmopen(
                    libc::LM_ID_NEWLM,
                    name.as_ptr(),
                    libc::RTLD_NOW | libc::RTLD_LOCAL,
                ),
            }
        };
        if h.is_null() {
            return Err(match copy {
                Copy::Global => format!(
                    "libibverbs.so.1 not found ({}); install libibverbs1 and the provider of your device (ibverbs-providers)",
                    last_dlerror()
                ),
                Copy::Alone => format!(
                    "cannot load libibverbs.so.1 in a link-map namespace of its own (dlmopen: {})",
                    last_dlerror()
                ),
            });
        }
        let sym = |n: &str, v: &str| -> Result<*mut c_void, String> {
            let (cn, cv) = (
                CString::new(n).unwrap_or_default(),
                CString::new(v).unwrap_or_default(),
            );
            // SAFETY: dlvsym on a live handle.
            let p = unsafe { libc::dlvsym(h, cn.as_ptr(), cv.as_ptr()) };
            if p.is_null() {
                Err(format!("libibverbs.so.1 lacks {n}@{v}"))
            } else {
                Ok(p)
            }
        };
        let v11 = "IBVERBS_1.1";
        let reg = sym("ibv_reg_mr", v11)?;
        let dereg = sym("ibv_dereg_mr", v11)?;
        // SAFETY: each transmute gives the IBVERBS_1.1 prototype of the symbol (verbs.h; the
        // attribute structs are byte buffers larger than verbs.h's).
        unsafe {
            Ok(Verbs {
                get_device_list: std::mem::transmute::<*mut c_void, GetDeviceList>(sym(
                    "ibv_get_device_list",
                    v11,
                )?),
                free_device_list: std::mem::transmute::<*mut c_void, FreeDeviceList>(sym(
                    "ibv_free_device_list",
                    v11,
                )?),
                get_device_name: std::mem::transmute::<*mut c_void, GetDeviceName>(sym(
                    "ibv_get_device_name",
                    v11,
                )?),
                open_device: std::mem::transmute::<*mut c_void, OpenDevice>(sym(
                    "ibv_open_device",
                    v11,
                )?),
                close_device: std::mem::transmute::<*mut c_void, CloseDevice>(sym(
                    "ibv_close_device",
                    v11,
                )?),
                query_device: std::mem::transmute::<*mut c_void, QueryDevice>(sym(
                    "ibv_query_device",
                    v11,
                )?),
                query_port: std::mem::transmute::<*mut c_void, QueryPort>(sym(
                    "ibv_query_port",
                    v11,
                )?),
                alloc_pd: std::mem::transmute::<*mut c_void, AllocPd>(sym("ibv_alloc_pd", v11)?),
                dealloc_pd: std::mem::transmute::<*mut c_void, DeallocPd>(sym(
                    "ibv_dealloc_pd",
                    v11,
                )?),
                reg_mr: std::mem::transmute::<*mut c_void, RegMr>(reg),
                dereg_mr: std::mem::transmute::<*mut c_void, DeregMr>(dereg),
                handle: h,
                reg_from: object_of(reg),
                dereg_from: object_of(dereg),
            })
        }
    }

    /// Calls `f(device, name)` for each device until it returns Some; also returns every name.
    fn with_devices<T>(
        &self,
        mut f: impl FnMut(*mut c_void, &str) -> Option<T>,
    ) -> (Option<T>, Vec<String>) {
        let mut n: c_int = 0;
        // SAFETY: ibv_get_device_list(int *); the list is freed below.
        let list = unsafe { (self.get_device_list)(&mut n) };
        if list.is_null() {
            return (None, Vec::new());
        }
        let mut names = Vec::new();
        let mut found = None;
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds n device pointers.
            let dev = unsafe { *list.add(i) };
            if dev.is_null() {
                break;
            }
            // SAFETY: ibv_get_device_name of a listed device: a NUL-terminated string.
            let name = unsafe {
                let p = (self.get_device_name)(dev);
                if p.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            };
            if found.is_none() {
                found = f(dev, &name);
            }
            names.push(name);
        }
        // SAFETY: the list from ibv_get_device_list; opened contexts outlive it (verbs.h).
        unsafe { (self.free_device_list)(list) };
        (found, names)
    }

    /// Open the device `want` (or the first with an active port).
    pub fn open_device(&self, want: Option<&str>) -> Result<Context<'_>, String> {
        let mut why_not = Vec::new();
        let (ctx, names) = self.with_devices(|dev, name| {
            if want.is_some_and(|w| w != name) {
                return None;
            }
            // SAFETY: ibv_open_device of a listed device.
            let ctx = NonNull::new(unsafe { (self.open_device)(dev) });
            let Some(ctx) = ctx else {
                why_not.push(format!(
                    "{name}: ibv_open_device failed ({})",
                    std::io::Error::last_os_error()
                ));
                return None;
            };
            let c = Context {
                verbs: self,
                ctx,
                name: name.to_string(),
            };
            match c.active_port() {
                Some(_) => Some(c),
                None => {
                    why_not.push(format!("{name}: no port is ACTIVE"));
                    None
                }
            }
        });
        match ctx {
            Some(c) => Ok(c),
            None if names.is_empty() => Err(
                "no RDMA device found (ibv_get_device_list found none; is the driver loaded, is /dev/infiniband there?)".into(),
            ),
            None if want.is_some() && !names.iter().any(|n| Some(n.as_str()) == want) => Err(format!(
                "no RDMA device named '{}'; found: {}",
                want.unwrap_or_default(),
                names.join(", ")
            )),
            None => Err(format!("no usable RDMA device: {}", why_not.join("; "))),
        }
    }
}

/// An open device context (closed on drop).
pub struct Context<'a> {
    verbs: &'a Verbs,
    pub(super) ctx: NonNull<c_void>,
    pub name: String,
}

/// What `ibv_query_device` says, as `ibv_devinfo` prints it.
pub struct DeviceInfo {
    pub fw_ver: String,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_mw: i32,
    pub ports: u8,
}

impl<'a> Context<'a> {
    fn device_attr(&self) -> Option<[u8; DEVICE_ATTR_BYTES]> {
        let mut a = [0u8; DEVICE_ATTR_BYTES];
        // SAFETY: ibv_query_device(ctx, struct ibv_device_attr *): the buffer is larger.
        (unsafe { (self.verbs.query_device)(self.ctx.as_ptr(), a.as_mut_ptr()) } == 0).then_some(a)
    }

    pub fn info(&self) -> Option<DeviceInfo> {
        let a = self.device_attr()?;
        let u32_at = |o: usize| u32::from_ne_bytes(a[o..o + 4].try_into().unwrap_or([0; 4]));
        let fw = &a[DEV_FW_VER..DEV_FW_VER + 64];
        let fw_len = fw.iter().position(|&b| b == 0).unwrap_or(64);
        Some(DeviceInfo {
            fw_ver: String::from_utf8_lossy(&fw[..fw_len]).into_owned(),
            vendor_id: u32_at(DEV_VENDOR_ID),
            vendor_part_id: u32_at(DEV_VENDOR_PART_ID),
            hw_ver: u32_at(DEV_HW_VER),
            max_mw: super::max_mw_seen(u32_at(DEV_MAX_MW) as i32),
            ports: a[DEV_PHYS_PORT_CNT],
        })
    }

    /// The provider library (its file name), where the context's `poll_cq` is defined.
    pub fn provider(&self) -> String {
        // SAFETY: an open struct ibv_context; ops.poll_cq is a function pointer at CTX_POLL_CQ.
        let f = unsafe {
            self.ctx
                .as_ptr()
                .cast::<u8>()
                .add(CTX_POLL_CQ)
                .cast::<*const c_void>()
                .read_unaligned()
        };
        let path = object_of(f);
        path.rsplit('/').next().unwrap_or(&path).to_string()
    }

    /// The first port whose state is ACTIVE.
    pub(super) fn active_port(&self) -> Option<u8> {
        let ports = self.info()?.ports;
        (1..=ports).find(|&p| {
            let mut a = [0u8; PORT_ATTR_BYTES];
            // SAFETY: ibv_query_port@IBVERBS_1.1(ctx, port, struct ibv_port_attr *): larger buffer.
            let rc = unsafe { (self.verbs.query_port)(self.ctx.as_ptr(), p, a.as_mut_ptr()) };
            rc == 0
                && u32::from_ne_bytes(a[PORT_STATE..PORT_STATE + 4].try_into().unwrap_or([0; 4]))
                    == IBV_PORT_ACTIVE
        })
    }

    pub fn alloc_pd(&self) -> Result<Pd<'_>, String> {
        // SAFETY: ibv_alloc_pd on an open context.
        NonNull::new(unsafe { (self.verbs.alloc_pd)(self.ctx.as_ptr()) })
            .map(|pd| Pd {
                verbs: self.verbs,
                pd,
            })
            .ok_or_else(|| {
                format!(
                    "{}: ibv_alloc_pd failed ({})",
                    self.name,
                    std::io::Error::last_os_error()
                )
            })
    }
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: the context we opened; its PDs (which borrow it) are gone.
        unsafe { (self.verbs.close_device)(self.ctx.as_ptr()) };
    }
}

/// A protection domain (deallocated on drop).
pub struct Pd<'a> {
    verbs: &'a Verbs,
    pub(super) pd: NonNull<c_void>,
}

/// A registration: the `struct ibv_mr *` and its lkey.
#[derive(Clone, Copy)]
pub struct Mr {
    pub(super) ptr: NonNull<c_void>,
    pub lkey: u32,
}

impl Pd<'_> {
    /// `ibv_reg_mr` of `[addr, addr+len)`: the caller keeps the range mapped until the
    /// matching [`Pd::dereg`].
    pub fn reg(&self, addr: *mut u8, len: usize, access: u32) -> Result<Mr, String> {
        // SAFETY: ibv_reg_mr@IBVERBS_1.1 on our PD, over memory the caller keeps mapped.
        let p = unsafe { (self.verbs.reg_mr)(self.pd.as_ptr(), addr.cast(), len, access as c_int) };
        let ptr = NonNull::new(p).ok_or_else(|| {
            format!(
                "ibv_reg_mr of {len} bytes failed ({})",
                std::io::Error::last_os_error()
            )
        })?;
        // SAFETY: a live struct ibv_mr; lkey is a u32 at MR_LKEY.
        let lkey = unsafe {
            ptr.as_ptr()
                .cast::<u8>()
                .add(MR_LKEY)
                .cast::<u32>()
                .read_unaligned()
        };
        Ok(Mr { ptr, lkey })
    }

    /// `ibv_dereg_mr` of an MR from [`Pd::reg`] of this PD, once.
    pub fn dereg(&self, mr: Mr) -> Result<(), String> {
        // SAFETY: an MR this PD's reg returned, deregistered once (Mr is consumed by value
        // and the callers never reuse it).
        let rc = unsafe { (self.verbs.dereg_mr)(mr.ptr.as_ptr()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(format!(
                "ibv_dereg_mr failed ({})",
                std::io::Error::from_raw_os_error(rc)
            ))
        }
    }
}

impl Drop for Pd<'_> {
    fn drop(&mut self) {
        // SAFETY: the PD we allocated; its MRs were deregistered (a cached one is flushed by
        // the cache's ibv_dealloc_pd hook first).
        unsafe { (self.verbs.dealloc_pd)(self.pd.as_ptr()) };
    }
}

/// An anonymous private mapping, its pages populated (MAP_POPULATE: written, each a page
/// of its own, as memory the program touched; unmapped on drop).
pub struct Buffer {
    pub addr: *mut u8,
    pub len: usize,
}

impl Buffer {
    pub fn new(len: usize) -> Result<Buffer, String> {
        // SAFETY: a fresh anonymous mapping; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "cannot map {len} bytes ({})",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Buffer {
            addr: p.cast(),
            len,
        })
    }

    /// The address `offset` bytes in (within the mapping).
    pub fn at(&self, offset: usize) -> *mut u8 {
        self.addr.wrapping_add(offset.min(self.len))
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: our own mapping; registrations of it were released before (the cache
        // drops its entries over it on this unmap).
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}

/// `len` populated bytes that move between the two halves of a reservation of `2 * len`
/// with `mremap`: the pages stay (registered before, so no first pin), the address changes,
/// and the cache's mremap hook invalidates what it held at the old one. The half left
/// behind is reserved again (`PROT_NONE`) so nothing else is mapped where the pages return.
pub struct Mover {
    base: *mut u8,
    len: usize,
    upper: bool,
}

impl Mover {
    pub fn new(len: usize) -> Result<Mover, String> {
        // SAFETY: a fresh reservation; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!(
                "cannot reserve {} bytes ({})",
                2 * len,
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: the lower half of our own reservation, replaced by populated memory.
        let p = unsafe {
            libc::mmap(
                base,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        let m = Mover {
            base: base.cast(),
            len,
            upper: false,
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "cannot map {len} bytes ({})",
                std::io::Error::last_os_error()
            ));
        }
        Ok(m)
    }

    /// Where the pages are now.
    pub fn addr(&self) -> *mut u8 {
        if self.upper {
            self.base.wrapping_add(self.len)
        } else {
            self.base
        }
    }

    /// Move the pages to the other half.
    pub fn flip(&mut self) -> Result<(), String> {
        let (from, to) = (
            self.addr(),
            if self.upper {
                self.base
            } else {
                self.base.wrapping_add(self.len)
            },
        );
        // SAFETY: both halves are ours: the pages move onto the other half's reservation.
        let p = unsafe {
            libc::mremap(
                from.cast(),
                self.len,
                self.len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                to.cast::<c_void>(),
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "mremap of {} bytes failed ({})",
                self.len,
                std::io::Error::last_os_error()
            ));
        }
        self.upper = !self.upper;
        // SAFETY: reserve the half just vacated again, only if it is still free.
        let r = unsafe {
            libc::mmap(
                from.cast(),
                self.len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if r != from.cast() {
            if r != libc::MAP_FAILED {
                // SAFETY: a mapping we just made elsewhere (an old kernel ignoring NOREPLACE).
                unsafe { libc::munmap(r, self.len) };
            }
            return Err(
                "the address range the bench moves its pages back to was taken by another mapping"
                    .into(),
            );
        }
        Ok(())
    }
}

impl Drop for Mover {
    fn drop(&mut self) {
        // SAFETY: our reservation (both halves); the registrations of it were released.
        unsafe { libc::munmap(self.base.cast(), 2 * self.len) };
    }
}

#[cfg(test)]
pub(crate) mod tests;
