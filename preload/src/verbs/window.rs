//! `MRCACHE_REMOTE=revoke` on the verbs provider: remote access to a cached registration
//! through a type-1 memory window per handle.
//!
//! The cached MR is registered with the app's local rights plus MW_BIND and no remote
//! right, so its own rkey reaches nothing. Each handle the app gets carries the rkey of a
//! window bound over exactly its range with its remote rights (a fresh key at every bind);
//! at `ibv_dereg_mr` the window is unbound and the unbind's completion is awaited before
//! the call returns, so the key reaches nothing from then on.
//!
//! Type 1, not type 2: a type-2 window is tied to the QP that bound it (rxe refuses any
//! other QP; mlx5 writes that QP's number into the key's context), and the app's peers
//! come in through the app's QPs, not ours. A type-1 window is bound with `ibv_bind_mw`
//! on a QP of ours and is usable from any QP of the PD.
//!
//! Per PD: one RC QP of ours connected to itself (binds are local operations, but the QP
//! must be in RTS), its own CQ, and a pool of unbound windows. One lock guards all of it
//! and is held across a bind and its completion (one operation in flight); it is never the
//! cache lock. Each post carries a `wr_id` of its own and a poll takes only its own
//! completion: one that timed out (a stalled device) may still arrive later. Once a bind
//! failed or timed out the PD is broken: nothing more is bound there, and each of its
//! granted windows is revoked by `ibv_dealloc_mw` (which invalidates the key when it
//! returns), not by an unbind on a QP that cannot be trusted to complete it. A fork child forgets every
//! object (they belong to the parent's device context).

use crate::ffi::{self, IbvContext, IbvCq, IbvMr, IbvMw, IbvMwBind, IbvPd, IbvQp, IbvWc};
use crate::sys::symbol::Symbol;
use mrcache::access::REMOTE;
use mrcache::cache::{WordMap, WordSet};
use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::time::{Duration, Instant};

type CreateCq =
    unsafe extern "C" fn(*mut IbvContext, i32, *mut c_void, *mut c_void, i32) -> *mut IbvCq;
type CreateQp = unsafe extern "C" fn(*mut IbvPd, *mut ffi::IbvQpInitAttr) -> *mut IbvQp;
type ModifyQp = unsafe extern "C" fn(*mut IbvQp, *mut ffi::IbvQpAttr, i32) -> i32;
type QueryDevice = unsafe extern "C" fn(*mut IbvContext, *mut u8) -> i32;
type QueryPort = unsafe extern "C" fn(*mut IbvContext, u8, *mut u8) -> i32;
type QueryGid = unsafe extern "C" fn(*mut IbvContext, u8, i32, *mut u8) -> i32;

// Each type is the IBVERBS_1.1 prototype (verbs.h; the attribute structs are ours, laid
// out as verbs.h, or byte buffers larger than them: the ffi layout test).
// SAFETY: ibv_create_cq@IBVERBS_1.1 has this prototype.
static CREATE_CQ: Symbol<CreateCq> = unsafe { Symbol::verbs(c"ibv_create_cq", c"IBVERBS_1.1") };
// SAFETY: ibv_destroy_cq@IBVERBS_1.1 has this prototype.
static DESTROY_CQ: Symbol<unsafe extern "C" fn(*mut IbvCq) -> i32> =
    unsafe { Symbol::verbs(c"ibv_destroy_cq", c"IBVERBS_1.1") };
// SAFETY: ibv_create_qp@IBVERBS_1.1 has this prototype.
static CREATE_QP: Symbol<CreateQp> = unsafe { Symbol::verbs(c"ibv_create_qp", c"IBVERBS_1.1") };
// SAFETY: ibv_modify_qp@IBVERBS_1.1 has this prototype.
static MODIFY_QP: Symbol<ModifyQp> = unsafe { Symbol::verbs(c"ibv_modify_qp", c"IBVERBS_1.1") };
// SAFETY: ibv_destroy_qp@IBVERBS_1.1 has this prototype.
static DESTROY_QP: Symbol<unsafe extern "C" fn(*mut IbvQp) -> i32> =
    unsafe { Symbol::verbs(c"ibv_destroy_qp", c"IBVERBS_1.1") };
// SAFETY: ibv_query_port@IBVERBS_1.1 has this prototype.
static QUERY_PORT: Symbol<QueryPort> = unsafe { Symbol::verbs(c"ibv_query_port", c"IBVERBS_1.1") };
// SAFETY: ibv_query_gid@IBVERBS_1.1 has this prototype.
static QUERY_GID: Symbol<QueryGid> = unsafe { Symbol::verbs(c"ibv_query_gid", c"IBVERBS_1.1") };
// SAFETY: ibv_query_device@IBVERBS_1.1 has this prototype.
static QUERY_DEVICE: Symbol<QueryDevice> =
    unsafe { Symbol::verbs(c"ibv_query_device", c"IBVERBS_1.1") };

