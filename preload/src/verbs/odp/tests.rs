//! The policy against fake device contexts laid out as libibverbs lays out an extended one
//! (`struct verbs_context` ending with the `struct ibv_context`), whose `query_device_ex`
//! op answers the RC and UD capabilities a test gives.

use super::*;
use crate::ffi::{
    DEVICE_ATTR_EX_ODP, DEVICE_ATTR_EX_ODP_RC, DEVICE_ATTR_EX_VENDOR_ID, IBV_ODP_SUPPORT_ATOMIC,
    RXE_VENDOR_ID, VCTX_QUERY_DEVICE_EX_BACK, VCTX_SZ_BACK,
};
use mrcache::access::{LOCAL_WRITE, REMOTE_ATOMIC, REMOTE_WRITE};

const ALL_BUT_ATOMIC: u32 = ffi::IBV_ODP_SUPPORT_SEND
    | ffi::IBV_ODP_SUPPORT_RECV
    | ffi::IBV_ODP_SUPPORT_WRITE
    | ffi::IBV_ODP_SUPPORT_READ;
/// What `auto` asks of RC besides: receives through a shared receive queue.
const FULL_RC: u32 = ALL_BUT_ATOMIC | ffi::IBV_ODP_SUPPORT_SRQ_RECV;
/// What `auto` asks of UD.
const UD: u32 = ffi::IBV_ODP_SUPPORT_SEND | ffi::IBV_ODP_SUPPORT_RECV;

/// A fake extended context: the words before it, then the context itself.
#[repr(C, align(8))]
struct Fake {
    bytes: [u8; VCTX_QUERY_DEVICE_EX_BACK + std::mem::size_of::<IbvContext>()],
}

unsafe extern "C" fn answer(
    ctx: *mut IbvContext,
    _: *const c_void,
    attr: *mut u8,
    _: usize,
) -> i32 {
    // SAFETY: the test's own fake: the RC capabilities and above them the vendor id are kept
    // in the context's first word (its `device` pointer, unused here), the UD capabilities
    // in its second (the first op, unused); attr is the caller's zeroed buffer.
    unsafe {
        let word = std::ptr::read(ctx as *const u64);
        let rc = word as u32;
        let ud = std::ptr::read((ctx as *const u64).add(1)) as u32;
        std::ptr::write_unaligned(attr.add(ffi::DEVICE_ATTR_EX_ODP_UD) as *mut u32, ud);
        std::ptr::write_unaligned(
            attr.add(DEVICE_ATTR_EX_VENDOR_ID) as *mut u32,
            (word >> 32) as u32,
        );
        std::ptr::write_unaligned(
            attr.add(DEVICE_ATTR_EX_ODP) as *mut u64,
            ffi::IBV_ODP_SUPPORT,
        );
        std::ptr::write_unaligned(attr.add(DEVICE_ATTR_EX_ODP_RC) as *mut u32, rc);
    }
    0
}

/// A leaked fake context whose device pages on demand what `rc` says on RC (and UD's send
/// and receive); `extended` false: a legacy context; `sz`: the provider's `verbs_context`
/// size it claims.
fn context(rc: u32, extended: bool, sz: usize) -> usize {
    context_of(0, rc, UD, extended, sz)
}

/// `context`, of a device whose vendor id is `vendor` and whose UD capabilities are `ud`.
fn context_of(vendor: u32, rc: u32, ud: u32, extended: bool, sz: usize) -> usize {
    let fake = Box::leak(Box::new(Fake {
        bytes: [0; VCTX_QUERY_DEVICE_EX_BACK + std::mem::size_of::<IbvContext>()],
    }));
    let base = fake.bytes.as_mut_ptr();
    // SAFETY: every write is inside the fake, at the offsets verbs.h gives (ffi's test).
    unsafe {
        let ctx = base.add(VCTX_QUERY_DEVICE_EX_BACK);
        let op: QueryDeviceEx = answer;
        std::ptr::write_unaligned(base as *mut usize, op as usize);
        std::ptr::write_unaligned(ctx.sub(VCTX_SZ_BACK) as *mut usize, sz);
        std::ptr::write(ctx as *mut u64, (vendor as u64) << 32 | rc as u64);
        std::ptr::write((ctx as *mut u64).add(1), ud as u64);
        let c = ctx as *mut IbvContext;
        (*c).abi_compat = if extended {
            usize::MAX as *mut c_void
        } else {
            std::ptr::null_mut()
        };
        ctx as usize
    }
}

fn full() -> usize {
    VCTX_QUERY_DEVICE_EX_BACK + std::mem::size_of::<IbvContext>()
}

fn req(context: usize, access: u32) -> Request {
    Request {
        pd: 1,
        context,
        addr: 0x10000,
        len: 4096,
        iova: 0x10000,
        access,
    }
}

#[test]
fn off_never_registers_on_demand_nor_keeps_caching_blind() {
    let p = Policy::new(OnDemand::Off, RemoteMode::Revoke, None);
    let ctx = context(ALL_BUT_ATOMIC, true, full());
    assert!(!p.applies(&req(ctx, LOCAL_WRITE)));
    assert!(!p.only("blind"), "off: caching must stop instead");
    assert!(!p.refuses(&req(ctx, LOCAL_WRITE)));
}

