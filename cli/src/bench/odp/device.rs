//! What the on-demand rows of `mrcache bench` ask of the device beyond registrations: its
//! on-demand paging capabilities, and a loopback RC queue pair (connected to itself through
//! the port's GID) whose RDMA WRITEs are the device's first touch of a registration.
//!
//! Through the libibverbs copy the rows measure with (`verbs::Verbs`): its IBVERBS_1.1
//! functions by `dlvsym`, and the inline ones (`ibv_query_device_ex`, `ibv_post_send`,
//! `ibv_poll_cq`) as verbs.h defines them, through the context's ops. `struct` fields are
//! read and written at their offsets in verbs.h (x86-64 and aarch64 alike; the host test
//! `loopback_offsets_match_verbs_h` checks them).

use super::super::verbs::{Context, Mr, Pd, Verbs};
use std::ffi::{CString, c_int, c_void};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// `struct verbs_context`, which ends with an extended `struct ibv_context`: how many bytes
/// before the context its `query_device_ex` op and its `sz` sit.
pub const VCTX_QUERY_DEVICE_EX_BACK: usize = 104;
pub const VCTX_SZ_BACK: usize = 8;
/// `struct ibv_context`: `abi_compat` (all ones in an extended context), `ops.post_send`.
pub const CTX_ABI_COMPAT: usize = 320;
pub const CTX_POST_SEND: usize = 208;
/// `struct ibv_device_attr_ex`: its size, `odp_caps.general_caps` and
/// `odp_caps.per_transport_caps.rc_odp_caps`.
pub const ATTR_EX_BYTES: usize = 400;
pub const ATTR_EX_ODP: usize = 240;
pub const ATTR_EX_ODP_RC: usize = 248;
const IBV_ODP_SUPPORT: u64 = 1;
/// `rc_odp_caps` bits: send, receive, write, read (`IBV_ODP_SUPPORT_SEND` ... `_READ`).
pub const RC_SEND_RECV_WRITE_READ: u32 = 0b1111;
/// `IBV_ACCESS_ON_DEMAND`.
pub const ACCESS_ON_DEMAND: u32 = 1 << 6;
/// `IBV_ACCESS_REMOTE_WRITE`, which the written registrations grant.
pub const ACCESS_REMOTE_WRITE: u32 = 1 << 1;

/// `struct ibv_port_attr`: `active_mtu`, `gid_tbl_len`.
pub const PORT_ACTIVE_MTU: usize = 8;
pub const PORT_GID_TBL_LEN: usize = 12;
/// `struct ibv_qp_init_attr` (64 bytes).
pub const QP_INIT_BYTES: usize = 64;
pub const QP_INIT_SEND_CQ: usize = 8;
pub const QP_INIT_RECV_CQ: usize = 16;
pub const QP_INIT_CAP: usize = 32;
pub const QP_INIT_QP_TYPE: usize = 52;
/// `struct ibv_qp`: `qp_num`.
pub const QP_NUM: usize = 52;
/// `struct ibv_qp_attr` (144 bytes) and the fields the connection sets.
pub const QP_ATTR_BYTES: usize = 144;
pub const QPA_STATE: usize = 0;
pub const QPA_PATH_MTU: usize = 8;
pub const QPA_RQ_PSN: usize = 20;
pub const QPA_SQ_PSN: usize = 24;
pub const QPA_DEST_QP_NUM: usize = 28;
pub const QPA_ACCESS_FLAGS: usize = 32;
pub const QPA_DGID: usize = 56;
pub const QPA_SGID_INDEX: usize = 76;
pub const QPA_HOP_LIMIT: usize = 77;
pub const QPA_IS_GLOBAL: usize = 85;
pub const QPA_AH_PORT: usize = 86;
pub const QPA_PKEY_INDEX: usize = 120;
pub const QPA_MAX_RD_ATOMIC: usize = 126;
pub const QPA_MAX_DEST_RD_ATOMIC: usize = 127;
pub const QPA_MIN_RNR_TIMER: usize = 128;
pub const QPA_PORT: usize = 129;
pub const QPA_TIMEOUT: usize = 130;
pub const QPA_RETRY_CNT: usize = 131;
pub const QPA_RNR_RETRY: usize = 132;
/// `struct ibv_send_wr` (128 bytes), `struct ibv_sge` (16), `struct ibv_wc` (48).
pub const SEND_WR_BYTES: usize = 128;
pub const WR_SG_LIST: usize = 16;
pub const WR_NUM_SGE: usize = 24;
pub const WR_OPCODE: usize = 28;
pub const WR_SEND_FLAGS: usize = 32;
pub const WR_REMOTE_ADDR: usize = 40;
pub const WR_RKEY: usize = 48;
pub const WC_BYTES: usize = 48;
pub const WC_STATUS: usize = 8;
/// `struct ibv_mr`: `rkey`.
pub const MR_RKEY: usize = 40;

