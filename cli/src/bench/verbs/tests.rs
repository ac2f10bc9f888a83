//! Tests of `bench::verbs`.

use super::*;

/// The offsets above against the installed verbs.h (skipped without a C compiler or
/// the header, as the preload's layout test).
#[test]
fn offsets_match_verbs_h() {
    let dir = std::env::temp_dir().join(format!("mrcache-bench-offsets-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let src = dir.join("o.c");
    std::fs::write(
        &src,
        "#include <infiniband/verbs.h>\n#include <stdio.h>\n#include <stddef.h>\n\
         int main(void){printf(\"%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\\n\",\
         offsetof(struct ibv_device_attr,fw_ver),offsetof(struct ibv_device_attr,vendor_id),\
         offsetof(struct ibv_device_attr,vendor_part_id),offsetof(struct ibv_device_attr,hw_ver),\
         offsetof(struct ibv_device_attr,max_mw),offsetof(struct ibv_device_attr,phys_port_cnt),\
         sizeof(struct ibv_device_attr),offsetof(struct ibv_port_attr,state),\
         sizeof(struct ibv_port_attr),offsetof(struct ibv_mr,lkey),offsetof(struct ibv_context,ops.poll_cq));return 0;}\n",
    )
    .unwrap();
    let exe = dir.join("o");
    let built = std::process::Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status();
    if !built.is_ok_and(|s| s.success()) {
        eprintln!("skipped: cannot compile against infiniband/verbs.h");
        return;
    }
    let out = std::process::Command::new(&exe).output().unwrap();
    let got: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        got[..6],
        [
            DEV_FW_VER,
            DEV_VENDOR_ID,
            DEV_VENDOR_PART_ID,
            DEV_HW_VER,
            DEV_MAX_MW,
            DEV_PHYS_PORT_CNT
        ]
    );
    assert!(got[6] <= DEVICE_ATTR_BYTES && got[8] <= PORT_ATTR_BYTES);
    assert_eq!(
        (got[7], got[9], got[10]),
        (PORT_STATE, MR_LKEY, CTX_POLL_CQ)
    );
}