const EOPNOTSUPP: i32 = 95;
const ETIMEDOUT: i32 = 110;
/// A bind is a local operation; a device that has not completed one in this time is
/// treated as broken (the PD's windows then fall back to uncached registrations).
const COMPLETION_LIMIT: Duration = Duration::from_secs(5);

/// `COMPLETION_LIMIT`, or for tests only `MRCACHE_TEST_COMPLETION_LIMIT_MS` (read when a
/// PD's QP is set up, in a verbs call: allocating is fine there).
fn completion_limit() -> Duration {
    std::env::var("MRCACHE_TEST_COMPLETION_LIMIT_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(COMPLETION_LIMIT, Duration::from_millis)
}

/// For tests only, `MRCACHE_TEST_NO_MW=1`: the device is taken as having no memory windows
/// (max_mw 0), as siw, which the test guest's kernel lacks (read when a PD's QP is set up,
/// in a verbs call: allocating is fine there).
fn no_windows_for_test() -> bool {
    std::env::var_os("MRCACHE_TEST_NO_MW").is_some_and(|v| v == "1")
}

struct PdWindows {
    cq: *mut IbvCq,
    qp: *mut IbvQp,
    /// Unbound windows and how many binds each has had (see `KEY_BINDS`).
    idle: Vec<(*mut IbvMw, u32)>,
    granted: usize,
    /// A bind failed or never completed: the QP is in error; grant nothing more here.
    broken: bool,
    /// How long to wait for a completion (`completion_limit`).
    limit: Duration,
    /// Work requests posted on `qp` so far: each bind's `wr_id` is its own.
    posted: u64,
}

struct Grant {
    pd: usize,
    mw: *mut IbvMw,
    mr: *mut IbvMr,
    /// Binds of `mw` so far, this grant's included.
    binds: u32,
}

/// A window's key changes only in its low 8 bits at each bind (providers step the key
/// byte), so after 256 binds a key it issued before would come back. A window is retired
/// (deallocated; a new one gets a new index from the kernel) before that: no key it ever
/// handed out, revoked since, can reach memory again.
const KEY_BINDS: u32 = 250;

#[derive(Default)]
struct State {
    pds: WordMap<usize, PdWindows>,
    /// Contexts whose device cannot bind type-1 windows.
    unsupported: WordSet<usize>,
    grants: WordMap<usize, Grant>,
}

// SAFETY: the raw pointers are verbs objects of this process, only used under the lock.
unsafe impl Send for State {}

/// The current state; a fork child swaps in a fresh one and leaves the parent's alone (its
/// lock may be held by a thread that does not exist in the child).
static STATE: AtomicPtr<Mutex<State>> = AtomicPtr::new(std::ptr::null_mut());
static WARNED: AtomicBool = AtomicBool::new(false);

fn state() -> &'static Mutex<State> {
    let p = STATE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: STATE only ever holds leaked boxes, never freed.
        return unsafe { &*p };
    }
    let fresh = Box::into_raw(Box::new(Mutex::new(State::default())));
    match STATE.compare_exchange(
        std::ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: fresh was just leaked and is now the published state.
        Ok(_) => unsafe { &*fresh },
        Err(other) => {
            // SAFETY: fresh was never published; other is a leaked box.
            unsafe {
                drop(Box::from_raw(fresh));
                &*other
            }
        }
    }
}

fn lock() -> std::sync::MutexGuard<'static, State> {
    state().lock().unwrap_or_else(|e| e.into_inner())
}

/// In a fork child: the parent's QPs, CQs and windows are not usable here; forget them.
pub fn after_fork_child() {
    let fresh = Box::into_raw(Box::new(Mutex::new(State::default())));
    STATE.store(fresh, Ordering::Release);
}

use crate::sys::errno;