const QPS_INIT: u32 = 1;
const QPS_RTR: u32 = 2;
const QPS_RTS: u32 = 3;
const QPT_RC: u32 = 2;
const WR_RDMA_WRITE: u32 = 0;
const SEND_SIGNALED: u32 = 2;
const QP_STATE: c_int = 1;
const QP_ACCESS_FLAGS: c_int = 1 << 3;
const QP_PKEY_INDEX: c_int = 1 << 4;
const QP_PORT: c_int = 1 << 5;
const QP_AV: c_int = 1 << 7;
const QP_PATH_MTU: c_int = 1 << 8;
const QP_TIMEOUT: c_int = 1 << 9;
const QP_RETRY_CNT: c_int = 1 << 10;
const QP_RNR_RETRY: c_int = 1 << 11;
const QP_RQ_PSN: c_int = 1 << 12;
const QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
const QP_MIN_RNR_TIMER: c_int = 1 << 15;
const QP_SQ_PSN: c_int = 1 << 16;
const QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
const QP_DEST_QPN: c_int = 1 << 20;
/// A completion not seen in this long fails the write (the bench never hangs on a device).
const COMPLETION_WAIT: Duration = Duration::from_secs(30);

type QueryDeviceEx = unsafe extern "C" fn(*mut c_void, *const c_void, *mut u8, usize) -> c_int;
type QueryPort = unsafe extern "C" fn(*mut c_void, u8, *mut u8) -> c_int;
type QueryGid = unsafe extern "C" fn(*mut c_void, u8, c_int, *mut u8) -> c_int;
type CreateCq =
    unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void;
type DestroyCq = unsafe extern "C" fn(*mut c_void) -> c_int;
type CreateQp = unsafe extern "C" fn(*mut c_void, *mut u8) -> *mut c_void;
type ModifyQp = unsafe extern "C" fn(*mut c_void, *mut u8, c_int) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut c_void) -> c_int;
type PostSend = unsafe extern "C" fn(*mut c_void, *mut u8, *mut *mut u8) -> c_int;
type PollCq = unsafe extern "C" fn(*mut c_void, c_int, *mut u8) -> c_int;

