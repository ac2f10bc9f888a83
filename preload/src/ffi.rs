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
    pub rest: [*mut c_void; 25],
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

pub const IBV_REREG_MR_CHANGE_TRANSLATION: i32 = 1;
pub const IBV_REREG_MR_CHANGE_PD: i32 = 2;
pub const IBV_REREG_MR_CHANGE_ACCESS: i32 = 4;
pub const IBV_REREG_MR_FLAGS_SUPPORTED: i32 = 7;
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
                IBV_REREG_MR_CHANGE_TRANSLATION as usize,
            ),
            ("rereg.pd", IBV_REREG_MR_CHANGE_PD as usize),
            ("rereg.access", IBV_REREG_MR_CHANGE_ACCESS as usize),
            ("rereg.supported", IBV_REREG_MR_FLAGS_SUPPORTED as usize),
            ("rereg.err_input", -IBV_REREG_MR_ERR_INPUT as usize),
            ("rereg.err_cmd", -IBV_REREG_MR_ERR_CMD as usize),
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