/// Make sure `pd` can have windows bound (its QP exists); `Err(EOPNOTSUPP)` when the
/// device cannot, said once per process.
pub fn prepare(pd: usize, ctx: usize) -> Result<(), i32> {
    let mut st = lock();
    if st.unsupported.contains(&ctx) {
        return Err(EOPNOTSUPP);
    }
    if let Some(p) = st.pds.get(&pd) {
        return if p.broken { Err(EOPNOTSUPP) } else { Ok(()) };
    }
    match open_pd(pd as *mut IbvPd, ctx as *mut IbvContext) {
        Ok(p) => {
            st.pds.insert(pd, p);
            Ok(())
        }
        Err(why) => {
            st.unsupported.insert(ctx);
            if !WARNED.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "mrcache: MRCACHE_REMOTE=revoke: this device cannot revoke remote keys through memory windows ({why}); registrations with remote access are passed to libibverbs uncached"
                );
            }
            Err(EOPNOTSUPP)
        }
    }
}

/// The device's support for type-1 windows and our QP on `pd`.
fn open_pd(pd: *mut IbvPd, ctx: *mut IbvContext) -> Result<PdWindows, String> {
    // SAFETY: ctx is the live context of the app's PD; the ops are the provider's.
    let ops = unsafe { &(*ctx).ops };
    if ops.alloc_mw.is_null() || ops.bind_mw.is_null() || ops.dealloc_mw.is_null() {
        return Err("the provider has no memory window operations".into());
    }
    let (Some(query_device), Some(query_port), Some(query_gid)) =
        (QUERY_DEVICE.get(), QUERY_PORT.get(), QUERY_GID.get())
    else {
        return Err("libibverbs lacks ibv_query_device/port/gid".into());
    };
    let mut dev = [0u8; ffi::DEVICE_ATTR_BYTES];
    let mut port = [0u8; ffi::PORT_ATTR_BYTES];
    let mut gid = [0u8; 16];
    // SAFETY: the IBVERBS_1.1 prototypes; the buffers are larger than the structs (checked
    // by the ffi layout test).
    let max_mw = unsafe {
        let (qd, qp, qg) = (query_device, query_port, query_gid);
        if qd(ctx, dev.as_mut_ptr()) != 0 || qp(ctx, 1, port.as_mut_ptr()) != 0 {
            return Err("cannot query the device or port 1".into());
        }
        if qg(ctx, 1, 0, gid.as_mut_ptr()) != 0 {
            return Err("cannot query GID 0 of port 1".into());
        }
        i32::from_ne_bytes(
            dev[ffi::DEVICE_MAX_MW..ffi::DEVICE_MAX_MW + 4]
                .try_into()
                .unwrap_or([0; 4]),
        )
    };
    if max_mw <= 0 || no_windows_for_test() {
        return Err("device_attr.max_mw is 0".into());
    }
    let mtu = i32::from_ne_bytes(
        port[ffi::PORT_ACTIVE_MTU..ffi::PORT_ACTIVE_MTU + 4]
            .try_into()
            .unwrap_or([0; 4]),
    );
    let lid = u16::from_ne_bytes([port[ffi::PORT_LID], port[ffi::PORT_LID + 1]]);
    let ethernet = port[ffi::PORT_LINK_LAYER] == ffi::IBV_LINK_LAYER_ETHERNET;
    let (Some(create_cq), Some(create_qp), Some(modify_qp), Some(destroy_qp), Some(destroy_cq)) = (
        CREATE_CQ.get(),
        CREATE_QP.get(),
        MODIFY_QP.get(),
        DESTROY_QP.get(),
        DESTROY_CQ.get(),
    ) else {
        return Err("libibverbs lacks the CQ/QP functions".into());
    };
    // SAFETY: IBVERBS_1.1 prototypes of ibv_create_cq/create_qp/modify_qp/destroy_*; every
    // struct is ours, laid out as verbs.h (ffi layout test), and outlives the call.
    unsafe {
        let cq = create_cq(ctx, 4, std::ptr::null_mut(), std::ptr::null_mut(), 0);
        if cq.is_null() {
            return Err(format!("ibv_create_cq failed (errno {})", errno()));
        }
        let mut init = ffi::IbvQpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: std::ptr::null_mut(),
            cap: ffi::IbvQpCap {
                max_send_wr: 4,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        let qp = create_qp(pd, &mut init);
        if qp.is_null() {
            let e = errno();
            destroy_cq(cq);
            return Err(format!("ibv_create_qp failed (errno {e})"));
        }
        let mut a = ffi::IbvQpAttr {
            qp_state: ffi::IBV_QPS_INIT,
            port_num: 1,
            ..Default::default()
        };
        let mut rc = modify_qp(
            qp,
            &mut a,
            ffi::IBV_QP_STATE
                | ffi::IBV_QP_PKEY_INDEX
                | ffi::IBV_QP_PORT
                | ffi::IBV_QP_ACCESS_FLAGS,
        );
        if rc == 0 {
            // Connected to itself: binds never leave the device, but need RTS.
            let mut a = ffi::IbvQpAttr {
                qp_state: ffi::IBV_QPS_RTR,
                path_mtu: mtu,
                dest_qp_num: (*qp).qp_num,
                max_dest_rd_atomic: 1,
                min_rnr_timer: 12,
                ..Default::default()
            };
            a.ah_attr.port_num = 1;
            if ethernet {
                a.ah_attr.is_global = 1;
                a.ah_attr.dgid = gid;
                a.ah_attr.sgid_index = 0;
                a.ah_attr.hop_limit = 1;
            } else {
                a.ah_attr.dlid = lid;
            }
            rc = modify_qp(
                qp,
                &mut a,
                ffi::IBV_QP_STATE
                    | ffi::IBV_QP_AV
                    | ffi::IBV_QP_PATH_MTU
                    | ffi::IBV_QP_DEST_QPN
                    | ffi::IBV_QP_RQ_PSN
                    | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
                    | ffi::IBV_QP_MIN_RNR_TIMER,
            );
        }
        if rc == 0 {
            let mut a = ffi::IbvQpAttr {
                qp_state: ffi::IBV_QPS_RTS,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 1,
                ..Default::default()
            };
            rc = modify_qp(
                qp,
                &mut a,
                ffi::IBV_QP_STATE
                    | ffi::IBV_QP_TIMEOUT
                    | ffi::IBV_QP_RETRY_CNT
                    | ffi::IBV_QP_RNR_RETRY
                    | ffi::IBV_QP_SQ_PSN
                    | ffi::IBV_QP_MAX_QP_RD_ATOMIC,
            );
        }
        if rc != 0 {
            destroy_qp(qp);
            destroy_cq(cq);
            return Err(format!("cannot bring our QP to RTS (error {rc})"));
        }
        Ok(PdWindows {
            cq,
            qp,
            idle: Vec::new(),
            granted: 0,
            broken: false,
            limit: completion_limit(),
            posted: 0,
        })
    }
}

/// The tag in the high half of our `wr_id`s ("mrca"); the low half counts the PD's posts.
const WR_TAG: u64 = 0x6d72_6361 << 32;

/// Bind `mw` over `[addr, addr + len)` of `mr` with `access` (len 0 unbinds) and wait for
/// its own completion: each post has a `wr_id` of its own, and a completion with another
/// (a late one, of a bind that timed out earlier) is discarded. Callers never post on a
/// broken PD; the matching is the second line of defence.
fn bind(
    p: &mut PdWindows,
    mw: *mut IbvMw,
    mr: *mut IbvMr,
    addr: u64,
    len: u64,
    access: u32,
) -> Result<(), i32> {
    p.posted += 1;
    let wr_id = WR_TAG | (p.posted & 0xffff_ffff);
    let mut b = IbvMwBind {
        wr_id,
        send_flags: ffi::IBV_SEND_SIGNALED,
        mr,
        addr,
        length: len,
        mw_access_flags: access,
    };
    // SAFETY: the provider's bind_mw and poll_cq ops (public ops table), on our live QP/CQ
    // and a window of the same PD; what ibv_bind_mw / ibv_poll_cq do inline.
    unsafe {
        let ctx = (*mw).context;
        let bind_mw: ffi::ProviderBindMw = std::mem::transmute((*ctx).ops.bind_mw);
        let rc = bind_mw(p.qp, mw, &mut b);
        if rc != 0 {
            p.broken = true;
            return Err(rc);
        }
        let poll: ffi::ProviderPollCq = std::mem::transmute((*(*p.cq).context).ops.poll_cq);
        // The clock is first read after 4096 empty polls: a bind that completes sooner (as
        // most do) reads none (in a guest without a stable TSC a read is a system call).
        let mut start: Option<Instant> = None;
        let mut spin = 0u64;
        loop {
            spin += 1;
            let mut wc = IbvWc::default();
            match poll(p.cq, 1, &mut wc) {
                // Not ours: a completion of an earlier post, reaped late.
                1 if wc.wr_id != wr_id => continue,
                1 if wc.status == 0 => return Ok(()),
                1 => {
                    p.broken = true;
                    return Err(1000 + wc.status);
                }
                // The clock is read rarely: in a guest without a stable TSC it is a system
                // call, which costs more than the bind itself.
                0 if spin % 4096 != 0
                    || start.get_or_insert_with(Instant::now).elapsed() < p.limit =>
                {
                    std::hint::spin_loop()
                }
                _ => {
                    p.broken = true;
                    return Err(ETIMEDOUT);
                }
            }
        }
    }
}

fn dealloc(mw: *mut IbvMw) -> i32 {
    // SAFETY: the provider's dealloc_mw op on a window we allocated.
    unsafe {
        let f: ffi::ProviderDeallocMw = std::mem::transmute((*(*mw).context).ops.dealloc_mw);
        f(mw)
    }
}

/// Bind a window over the request's range of `mr` with its remote rights, for the handle
/// at `slot`. Returns the window's fresh rkey.
pub fn grant(
    slot: usize,
    pd: usize,
    mr: *mut IbvMr,
    iova: u64,
    len: usize,
    access: u32,
) -> Result<u32, i32> {
    let mut st = lock();
    let Some(p) = st.pds.get_mut(&pd) else {
        return Err(EOPNOTSUPP);
    };
    if p.broken {
        return Err(EOPNOTSUPP);
    }
    let (mw, binds) = match p.idle.pop() {
        Some(idle) => idle,
        None => {
            // SAFETY: the provider's alloc_mw op on the app's live PD.
            let mw = unsafe {
                let ctx = (*(pd as *mut IbvPd)).context;
                let f: ffi::ProviderAllocMw = std::mem::transmute((*ctx).ops.alloc_mw);
                f(pd as *mut IbvPd, ffi::IBV_MW_TYPE_1)
            };
            if mw.is_null() {
                return Err(errno());
            }
            (mw, 0)
        }
    };
    if let Err(e) = bind(p, mw, mr, iova, len as u64, access & REMOTE) {
        dealloc(mw);
        return Err(e);
    }
    p.granted += 1;
    // SAFETY: mw is live; the provider's bind_mw stored the new key in it.
    let rkey = unsafe { (*mw).rkey };
    st.grants.insert(
        slot,
        Grant {
            pd,
            mw,
            mr,
            binds: binds + 1,
        },
    );
    Ok(rkey)
}

/// The app released the handle at `slot`: unbind its window and wait, so its key reaches
/// nothing once this returns. If the unbind fails the window is deallocated instead
/// (which also invalidates its key); only if that fails too is the error returned.
pub fn revoke(slot: usize) -> Result<(), i32> {
    let mut st = lock();
    let Some(g) = st.grants.remove(&slot) else {
        return Ok(());
    };
    let Some(p) = st.pds.get_mut(&g.pd) else {
        return Ok(());
    };
    p.granted -= 1;
    // On a broken PD (a bind failed or timed out) the QP cannot be trusted to complete an
    // unbind: deallocate the window instead, which invalidates its key when it returns.
    if !p.broken && bind(p, g.mw, g.mr, 0, 0, 0).is_ok() {
        if g.binds + 1 + 2 <= KEY_BINDS {
            p.idle.push((g.mw, g.binds + 1));
        } else {
            // Unbound already: its key reaches nothing; retire it before its key byte
            // wraps. A failed dealloc only leaks an unbound window.
            dealloc(g.mw);
        }
        return Ok(());
    }
    match dealloc(g.mw) {
        0 => Ok(()),
        e => {
            p.granted += 1;
            st.grants.insert(slot, g);
            Err(e)
        }
    }
}

/// Before the app's `ibv_dealloc_pd`: destroy our windows, QP and CQ on `pd` (they would
/// keep it busy), unless the app still holds handles with windows on it.
pub fn release_pd(pd: usize) {
    let mut st = lock();
    if st.pds.get(&pd).is_some_and(|p| p.granted == 0)
        && let Some(p) = st.pds.remove(&pd)
    {
        destroy(p);
    }
}

/// Before the app's `ibv_close_device`: the same for every PD of `ctx`.
pub fn release_context(ctx: usize) {
    let mut st = lock();
    st.unsupported.remove(&ctx);
    let pds: Vec<usize> = st
        .pds
        .iter()
        .filter(|(pd, p)| {
            // SAFETY: the PD is live while we hold objects on it.
            p.granted == 0 && unsafe { (*(**pd as *mut IbvPd)).context } as usize == ctx
        })
        .map(|(pd, _)| *pd)
        .collect();
    for pd in pds {
        if let Some(p) = st.pds.remove(&pd) {
            destroy(p);
        }
    }
}

fn destroy(p: PdWindows) {
    for (mw, _) in p.idle {
        dealloc(mw);
    }
    if let (Some(dq), Some(dc)) = (DESTROY_QP.get(), DESTROY_CQ.get()) {
        // SAFETY: IBVERBS_1.1 prototypes, on our own QP and CQ, destroyed once.
        unsafe {
            dq(p.qp);
            dc(p.cq);
        }
    }
}