/// The device's RC on-demand capabilities (`rc_odp_caps`; 0 when it offers no explicit
/// ODP, `odp_caps.general_caps` without `IBV_ODP_SUPPORT`), or why they could not be read.
pub fn rc_on_demand(ctx: &Context) -> Result<u32, String> {
    let base = ctx.ctx.as_ptr().cast::<u8>();
    // SAFETY: an open `struct ibv_context`; abi_compat is a pointer-sized field of it.
    let compat = unsafe { base.add(CTX_ABI_COMPAT).cast::<usize>().read_unaligned() };
    if compat != usize::MAX {
        return Err("not an extended context (no ibv_query_device_ex)".into());
    }
    // SAFETY: an extended context ends a `struct verbs_context`, whose `sz` (the word right
    // before the context) says how far back its fields reach; the op is read only within.
    let op = unsafe {
        let sz = base.sub(VCTX_SZ_BACK).cast::<usize>().read_unaligned();
        if sz < VCTX_QUERY_DEVICE_EX_BACK + CTX_ABI_COMPAT + 8 {
            return Err("the provider has no query_device_ex".into());
        }
        base.sub(VCTX_QUERY_DEVICE_EX_BACK)
            .cast::<*mut c_void>()
            .read_unaligned()
    };
    if op.is_null() {
        return Err("the provider has no query_device_ex".into());
    }
    let mut attr = [0u64; ATTR_EX_BYTES / 8];
    // SAFETY: the provider's query_device_ex op (verbs.h's prototype), no input, a zeroed
    // 8-byte-aligned buffer of the size passed.
    let rc = unsafe {
        std::mem::transmute::<*mut c_void, QueryDeviceEx>(op)(
            ctx.ctx.as_ptr(),
            std::ptr::null(),
            attr.as_mut_ptr().cast(),
            ATTR_EX_BYTES,
        )
    };
    if rc != 0 {
        return Err(format!(
            "ibv_query_device_ex failed ({})",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    if attr[ATTR_EX_ODP / 8] & IBV_ODP_SUPPORT == 0 {
        return Ok(0);
    }
    Ok((attr[ATTR_EX_ODP_RC / 8] >> ((ATTR_EX_ODP_RC % 8) * 8)) as u32)
}

/// The capability bits as words.
pub fn rc_caps_text(caps: u32) -> String {
    let names = ["send", "receive", "write", "read", "atomic", "SRQ receive"];
    let v: Vec<&str> = (0..names.len())
        .filter(|b| caps & (1 << b) != 0)
        .map(|b| names[b])
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn put<const N: usize>(buf: &mut [u8], at: usize, v: [u8; N]) {
    buf[at..at + N].copy_from_slice(&v);
}

/// A GID of the port to connect the queue pair to itself with: the first IPv4-mapped one
/// (`::ffff:a.b.c.d`, RoCE v2, as the VM suite's loopback uses), else the first non-zero.
pub fn pick_gid(gids: &[(u8, [u8; 16])]) -> Option<(u8, [u8; 16])> {
    let v4 = |g: &[u8; 16]| g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff;
    gids.iter()
        .find(|(_, g)| v4(g))
        .or_else(|| gids.iter().find(|(_, g)| g.iter().any(|&b| b != 0)))
        .copied()
}

/// A completion queue and an RC queue pair connected to itself (destroyed on drop).
pub struct Loopback {
    cq: NonNull<c_void>,
    qp: NonNull<c_void>,
    destroy_cq: DestroyCq,
    destroy_qp: DestroyQp,
    post_send: PostSend,
    poll_cq: PollCq,
}

fn function(verbs: &Verbs, name: &str) -> Result<*mut c_void, String> {
    let cn = CString::new(name).unwrap_or_default();
    // SAFETY: dlvsym on the copy's live handle.
    let p = unsafe { libc::dlvsym(verbs.handle, cn.as_ptr(), c"IBVERBS_1.1".as_ptr()) };
    if p.is_null() {
        Err(format!("libibverbs.so.1 lacks {name}@IBVERBS_1.1"))
    } else {
        Ok(p)
    }
}

fn context_op(ctx: *mut c_void, at: usize) -> *mut c_void {
    // SAFETY: a live `struct ibv_context` (a CQ's or QP's first field points to it); its ops
    // are function pointers at fixed offsets.
    unsafe {
        ctx.cast::<u8>()
            .add(at)
            .cast::<*mut c_void>()
            .read_unaligned()
    }
}

impl Loopback {
    /// On the first active port of `ctx`, with `pd`: a CQ and a QP taken to RTS, its
    /// destination itself.
    pub fn open(verbs: &Verbs, ctx: &Context, pd: &Pd) -> Result<Loopback, String> {
        let err = |what: &str| format!("loopback queue pair on {}: {what}", ctx.name);
        let port = ctx.active_port().ok_or_else(|| err("no port is ACTIVE"))?;
        // SAFETY: each transmute gives the IBVERBS_1.1 prototype of the symbol (verbs.h;
        // the attribute structs are byte buffers as large as verbs.h's or larger).
        let (query_port, query_gid, create_cq, destroy_cq, create_qp, modify_qp, destroy_qp) = unsafe {
            (
                std::mem::transmute::<*mut c_void, QueryPort>(function(verbs, "ibv_query_port")?),
                std::mem::transmute::<*mut c_void, QueryGid>(function(verbs, "ibv_query_gid")?),
                std::mem::transmute::<*mut c_void, CreateCq>(function(verbs, "ibv_create_cq")?),
                std::mem::transmute::<*mut c_void, DestroyCq>(function(verbs, "ibv_destroy_cq")?),
                std::mem::transmute::<*mut c_void, CreateQp>(function(verbs, "ibv_create_qp")?),
                std::mem::transmute::<*mut c_void, ModifyQp>(function(verbs, "ibv_modify_qp")?),
                std::mem::transmute::<*mut c_void, DestroyQp>(function(verbs, "ibv_destroy_qp")?),
            )
        };
        let c = ctx.ctx.as_ptr();
        let mut pa = [0u8; 256];
        // SAFETY: ibv_query_port@IBVERBS_1.1 with a buffer larger than struct ibv_port_attr.
        if unsafe { query_port(c, port, pa.as_mut_ptr()) } != 0 {
            return Err(err("ibv_query_port failed"));
        }
        let mtu = u32::from_ne_bytes(
            pa[PORT_ACTIVE_MTU..PORT_ACTIVE_MTU + 4]
                .try_into()
                .unwrap_or_default(),
        );
        let gid_len = i32::from_ne_bytes(
            pa[PORT_GID_TBL_LEN..PORT_GID_TBL_LEN + 4]
                .try_into()
                .unwrap_or_default(),
        );
        let mut gids = Vec::new();
        for i in 0..gid_len.clamp(0, 256) {
            let mut g = [0u8; 16];
            // SAFETY: ibv_query_gid@IBVERBS_1.1 writes one union ibv_gid (16 bytes).
            if unsafe { query_gid(c, port, i, g.as_mut_ptr()) } == 0 {
                gids.push((i as u8, g));
            }
        }
        let (gid_index, gid) = pick_gid(&gids).ok_or_else(|| err("the port has no GID"))?;
        // SAFETY: ibv_create_cq@IBVERBS_1.1 on an open context, no channel.
        let cq = NonNull::new(unsafe {
            create_cq(c, 16, std::ptr::null_mut(), std::ptr::null_mut(), 0)
        })
        .ok_or_else(|| {
            err(&format!(
                "ibv_create_cq failed ({})",
                std::io::Error::last_os_error()
            ))
        })?;
        let mut init = [0u8; QP_INIT_BYTES];
        put(
            &mut init,
            QP_INIT_SEND_CQ,
            (cq.as_ptr() as usize).to_ne_bytes(),
        );
        put(
            &mut init,
            QP_INIT_RECV_CQ,
            (cq.as_ptr() as usize).to_ne_bytes(),
        );
        // cap: 4 send WRs, 1 receive WR, 1 SGE each, no inline data.
        for (i, v) in [4u32, 1, 1, 1, 0].into_iter().enumerate() {
            put(&mut init, QP_INIT_CAP + 4 * i, v.to_ne_bytes());
        }
        put(&mut init, QP_INIT_QP_TYPE, QPT_RC.to_ne_bytes());
        // SAFETY: ibv_create_qp@IBVERBS_1.1 on our PD, a struct ibv_qp_init_attr.
        let qp = unsafe { create_qp(pd.pd.as_ptr(), init.as_mut_ptr()) };
        let Some(qp) = NonNull::new(qp) else {
            let e = std::io::Error::last_os_error();
            // SAFETY: the CQ just created, unused.
            unsafe { destroy_cq(cq.as_ptr()) };
            return Err(err(&format!("ibv_create_qp failed ({e})")));
        };
        let lb = Loopback {
            cq,
            qp,
            destroy_cq,
            destroy_qp,
            post_send: {
                let f = context_op(context_op(qp.as_ptr(), 0), CTX_POST_SEND);
                // SAFETY: ops.post_send of the QP's context: verbs.h's prototype.
                unsafe { std::mem::transmute::<*mut c_void, PostSend>(f) }
            },
            poll_cq: {
                let f = context_op(context_op(cq.as_ptr(), 0), super::super::verbs::CTX_POLL_CQ);
                // SAFETY: ops.poll_cq of the CQ's context: verbs.h's prototype.
                unsafe { std::mem::transmute::<*mut c_void, PollCq>(f) }
            },
        };
        // SAFETY: qp_num, a u32 of the live struct ibv_qp.
        let qpn = unsafe {
            qp.as_ptr()
                .cast::<u8>()
                .add(QP_NUM)
                .cast::<u32>()
                .read_unaligned()
        };
        let modify = |attr: &mut [u8; QP_ATTR_BYTES], mask: c_int, to: &str| {
            // SAFETY: ibv_modify_qp@IBVERBS_1.1 of our QP with a struct ibv_qp_attr.
            let rc = unsafe { modify_qp(qp.as_ptr(), attr.as_mut_ptr(), mask) };
            if rc == 0 {
                Ok(())
            } else {
                Err(err(&format!(
                    "to {to}: ibv_modify_qp failed ({})",
                    std::io::Error::from_raw_os_error(rc)
                )))
            }
        };
        let mut a = [0u8; QP_ATTR_BYTES];
        put(&mut a, QPA_STATE, QPS_INIT.to_ne_bytes());
        put(
            &mut a,
            QPA_ACCESS_FLAGS,
            (ACCESS_REMOTE_WRITE as c_int).to_ne_bytes(),
        );
        a[QPA_PORT] = port;
        modify(
            &mut a,
            QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS,
            "INIT",
        )?;
        let mut a = [0u8; QP_ATTR_BYTES];
        put(&mut a, QPA_STATE, QPS_RTR.to_ne_bytes());
        put(&mut a, QPA_PATH_MTU, mtu.to_ne_bytes());
        put(&mut a, QPA_DEST_QP_NUM, qpn.to_ne_bytes());
        put(&mut a, QPA_RQ_PSN, 0u32.to_ne_bytes());
        put(&mut a, QPA_DGID, gid);
        a[QPA_SGID_INDEX] = gid_index;
        a[QPA_HOP_LIMIT] = 1;
        a[QPA_IS_GLOBAL] = 1;
        a[QPA_AH_PORT] = port;
        a[QPA_MAX_DEST_RD_ATOMIC] = 1;
        a[QPA_MIN_RNR_TIMER] = 12;
        modify(
            &mut a,
            QP_STATE
                | QP_AV
                | QP_PATH_MTU
                | QP_DEST_QPN
                | QP_RQ_PSN
                | QP_MAX_DEST_RD_ATOMIC
                | QP_MIN_RNR_TIMER,
            "RTR",
        )?;
        let mut a = [0u8; QP_ATTR_BYTES];
        put(&mut a, QPA_STATE, QPS_RTS.to_ne_bytes());
        put(&mut a, QPA_SQ_PSN, 0u32.to_ne_bytes());
        a[QPA_TIMEOUT] = 14;
        a[QPA_RETRY_CNT] = 7;
        a[QPA_RNR_RETRY] = 7;
        a[QPA_MAX_RD_ATOMIC] = 1;
        modify(
            &mut a,
            QP_STATE | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_SQ_PSN | QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )?;
        let _ = QPA_PKEY_INDEX; // pkey index 0: the zeroed field.
        Ok(lb)
    }

    /// One signaled RDMA WRITE of `len` bytes from `src` (registered as `src_mr`) to `dst`
    /// in `dst_mr`, and its completion awaited (polled; at most `COMPLETION_WAIT`).
    pub fn write(
        &self,
        src: *const u8,
        src_mr: &Mr,
        len: usize,
        dst: *const u8,
        dst_mr: &Mr,
    ) -> Result<(), String> {
        let mut sge = [0u8; 16];
        put(&mut sge, 0, (src as u64).to_ne_bytes());
        put(&mut sge, 8, (len as u32).to_ne_bytes());
        put(&mut sge, 12, src_mr.lkey.to_ne_bytes());
        // SAFETY: a live struct ibv_mr; rkey is a u32 at MR_RKEY.
        let rkey = unsafe {
            dst_mr
                .ptr
                .as_ptr()
                .cast::<u8>()
                .add(MR_RKEY)
                .cast::<u32>()
                .read_unaligned()
        };
        let mut wr = [0u64; SEND_WR_BYTES / 8];
        {
            // SAFETY: the u64 array viewed as its bytes (same size, u8 has no alignment).
            let w = unsafe {
                std::slice::from_raw_parts_mut(wr.as_mut_ptr().cast::<u8>(), SEND_WR_BYTES)
            };
            put(w, WR_SG_LIST, (sge.as_mut_ptr() as usize).to_ne_bytes());
            put(w, WR_NUM_SGE, 1i32.to_ne_bytes());
            put(w, WR_OPCODE, WR_RDMA_WRITE.to_ne_bytes());
            put(w, WR_SEND_FLAGS, SEND_SIGNALED.to_ne_bytes());
            put(w, WR_REMOTE_ADDR, (dst as u64).to_ne_bytes());
            put(w, WR_RKEY, rkey.to_ne_bytes());
        }
        let mut bad: *mut u8 = std::ptr::null_mut();
        // SAFETY: the provider's post_send on our QP with one work request whose SGE lives
        // until the completion below is polled.
        let rc = unsafe { (self.post_send)(self.qp.as_ptr(), wr.as_mut_ptr().cast(), &mut bad) };
        if rc != 0 {
            return Err(format!(
                "ibv_post_send failed ({})",
                std::io::Error::from_raw_os_error(rc)
            ));
        }
        let t = Instant::now();
        let mut wc = [0u64; WC_BYTES / 8];
        loop {
            // SAFETY: the provider's poll_cq on our CQ, room for one struct ibv_wc.
            let n = unsafe { (self.poll_cq)(self.cq.as_ptr(), 1, wc.as_mut_ptr().cast()) };
            if n < 0 {
                return Err("ibv_poll_cq failed".into());
            }
            if n == 1 {
                let status = (wc[WC_STATUS / 8] >> ((WC_STATUS % 8) * 8)) as u32;
                return if status == 0 {
                    Ok(())
                } else {
                    Err(format!(
                        "the RDMA WRITE of {len} bytes completed with status {status}"
                    ))
                };
            }
            if t.elapsed() > COMPLETION_WAIT {
                return Err(format!(
                    "no completion of an RDMA WRITE of {len} bytes in {} s",
                    COMPLETION_WAIT.as_secs()
                ));
            }
        }
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        // SAFETY: the QP and CQ we created, no work outstanding (each write was completed).
        unsafe {
            (self.destroy_qp)(self.qp.as_ptr());
            (self.destroy_cq)(self.cq.as_ptr());
        }
    }
}
