//! Our own `#[repr(C)]` view of the few libibverbs structs the hooks touch, checked field by
//! field against the installed `verbs.h` by the test below. libibverbs is never linked: its
//! functions are resolved at run time (see `real.rs`), so loading us never loads it.

use std::ffi::c_void;

/// `struct ibv_mr`.
#[repr(C)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct verbs_mr` (private to rdma-core, stable since v20): what providers allocate
/// at least, with `struct ibv_mr` first.
pub const VERBS_MR_SIZE: usize = std::mem::size_of::<IbvMr>() + 8;

/// `struct ibv_pd`.
#[repr(C)]
pub struct IbvPd {
    pub context: *mut IbvContext,
    pub handle: u32,
}

/// `struct ibv_context_ops`: 32 function pointers. `_compat_reg_mr`, `_compat_rereg_mr` and
/// `_compat_dereg_mr` hold the provider's current reg/rereg/dereg ops (libibverbs mirrors
/// them there in `verbs_set_ops`), which lets us register without libibverbs' fork
/// bookkeeping.
#[repr(C)]
pub struct IbvContextOps {
    pub _compat_query_device: *mut c_void,
    pub _compat_query_port: *mut c_void,
    pub _compat_alloc_pd: *mut c_void,
    pub _compat_dealloc_pd: *mut c_void,
    pub _compat_reg_mr: *mut c_void,
    pub _compat_rereg_mr: *mut c_void,
    pub _compat_dereg_mr: *mut c_void,
    pub alloc_mw: *mut c_void,
    pub bind_mw: *mut c_void,
    pub dealloc_mw: *mut c_void,
    pub _compat_create_cq: *mut c_void,
    pub poll_cq: *mut c_void,
    pub rest1: [*mut c_void; 13],
    pub post_send: *mut c_void,
    pub rest2: [*mut c_void; 6],
}

/// `struct ibv_context`.
#[repr(C)]
pub struct IbvContext {
    pub device: *mut c_void,
    pub ops: IbvContextOps,
    pub cmd_fd: i32,
    pub async_fd: i32,
    pub num_comp_vectors: i32,
    pub mutex: [u64; 5],
    pub abi_compat: *mut c_void,
}

/// Provider `reg_mr` op: `(pd, addr, length, hca_va, access)`.
pub type ProviderRegMr =
    unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, u64, i32) -> *mut IbvMr;
/// Provider `dereg_mr` op (takes `struct verbs_mr *`, the same address).
pub type ProviderDeregMr = unsafe extern "C" fn(*mut IbvMr) -> i32;
/// Provider `rereg_mr` op: `(vmr, flags, pd, addr, length, access)`.
pub type ProviderReregMr =
    unsafe extern "C" fn(*mut IbvMr, i32, *mut IbvPd, *mut c_void, usize, i32) -> i32;

/// Provider `alloc_mw` op (`ibv_alloc_mw` is an inline wrapper around it).
pub type ProviderAllocMw = unsafe extern "C" fn(*mut IbvPd, i32) -> *mut IbvMw;
/// Provider `bind_mw` op (type-1 windows; `ibv_bind_mw` is an inline wrapper).
pub type ProviderBindMw = unsafe extern "C" fn(*mut IbvQp, *mut IbvMw, *mut IbvMwBind) -> i32;
/// Provider `dealloc_mw` op.
pub type ProviderDeallocMw = unsafe extern "C" fn(*mut IbvMw) -> i32;
/// Provider `poll_cq` op (`ibv_poll_cq` is an inline wrapper).
pub type ProviderPollCq = unsafe extern "C" fn(*mut IbvCq, i32, *mut IbvWc) -> i32;

/// `struct ibv_cq`: only its context is read; the rest is the provider's.
#[repr(C)]
pub struct IbvCq {
    pub context: *mut IbvContext,
}

/// `struct ibv_qp`, up to `qp_num`.
#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
}

/// `struct ibv_mw`.
#[repr(C)]
pub struct IbvMw {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub rkey: u32,
    pub handle: u32,
    pub mw_type: i32,
}