#[test]
fn auto_registers_on_demand_only_once_the_monitor_is_blind() {
    let p = Policy::new(OnDemand::Auto, RemoteMode::Revoke, None);
    let ctx = context(FULL_RC, true, full());
    assert!(
        !p.applies(&req(ctx, LOCAL_WRITE)),
        "a seeing monitor: pinned"
    );
    assert!(p.only("the sanitizer's allocator"));
    assert_eq!(p.only_why(), Some("the sanitizer's allocator"));
    assert!(p.applies(&req(ctx, LOCAL_WRITE)));
    assert!(!p.refuses(&req(ctx, LOCAL_WRITE)));
    assert!(
        !p.refuses(&req(ctx, LOCAL_WRITE | REMOTE_WRITE)),
        "revoked per handle"
    );
    let child = p.renewed();
    assert_eq!(child.only_why(), Some("the sanitizer's allocator"));
}

#[test]
fn blind_refuses_what_the_device_cannot_page_on_demand() {
    let p = Policy::new(OnDemand::Auto, RemoteMode::Revoke, None);
    assert!(p.only("blind"));
    let none = context(0, true, full());
    assert!(p.refuses(&req(none, LOCAL_WRITE)), "no ODP: pass through");
    let legacy = context(ALL_BUT_ATOMIC, false, full());
    assert!(
        p.refuses(&req(legacy, LOCAL_WRITE)),
        "a legacy context: no op to ask"
    );
    let short = context(ALL_BUT_ATOMIC, true, full() - 8);
    assert!(
        p.refuses(&req(short, LOCAL_WRITE)),
        "a verbs_context without the op"
    );
    let no_atomic = context(FULL_RC, true, full());
    assert!(!p.refuses(&req(no_atomic, LOCAL_WRITE)));
    assert!(p.refuses(&req(no_atomic, LOCAL_WRITE | REMOTE_ATOMIC)));
    let atomic = context(FULL_RC | IBV_ODP_SUPPORT_ATOMIC, true, full());
    assert!(!p.refuses(&req(atomic, LOCAL_WRITE | REMOTE_ATOMIC)));
}

#[test]
fn blind_never_keeps_a_remote_key() {
    let ctx = context(ALL_BUT_ATOMIC, true, full());
    for remote in [RemoteMode::Keep, RemoteMode::Bypass] {
        let p = Policy::new(OnDemand::On, remote, None);
        assert!(p.applies(&req(ctx, LOCAL_WRITE)));
        assert!(
            !p.refuses(&req(ctx, LOCAL_WRITE | REMOTE_WRITE)),
            "the monitor sees"
        );
        assert!(p.only("MRCACHE_MONITOR=none"));
        assert!(p.refuses(&req(ctx, LOCAL_WRITE | REMOTE_WRITE)));
        assert!(!p.refuses(&req(ctx, LOCAL_WRITE)));
    }
}

/// rxe's on-demand copy drops the offset within a page (docs/design/odp.md): `auto` never
/// chooses it there (a blind monitor turns caching off, as without `MRCACHE_ODP`), `on`
/// still does. Seen failing in the 7.3.4 guest before: the default configuration with
/// `MRCACHE_MONITOR=symbols` cached on demand, and `stale free_malloc`'s first WRITE did not
/// land (`data did not land at ...: first mismatch at offset 0`).
#[test]
fn auto_never_chooses_on_demand_on_rxe() {
    let rxe = context_of(RXE_VENDOR_ID, FULL_RC, UD, true, full());
    let auto = Policy::new(OnDemand::Auto, RemoteMode::Revoke, None);
    assert!(!auto.pages_on_demand(rxe), "set-up: caching off instead");
    assert!(auto.only("blind"));
    assert!(auto.refuses(&req(rxe, LOCAL_WRITE)));
    let on = Policy::new(OnDemand::On, RemoteMode::Revoke, None);
    assert!(on.pages_on_demand(rxe));
    assert!(on.applies(&req(rxe, LOCAL_WRITE)));
}

/// An app may use one MR on any transport of the device and through shared receive
/// queues, and `auto` was not asked for: it leaves pinned a device whose UD send and
/// receive or RC's SRQ receive are not paged on demand (a blind monitor then turns caching
/// off, as without `MRCACHE_ODP`); `on` asks only what RC needs. Seen failing with `auto`
/// asking only RC's send, receive, write and read.
#[test]
fn auto_leaves_pinned_a_device_that_pages_less_than_every_transport() {
    let auto = Policy::new(OnDemand::Auto, RemoteMode::Revoke, None);
    let on = Policy::new(OnDemand::On, RemoteMode::Revoke, None);
    let ud_sends_only = context_of(0, FULL_RC, ffi::IBV_ODP_SUPPORT_SEND, true, full());
    let no_srq = context_of(0, ALL_BUT_ATOMIC, UD, true, full());
    let every = context_of(0, FULL_RC, UD, true, full());
    for ctx in [ud_sends_only, no_srq] {
        assert!(!auto.pages_on_demand(ctx));
        assert!(on.pages_on_demand(ctx));
    }
    assert!(auto.pages_on_demand(every));
}
