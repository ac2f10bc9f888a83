//! Tests of `bench::verbs`.

use super::*;

/// The values of C expressions over verbs.h (`sizeof`, `offsetof`), one per expression,
/// from a program compiled against the installed header; None without a C compiler or the
/// header (the layout tests are then skipped, as the preload's).
pub(crate) fn verbs_h_values(name: &str, exprs: &[&str]) -> Option<Vec<usize>> {
    let dir = std::env::temp_dir().join(format!("mrcache-{name}-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let src = dir.join("o.c");
    let prints: String = exprs
        .iter()
        .map(|e| format!("printf(\"%zu\\n\", (size_t)({e}));\n"))
        .collect();
    std::fs::write(
        &src,
        format!("#include <infiniband/verbs.h>\n#include <stdio.h>\n#include <stddef.h>\nint main(void){{\n{prints}return 0;}}\n"),
    )
    .unwrap();
    let exe = dir.join("o");
    let built = std::process::Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status();
    let out = built
        .is_ok_and(|s| s.success())
        .then(|| std::process::Command::new(&exe).output().unwrap());
    let _ = std::fs::remove_dir_all(&dir);
    let Some(out) = out else {
        eprintln!("skipped: cannot compile against infiniband/verbs.h");
        return None;
    };
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|v| v.parse().unwrap())
            .collect(),
    )
}

/// The offsets above against the installed verbs.h.
#[test]
fn offsets_match_verbs_h() {
    let Some(got) = verbs_h_values(
        "bench-offsets",
        &[
            "offsetof(struct ibv_device_attr, fw_ver)",
            "offsetof(struct ibv_device_attr, vendor_id)",
            "offsetof(struct ibv_device_attr, vendor_part_id)",
            "offsetof(struct ibv_device_attr, hw_ver)",
            "offsetof(struct ibv_device_attr, max_mw)",
            "offsetof(struct ibv_device_attr, phys_port_cnt)",
            "sizeof(struct ibv_device_attr)",
            "offsetof(struct ibv_port_attr, state)",
            "sizeof(struct ibv_port_attr)",
            "offsetof(struct ibv_mr, lkey)",
            "offsetof(struct ibv_context, ops.poll_cq)",
        ],
    ) else {
        return;
    };
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