/// `struct ibv_mw_bind` with its `struct ibv_mw_bind_info`.
#[repr(C)]
pub struct IbvMwBind {
    pub wr_id: u64,
    pub send_flags: u32,
    pub mr: *mut IbvMr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: u32,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Default)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: i32,
    pub opcode: i32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: i32,
    pub sq_sig_all: i32,
}

/// `struct ibv_ah_attr` with its `struct ibv_global_route` (8-aligned: `union ibv_gid`
/// holds two u64).
#[repr(C, align(8))]
#[derive(Default, Clone, Copy)]
pub struct IbvAhAttr {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Default)]
pub struct IbvQpAttr {
    pub qp_state: i32,
    pub cur_qp_state: i32,
    pub path_mtu: i32,
    pub path_mig_state: i32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_port_attr`, read as bytes (only a few fields matter; see the offsets).
pub const PORT_ATTR_BYTES: usize = 64;
pub const PORT_ACTIVE_MTU: usize = 8;
pub const PORT_LID: usize = 34;
pub const PORT_LINK_LAYER: usize = 46;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
/// `struct ibv_device_attr`, read as bytes: `max_mw` is an int at this offset.
pub const DEVICE_ATTR_BYTES: usize = 256;
pub const DEVICE_MAX_MW: usize = 176;

pub const IBV_MW_TYPE_1: i32 = 1;
pub const IBV_QPT_RC: i32 = 2;
pub const IBV_QPS_INIT: i32 = 1;
pub const IBV_QPS_RTR: i32 = 2;
pub const IBV_QPS_RTS: i32 = 3;
pub const IBV_SEND_SIGNALED: u32 = 2;
pub const IBV_QP_STATE: i32 = 1;
pub const IBV_QP_ACCESS_FLAGS: i32 = 1 << 3;
pub const IBV_QP_PKEY_INDEX: i32 = 1 << 4;
pub const IBV_QP_PORT: i32 = 1 << 5;
pub const IBV_QP_AV: i32 = 1 << 7;
pub const IBV_QP_PATH_MTU: i32 = 1 << 8;
pub const IBV_QP_TIMEOUT: i32 = 1 << 9;
pub const IBV_QP_RETRY_CNT: i32 = 1 << 10;
pub const IBV_QP_RNR_RETRY: i32 = 1 << 11;
pub const IBV_QP_RQ_PSN: i32 = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: i32 = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: i32 = 1 << 15;
pub const IBV_QP_SQ_PSN: i32 = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: i32 = 1 << 17;
pub const IBV_QP_DEST_QPN: i32 = 1 << 20;

/// `struct verbs_context`, which ends with the `struct ibv_context` of an extended context:
/// how many bytes before that context its `query_device_ex` op and its `sz` sit.
pub const VCTX_QUERY_DEVICE_EX_BACK: usize = 104;
pub const VCTX_SZ_BACK: usize = 8;
/// `struct ibv_device_attr_ex`: its size, and where `odp_caps.general_caps` and
/// `odp_caps.per_transport_caps.rc_odp_caps` sit.
pub const DEVICE_ATTR_EX_SIZE: usize = 400;
pub const DEVICE_ATTR_EX_ODP: usize = 240;
pub const DEVICE_ATTR_EX_ODP_RC: usize = 248;
pub const DEVICE_ATTR_EX_ODP_UD: usize = 256;
/// Where `orig_attr.vendor_id` sits in `struct ibv_device_attr_ex`.
pub const DEVICE_ATTR_EX_VENDOR_ID: usize = 96;
/// Where `orig_attr.vendor_part_id` sits.
pub const DEVICE_ATTR_EX_VENDOR_PART_ID: usize = 100;
/// `orig_attr.fw_ver`: the attributes' first field, this long.
pub const FW_VER_LEN: usize = 64;
/// The vendor id rxe (soft-RoCE) reports (the kernel's `RXE_VENDOR_ID`).
pub const RXE_VENDOR_ID: u32 = 0xff_ffff;
pub const IBV_ODP_SUPPORT: u64 = 1;
pub const IBV_ODP_SUPPORT_SEND: u32 = 1;
pub const IBV_ODP_SUPPORT_RECV: u32 = 1 << 1;
pub const IBV_ODP_SUPPORT_WRITE: u32 = 1 << 2;
pub const IBV_ODP_SUPPORT_READ: u32 = 1 << 3;
pub const IBV_ODP_SUPPORT_ATOMIC: u32 = 1 << 4;
pub const IBV_ODP_SUPPORT_SRQ_RECV: u32 = 1 << 5;

pub const IBV_REREG_MR_ERR_INPUT: i32 = -1;
pub const IBV_REREG_MR_ERR_CMD: i32 = -4;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};
    use std::process::Command;

    /// Compile a C program against the installed verbs.h and compare every offset and size.
    #[test]
    fn layout_matches_installed_verbs_h() {
        let dir = std::env::temp_dir().join(format!("mrcache-ffi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("layout.c");
        std::fs::write(
            &src,
            r#"#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdio.h>
#define P(name, v) printf("%s %zu\n", name, (size_t)(v))
int main(void) {
    P("mr.size", sizeof(struct ibv_mr));
    P("mr.context", offsetof(struct ibv_mr, context));
    P("mr.pd", offsetof(struct ibv_mr, pd));
    P("mr.addr", offsetof(struct ibv_mr, addr));
    P("mr.length", offsetof(struct ibv_mr, length));
    P("mr.handle", offsetof(struct ibv_mr, handle));
    P("mr.lkey", offsetof(struct ibv_mr, lkey));
    P("mr.rkey", offsetof(struct ibv_mr, rkey));
    P("pd.size", sizeof(struct ibv_pd));
    P("pd.context", offsetof(struct ibv_pd, context));
    P("pd.handle", offsetof(struct ibv_pd, handle));
    P("ops.size", sizeof(struct ibv_context_ops));
    P("ops.reg_mr", offsetof(struct ibv_context_ops, _compat_reg_mr));
    P("ops.rereg_mr", offsetof(struct ibv_context_ops, _compat_rereg_mr));
    P("ops.dereg_mr", offsetof(struct ibv_context_ops, _compat_dereg_mr));
    P("ctx.size", sizeof(struct ibv_context));
    P("ctx.device", offsetof(struct ibv_context, device));
    P("ctx.ops", offsetof(struct ibv_context, ops));
    P("ctx.cmd_fd", offsetof(struct ibv_context, cmd_fd));
    P("ctx.num_comp_vectors", offsetof(struct ibv_context, num_comp_vectors));
    P("ctx.mutex", offsetof(struct ibv_context, mutex));
    P("ctx.abi_compat", offsetof(struct ibv_context, abi_compat));
    P("rereg.translation", IBV_REREG_MR_CHANGE_TRANSLATION);
    P("rereg.pd", IBV_REREG_MR_CHANGE_PD);
    P("rereg.access", IBV_REREG_MR_CHANGE_ACCESS);
    P("rereg.supported", IBV_REREG_MR_FLAGS_SUPPORTED);
    P("rereg.err_input", -IBV_REREG_MR_ERR_INPUT);
    P("rereg.err_cmd", -IBV_REREG_MR_ERR_CMD);
    P("ops.alloc_mw", offsetof(struct ibv_context_ops, alloc_mw));
    P("ops.bind_mw", offsetof(struct ibv_context_ops, bind_mw));
    P("ops.dealloc_mw", offsetof(struct ibv_context_ops, dealloc_mw));
    P("ops.poll_cq", offsetof(struct ibv_context_ops, poll_cq));
    P("ops.post_send", offsetof(struct ibv_context_ops, post_send));
    P("qp.qp_num", offsetof(struct ibv_qp, qp_num));
    P("qp.pd", offsetof(struct ibv_qp, pd));
    P("mw.size", sizeof(struct ibv_mw));
    P("mw.rkey", offsetof(struct ibv_mw, rkey));
    P("mw.type", offsetof(struct ibv_mw, type));
    P("bind.size", sizeof(struct ibv_mw_bind));
    P("bind.mr", offsetof(struct ibv_mw_bind, bind_info.mr));
    P("bind.length", offsetof(struct ibv_mw_bind, bind_info.length));
    P("bind.access", offsetof(struct ibv_mw_bind, bind_info.mw_access_flags));
    P("wc.size", sizeof(struct ibv_wc));
    P("wc.status", offsetof(struct ibv_wc, status));
    P("wc.dlid_path_bits", offsetof(struct ibv_wc, dlid_path_bits));
    P("init.size", sizeof(struct ibv_qp_init_attr));
    P("init.cap", offsetof(struct ibv_qp_init_attr, cap));
    P("init.qp_type", offsetof(struct ibv_qp_init_attr, qp_type));
    P("init.sq_sig_all", offsetof(struct ibv_qp_init_attr, sq_sig_all));
    P("ah.size", sizeof(struct ibv_ah_attr));
    P("ah.sgid_index", offsetof(struct ibv_ah_attr, grh.sgid_index));
    P("ah.dlid", offsetof(struct ibv_ah_attr, dlid));
    P("ah.is_global", offsetof(struct ibv_ah_attr, is_global));
    P("ah.port_num", offsetof(struct ibv_ah_attr, port_num));
    P("qpa.size", sizeof(struct ibv_qp_attr));
    P("qpa.dest_qp_num", offsetof(struct ibv_qp_attr, dest_qp_num));
    P("qpa.ah_attr", offsetof(struct ibv_qp_attr, ah_attr));
    P("qpa.pkey_index", offsetof(struct ibv_qp_attr, pkey_index));
    P("qpa.max_dest_rd_atomic", offsetof(struct ibv_qp_attr, max_dest_rd_atomic));
    P("qpa.port_num", offsetof(struct ibv_qp_attr, port_num));
    P("qpa.rnr_retry", offsetof(struct ibv_qp_attr, rnr_retry));
    P("qpa.rate_limit", offsetof(struct ibv_qp_attr, rate_limit));
    P("port.fits", sizeof(struct ibv_port_attr) <= 64);
    P("port.active_mtu", offsetof(struct ibv_port_attr, active_mtu));
    P("port.lid", offsetof(struct ibv_port_attr, lid));
    P("port.link_layer", offsetof(struct ibv_port_attr, link_layer));
    P("port.ethernet", IBV_LINK_LAYER_ETHERNET);
    P("dev.fits", sizeof(struct ibv_device_attr) <= 256);
    P("dev.max_mw", offsetof(struct ibv_device_attr, max_mw));
    P("const.mw1", IBV_MW_TYPE_1);
    P("const.rc", IBV_QPT_RC);
    P("const.rts", IBV_QPS_RTS);
    P("const.signaled", IBV_SEND_SIGNALED);
    P("const.dest_qpn", IBV_QP_DEST_QPN);
    P("const.max_dest_rd_atomic", IBV_QP_MAX_DEST_RD_ATOMIC);
    P("const.sq_psn", IBV_QP_SQ_PSN);
    P("const.min_rnr_timer", IBV_QP_MIN_RNR_TIMER);
    P("const.av", IBV_QP_AV);
    P("vctx.query_device_ex", offsetof(struct verbs_context, context) - offsetof(struct verbs_context, query_device_ex));
    P("vctx.sz", offsetof(struct verbs_context, context) - offsetof(struct verbs_context, sz));
    P("attr_ex.size", sizeof(struct ibv_device_attr_ex));
    P("attr_ex.odp", offsetof(struct ibv_device_attr_ex, odp_caps.general_caps));
    P("attr_ex.odp_rc", offsetof(struct ibv_device_attr_ex, odp_caps.per_transport_caps.rc_odp_caps));
    P("attr_ex.odp_ud", offsetof(struct ibv_device_attr_ex, odp_caps.per_transport_caps.ud_odp_caps));
    P("odp.srq_recv", IBV_ODP_SUPPORT_SRQ_RECV);
    P("attr_ex.vendor_id", offsetof(struct ibv_device_attr_ex, orig_attr.vendor_id));
    P("attr_ex.vendor_part_id", offsetof(struct ibv_device_attr_ex, orig_attr.vendor_part_id));
    P("attr_ex.fw_ver", offsetof(struct ibv_device_attr_ex, orig_attr.fw_ver));
    P("attr_ex.fw_ver_len", sizeof(((struct ibv_device_attr *)0)->fw_ver));
    P("odp.support", IBV_ODP_SUPPORT);
    P("odp.send", IBV_ODP_SUPPORT_SEND);
    P("odp.recv", IBV_ODP_SUPPORT_RECV);
    P("odp.write", IBV_ODP_SUPPORT_WRITE);
    P("odp.read", IBV_ODP_SUPPORT_READ);
    P("odp.atomic", IBV_ODP_SUPPORT_ATOMIC);
    return 0;
}
"#,
        )
        .unwrap();
        let exe = dir.join("layout");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let st = Command::new(cc)
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .status()
            .expect("run cc");
        assert!(
            st.success(),
            "cannot compile against verbs.h (apt-get install libibverbs-dev)"
        );
        let out = Command::new(&exe).output().unwrap();
        let c: std::collections::HashMap<String, usize> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let (k, v) = l.split_once(' ').unwrap();
                (k.to_string(), v.parse().unwrap())
            })
            .collect();
        let rust = [
            ("mr.size", size_of::<IbvMr>()),
            ("mr.context", offset_of!(IbvMr, context)),
            ("mr.pd", offset_of!(IbvMr, pd)),
            ("mr.addr", offset_of!(IbvMr, addr)),
            ("mr.length", offset_of!(IbvMr, length)),
            ("mr.handle", offset_of!(IbvMr, handle)),
            ("mr.lkey", offset_of!(IbvMr, lkey)),
            ("mr.rkey", offset_of!(IbvMr, rkey)),
            ("pd.size", size_of::<IbvPd>()),
            ("pd.context", offset_of!(IbvPd, context)),
            ("pd.handle", offset_of!(IbvPd, handle)),
            ("ops.size", size_of::<IbvContextOps>()),
            ("ops.reg_mr", offset_of!(IbvContextOps, _compat_reg_mr)),
            ("ops.rereg_mr", offset_of!(IbvContextOps, _compat_rereg_mr)),
            ("ops.dereg_mr", offset_of!(IbvContextOps, _compat_dereg_mr)),
            ("ctx.size", size_of::<IbvContext>()),
            ("ctx.device", offset_of!(IbvContext, device)),
            ("ctx.ops", offset_of!(IbvContext, ops)),
            ("ctx.cmd_fd", offset_of!(IbvContext, cmd_fd)),
            (
                "ctx.num_comp_vectors",
                offset_of!(IbvContext, num_comp_vectors),
            ),
            ("ctx.mutex", offset_of!(IbvContext, mutex)),
            ("ctx.abi_compat", offset_of!(IbvContext, abi_compat)),
            (
                "rereg.translation",
                mrcache::access::REREG_CHANGE_TRANSLATION as usize,
            ),
            ("rereg.pd", mrcache::access::REREG_CHANGE_PD as usize),
            (
                "rereg.access",
                mrcache::access::REREG_CHANGE_ACCESS as usize,
            ),
            (
                "rereg.supported",
                mrcache::access::REREG_FLAGS_SUPPORTED as usize,
            ),
            ("rereg.err_input", -IBV_REREG_MR_ERR_INPUT as usize),
            ("rereg.err_cmd", -IBV_REREG_MR_ERR_CMD as usize),
            ("ops.alloc_mw", offset_of!(IbvContextOps, alloc_mw)),
            ("ops.bind_mw", offset_of!(IbvContextOps, bind_mw)),
            ("ops.dealloc_mw", offset_of!(IbvContextOps, dealloc_mw)),
            ("ops.poll_cq", offset_of!(IbvContextOps, poll_cq)),
            ("ops.post_send", offset_of!(IbvContextOps, post_send)),
            ("qp.qp_num", offset_of!(IbvQp, qp_num)),
            ("qp.pd", offset_of!(IbvQp, pd)),
            ("mw.size", size_of::<IbvMw>()),
            ("mw.rkey", offset_of!(IbvMw, rkey)),
            ("mw.type", offset_of!(IbvMw, mw_type)),
            ("bind.size", size_of::<IbvMwBind>()),
            ("bind.mr", offset_of!(IbvMwBind, mr)),
            ("bind.length", offset_of!(IbvMwBind, length)),
            ("bind.access", offset_of!(IbvMwBind, mw_access_flags)),
            ("wc.size", size_of::<IbvWc>()),
            ("wc.status", offset_of!(IbvWc, status)),
            ("wc.dlid_path_bits", offset_of!(IbvWc, dlid_path_bits)),
            ("init.size", size_of::<IbvQpInitAttr>()),
            ("init.cap", offset_of!(IbvQpInitAttr, cap)),
            ("init.qp_type", offset_of!(IbvQpInitAttr, qp_type)),
            ("init.sq_sig_all", offset_of!(IbvQpInitAttr, sq_sig_all)),
            ("ah.size", size_of::<IbvAhAttr>()),
            ("ah.sgid_index", offset_of!(IbvAhAttr, sgid_index)),
            ("ah.dlid", offset_of!(IbvAhAttr, dlid)),
            ("ah.is_global", offset_of!(IbvAhAttr, is_global)),
            ("ah.port_num", offset_of!(IbvAhAttr, port_num)),
            ("qpa.size", size_of::<IbvQpAttr>()),
            ("qpa.dest_qp_num", offset_of!(IbvQpAttr, dest_qp_num)),
            ("qpa.ah_attr", offset_of!(IbvQpAttr, ah_attr)),
            ("qpa.pkey_index", offset_of!(IbvQpAttr, pkey_index)),
            (
                "qpa.max_dest_rd_atomic",
                offset_of!(IbvQpAttr, max_dest_rd_atomic),
            ),
            ("qpa.port_num", offset_of!(IbvQpAttr, port_num)),
            ("qpa.rnr_retry", offset_of!(IbvQpAttr, rnr_retry)),
            ("qpa.rate_limit", offset_of!(IbvQpAttr, rate_limit)),
            ("port.fits", 1),
            ("port.active_mtu", PORT_ACTIVE_MTU),
            ("port.lid", PORT_LID),
            ("port.link_layer", PORT_LINK_LAYER),
            ("port.ethernet", IBV_LINK_LAYER_ETHERNET as usize),
            ("dev.fits", 1),
            ("dev.max_mw", DEVICE_MAX_MW),
            ("const.mw1", IBV_MW_TYPE_1 as usize),
            ("const.rc", IBV_QPT_RC as usize),
            ("const.rts", IBV_QPS_RTS as usize),
            ("const.signaled", IBV_SEND_SIGNALED as usize),
            ("const.dest_qpn", IBV_QP_DEST_QPN as usize),
            (
                "const.max_dest_rd_atomic",
                IBV_QP_MAX_DEST_RD_ATOMIC as usize,
            ),
            ("const.sq_psn", IBV_QP_SQ_PSN as usize),
            ("const.min_rnr_timer", IBV_QP_MIN_RNR_TIMER as usize),
            ("const.av", IBV_QP_AV as usize),
            ("vctx.query_device_ex", VCTX_QUERY_DEVICE_EX_BACK),
            ("vctx.sz", VCTX_SZ_BACK),
            ("attr_ex.size", DEVICE_ATTR_EX_SIZE),
            ("attr_ex.odp", DEVICE_ATTR_EX_ODP),
            ("attr_ex.odp_rc", DEVICE_ATTR_EX_ODP_RC),
            ("attr_ex.odp_ud", DEVICE_ATTR_EX_ODP_UD),
            ("odp.srq_recv", IBV_ODP_SUPPORT_SRQ_RECV as usize),
            ("attr_ex.vendor_id", DEVICE_ATTR_EX_VENDOR_ID),
            ("attr_ex.vendor_part_id", DEVICE_ATTR_EX_VENDOR_PART_ID),
            ("attr_ex.fw_ver", 0),
            ("attr_ex.fw_ver_len", FW_VER_LEN),
            ("odp.support", IBV_ODP_SUPPORT as usize),
            ("odp.send", IBV_ODP_SUPPORT_SEND as usize),
            ("odp.recv", IBV_ODP_SUPPORT_RECV as usize),
            ("odp.write", IBV_ODP_SUPPORT_WRITE as usize),
            ("odp.read", IBV_ODP_SUPPORT_READ as usize),
            ("odp.atomic", IBV_ODP_SUPPORT_ATOMIC as usize),
        ];
        assert_eq!(rust.len(), c.len());
        for (name, value) in rust {
            assert_eq!(
                Some(&value),
                c.get(name),
                "{name}: Rust {value} vs verbs.h {:?}",
                c.get(name)
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
