//! Tests of `bench::odp`.

use super::device::*;
use super::offsets::{LEN, Offsets, WITHIN, judge, pattern};
use super::profile::{figures, profile};
use super::report::{json, ratios, text};
use super::*;
use mrcache::config::odp_profile::{HEADER, OdpProfile};

/// The offsets of `device` against the installed verbs.h (skipped without a C compiler or
/// the header, as `offsets_match_verbs_h`).
#[test]
fn loopback_offsets_match_verbs_h() {
    let fields = [
        (
            "(size_t)((char *)&((struct verbs_context *)0)->context - (char *)&((struct verbs_context *)0)->query_device_ex)",
            VCTX_QUERY_DEVICE_EX_BACK,
        ),
        (
            "(size_t)((char *)&((struct verbs_context *)0)->context - (char *)&((struct verbs_context *)0)->sz)",
            VCTX_SZ_BACK,
        ),
        ("offsetof(struct ibv_context, abi_compat)", CTX_ABI_COMPAT),
        ("offsetof(struct ibv_context, ops.post_send)", CTX_POST_SEND),
        (
            "sizeof(struct ibv_device_attr_ex) <= 400 ? 400 : 0",
            ATTR_EX_BYTES,
        ),
        (
            "offsetof(struct ibv_device_attr_ex, odp_caps.general_caps)",
            ATTR_EX_ODP,
        ),
        (
            "offsetof(struct ibv_device_attr_ex, odp_caps.per_transport_caps.rc_odp_caps)",
            ATTR_EX_ODP_RC,
        ),
        (
            "IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ",
            RC_SEND_RECV_WRITE_READ as usize,
        ),
        ("IBV_ACCESS_ON_DEMAND", ACCESS_ON_DEMAND as usize),
        ("IBV_ACCESS_REMOTE_WRITE", ACCESS_REMOTE_WRITE as usize),
        (
            "offsetof(struct ibv_port_attr, active_mtu)",
            PORT_ACTIVE_MTU,
        ),
        (
            "offsetof(struct ibv_port_attr, gid_tbl_len)",
            PORT_GID_TBL_LEN,
        ),
        ("sizeof(struct ibv_qp_init_attr)", QP_INIT_BYTES),
        (
            "offsetof(struct ibv_qp_init_attr, send_cq)",
            QP_INIT_SEND_CQ,
        ),
        (
            "offsetof(struct ibv_qp_init_attr, recv_cq)",
            QP_INIT_RECV_CQ,
        ),
        ("offsetof(struct ibv_qp_init_attr, cap)", QP_INIT_CAP),
        (
            "offsetof(struct ibv_qp_init_attr, qp_type)",
            QP_INIT_QP_TYPE,
        ),
        ("offsetof(struct ibv_qp, qp_num)", QP_NUM),
        ("sizeof(struct ibv_qp_attr)", QP_ATTR_BYTES),
        ("offsetof(struct ibv_qp_attr, qp_state)", QPA_STATE),
        ("offsetof(struct ibv_qp_attr, path_mtu)", QPA_PATH_MTU),
        ("offsetof(struct ibv_qp_attr, rq_psn)", QPA_RQ_PSN),
        ("offsetof(struct ibv_qp_attr, sq_psn)", QPA_SQ_PSN),
        ("offsetof(struct ibv_qp_attr, dest_qp_num)", QPA_DEST_QP_NUM),
        (
            "offsetof(struct ibv_qp_attr, qp_access_flags)",
            QPA_ACCESS_FLAGS,
        ),
        ("offsetof(struct ibv_qp_attr, ah_attr.grh.dgid)", QPA_DGID),
        (
            "offsetof(struct ibv_qp_attr, ah_attr.grh.sgid_index)",
            QPA_SGID_INDEX,
        ),
        (
            "offsetof(struct ibv_qp_attr, ah_attr.grh.hop_limit)",
            QPA_HOP_LIMIT,
        ),
        (
            "offsetof(struct ibv_qp_attr, ah_attr.is_global)",
            QPA_IS_GLOBAL,
        ),
        (
            "offsetof(struct ibv_qp_attr, ah_attr.port_num)",
            QPA_AH_PORT,
        ),
        ("offsetof(struct ibv_qp_attr, pkey_index)", QPA_PKEY_INDEX),
        (
            "offsetof(struct ibv_qp_attr, max_rd_atomic)",
            QPA_MAX_RD_ATOMIC,
        ),
        (
            "offsetof(struct ibv_qp_attr, max_dest_rd_atomic)",
            QPA_MAX_DEST_RD_ATOMIC,
        ),
        (
            "offsetof(struct ibv_qp_attr, min_rnr_timer)",
            QPA_MIN_RNR_TIMER,
        ),
        ("offsetof(struct ibv_qp_attr, port_num)", QPA_PORT),
        ("offsetof(struct ibv_qp_attr, timeout)", QPA_TIMEOUT),
        ("offsetof(struct ibv_qp_attr, retry_cnt)", QPA_RETRY_CNT),
        ("offsetof(struct ibv_qp_attr, rnr_retry)", QPA_RNR_RETRY),
        ("sizeof(struct ibv_send_wr)", SEND_WR_BYTES),
        ("offsetof(struct ibv_send_wr, sg_list)", WR_SG_LIST),
        ("offsetof(struct ibv_send_wr, num_sge)", WR_NUM_SGE),
        ("offsetof(struct ibv_send_wr, opcode)", WR_OPCODE),
        ("offsetof(struct ibv_send_wr, send_flags)", WR_SEND_FLAGS),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)",
            WR_REMOTE_ADDR,
        ),
        ("offsetof(struct ibv_send_wr, wr.rdma.rkey)", WR_RKEY),
        ("sizeof(struct ibv_wc)", WC_BYTES),
        ("offsetof(struct ibv_wc, status)", WC_STATUS),
        ("offsetof(struct ibv_mr, rkey)", MR_RKEY),
    ];
    let exprs: Vec<&str> = fields.iter().map(|(e, _)| *e).collect();
    let Some(got) = crate::bench::verbs::tests::verbs_h_values("bench-odp-offsets", &exprs) else {
        return;
    };
    for ((expr, ours), theirs) in fields.iter().zip(&got) {
        assert_eq!(ours, theirs, "{expr}");
    }
    assert_eq!(got.len(), fields.len());
}

#[test]
fn the_loopback_prefers_an_ipv4_mapped_gid() {
    let link_local = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
    let v4 = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15];
    assert_eq!(pick_gid(&[(0, link_local), (1, v4)]), Some((1, v4)));
    assert_eq!(
        pick_gid(&[(0, [0; 16]), (1, link_local)]),
        Some((1, link_local))
    );
    assert_eq!(pick_gid(&[(0, [0; 16])]), None);
}

#[test]
fn cached_lines_parse() {
    assert_eq!(
        parse_cached("4096 812.5 700 900"),
        Some((
            4096,
            Ok(Spread {
                median: 812.5,
                min: 700.0,
                max: 900.0
            })
        ))
    );
    assert_eq!(
        parse_cached("65536 - passed through: why"),
        Some((65536, Err("passed through: why".into())))
    );
    for bad in ["", "4096", "x 1 2 3", "4096 1 2", "mrcache: something"] {
        assert_eq!(parse_cached(bad), None, "{bad}");
    }
}

fn section(rc_caps: Result<u32, String>, rows: Vec<Row>) -> Section {
    Section {
        device: "rxe0".into(),
        rc_caps,
        ids: Some((0xffffff, 0, "0.0.0".into())),
        offsets: None,
        rows,
        stopped: None,
        took: Duration::from_millis(1500),
    }
}

/// A device without ODP for RC: one line, no rows, and the JSON says the same.
#[test]
fn no_on_demand_paging_is_one_line() {
    for (caps, says) in [
        (
            Ok(0),
            "rxe0 offers no explicit on-demand paging (ODP) for RC: no on-demand rows",
        ),
        (
            Ok(0b1100),
            "rxe0 pages on demand for RC only write, read (the rows need send, receive, write and read): no on-demand rows",
        ),
        (
            Err("not an extended context".to_string()),
            "rxe0's capabilities cannot be read (not an extended context): no on-demand rows",
        ),
    ] {
        let s = section(caps, vec![]);
        let t = text(&s, 1.0);
        assert_eq!(t, format!("on-demand paging: {says}\n"));
        let j = json(&s);
        assert_eq!(j["offered"], false);
        assert_eq!(j["why_none"], format!("on-demand paging: {says}"));
    }
}

/// The rows and their ratios, paired per round.
#[test]
fn rows_show_their_ratios() {
    let row = Row {
        size: 4096,
        round_ns: vec![
            [10_000.0, 5_000.0, 20_000.0, 60_000.0],
            [12_000.0, 9_000.0, 20_000.0, 40_000.0],
        ],
        cached: Ok(Spread {
            median: 500.0,
            min: 400.0,
            max: 600.0,
        }),
        cached_pinned_ns: Some(250.0),
        took: Duration::ZERO,
    };
    let x = ratios(&row);
    // Per round 0.5 and 0.75 (median 0.625), not 7000 / 11000.
    assert!((x.on_demand_over_pinned - 0.625).abs() < 1e-9);
    assert!((x.first_over_write - 2.5).abs() < 1e-9);
    assert_eq!(x.cached_over_pinned_hit, Some(2.0));
    assert_eq!(x.pinned_over_cached, Some(22.0));
    assert_eq!(x.on_demand_over_cached, Some(14.0));
    let mut none = row.clone();
    none.size = 65536;
    none.cached = Err("the cache's entry is pinned".into());
    let s = section(Ok(0b11111), vec![row, none]);
    let t = text(&s, 1.0);
    assert!(
        t.contains("rxe0 pages RC send, receive, write, read, atomic on demand"),
        "{t}"
    );
    let line = t.lines().find(|l| l.starts_with("odp 4 KiB ")).unwrap();
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        cols,
        [
            "odp",
            "4",
            "KiB",
            "11.0",
            "(10.0-12.0)",
            "7.00",
            "(5.00-9.00)",
            "0.62x",
            "20.0",
            "(20.0-20.0)",
            "50.0",
            "(40.0-60.0)",
            "2.50x",
            "0.500",
            "(0.400-0.600)",
            "2.00x",
            "22.00x/14.00x",
            "2"
        ],
        "{line}"
    );
    assert!(
        t.contains("\n  odp 64 KiB cached: the cache's entry is pinned\n"),
        "{t}"
    );
    // No line of these starts as the table's rows do (size, then local or remote).
    assert!(
        !t.lines()
            .any(|l| l.contains("KiB local") || l.contains("KiB remote"))
    );
    let j = json(&s);
    assert_eq!(j["rows"][0]["cached_over_pinned_hit"], 2.0);
    assert_eq!(j["rows"][1]["cached_us"], serde_json::Value::Null);
    assert_eq!(j["rows"][0]["first_write_us"]["median"], 50.0);
}

#[test]
fn small_sizes_get_more_writes_per_round() {
    assert_eq!(writes_per_round(4096), 8);
    assert_eq!(writes_per_round(128 << 10), 8);
    assert_eq!(writes_per_round(256 << 10), 4);
    assert_eq!(writes_per_round(1 << 20), 1);
    assert_eq!(writes_per_round(64 << 20), 1);
}

fn row(size: usize, round_ns: Vec<[f64; 4]>) -> Row {
    Row {
        size,
        round_ns,
        cached: Err("not measured".into()),
        cached_pinned_ns: None,
        took: Duration::ZERO,
    }
}

/// The profile's figures are per-round medians: of the columns, of the first write less the
/// write into the pinned registration, of the miss ratio (on-demand pair + first touch over
/// the pinned pair), each round paired with itself.
#[test]
fn figures_are_medians_of_the_rounds() {
    let r = row(
        4096,
        vec![
            // pinned, on demand, write, first write (ns)
            [10_000.0, 8_000.0, 2_000.0, 6_000.0], // touch 4000, miss 12000/10000 = 1.2
            [20_000.0, 9_000.0, 3_000.0, 4_000.0], // touch 1000, miss 10000/20000 = 0.5
            [12_000.0, 30_000.0, 5_000.0, 3_000.0], // touch -2000, miss 28000/12000 = 2.333
        ],
    );
    let f = figures(&r);
    assert_eq!(f.size, 4096);
    assert!((f.pinned_us - 12.0).abs() < 1e-9, "{f:?}");
    assert!((f.on_demand_us - 9.0).abs() < 1e-9, "{f:?}");
    assert!((f.first_touch_us - 1.0).abs() < 1e-9, "{f:?}");
    // Not the medians' ratio, (9000 + 1000) / 12000.
    assert!((f.miss_over_pinned - 1.2).abs() < 1e-9, "{f:?}");
    // An even count: the middle two's mean.
    let f = figures(&row(
        8192,
        vec![[1000.0, 500.0, 0.0, 100.0], [3000.0, 900.0, 0.0, 300.0]],
    ));
    assert!((f.pinned_us - 2.0).abs() < 1e-9 && (f.first_touch_us - 0.2).abs() < 1e-9);
    assert!(
        (f.miss_over_pinned - (0.6 + 0.4) / 2.0).abs() < 1e-9,
        "{f:?}"
    );
}

#[test]
fn the_offset_check_tells_kept_from_misplaced_from_nothing() {
    let (within, boundary) = (pattern(1), pattern(2));
    assert_ne!(within, boundary);
    assert!(within.iter().all(|&b| b != 0x5a));
    let background = || vec![0x5a_u8; 8192];
    let mut kept = background();
    kept[WITHIN..WITHIN + LEN].copy_from_slice(&within);
    kept[4096..4096 + LEN].copy_from_slice(&boundary);
    assert_eq!(
        judge(&kept, &within, &boundary),
        Ok(Offsets {
            kept: true,
            landed_at: Some(WITHIN)
        })
    );
    // rxe's on-demand copy on 7.3.4: the offset within the page dropped.
    let mut at_base = background();
    at_base[..LEN].copy_from_slice(&within);
    at_base[4096..4096 + LEN].copy_from_slice(&boundary);
    assert_eq!(
        judge(&at_base, &within, &boundary),
        Ok(Offsets {
            kept: false,
            landed_at: Some(0)
        })
    );
    // There, and also at the base: not kept.
    let mut both = kept.clone();
    both[..LEN].copy_from_slice(&within);
    assert!(!judge(&both, &within, &boundary).unwrap().kept);
    // Nowhere, while the boundary write landed.
    let mut nowhere = background();
    nowhere[4096..4096 + LEN].copy_from_slice(&boundary);
    assert_eq!(
        judge(&nowhere, &within, &boundary),
        Ok(Offsets {
            kept: false,
            landed_at: None
        })
    );
    // Nothing written at all: the check cannot tell.
    let e = judge(&background(), &within, &boundary).unwrap_err();
    assert!(
        e.contains("at a page boundary completed but is not in memory"),
        "{e}"
    );
}

fn measured(offsets: Result<Offsets, String>) -> Section {
    let mut s = section(
        Ok(0b1111),
        vec![
            row(4096, vec![[10_000.0, 9_000.0, 2_000.0, 5_000.0]; 3]), // 1.2
            row(65536, vec![[20_000.0, 12_000.0, 2_000.0, 6_000.0]; 3]), // 0.8
        ],
    );
    s.offsets = Some(offsets);
    s
}

/// The text's offsets and profile lines, the JSON's fields, and the profile itself.
#[test]
fn the_profile_and_its_lines() {
    let s = measured(Ok(Offsets {
        kept: true,
        landed_at: Some(WITHIN),
    }));
    let p = profile(&s).unwrap();
    assert_eq!((p.vendor, p.part, p.offsets_kept), (0xffffff, 0, true));
    assert_eq!(p.on_demand_from, Some(65536));
    assert_eq!(p.sizes.len(), 2);
    assert!((p.sizes[1].miss_over_pinned - 0.8).abs() < 1e-9);
    assert!(p.render().starts_with(&format!("{HEADER}\n")));
    assert_eq!(
        OdpProfile::parse(&p.render()).unwrap().on_demand_from,
        Some(65536)
    );
    let t = text(&s, 1.0);
    let lines: Vec<&str> = t.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("on-demand offsets: "))
        .unwrap();
    // After the rows.
    assert!(
        lines[..at].iter().any(|l| l.starts_with("odp 64 KiB ")),
        "{t}"
    );
    assert_eq!(
        lines[at],
        "on-demand offsets: rxe0 keeps them: 64 bytes RDMA-written at offset 100 of a fresh on-demand registration landed there"
    );
    assert_eq!(
        lines[at + 1],
        format!(
            "on-demand profile: rxe0 (vendor 0xffffff part 0 firmware \"0.0.0\", kernel {}): on demand from 65536 bytes",
            mrcache::node::running_kernel()
        )
    );
    let j = json(&s);
    assert_eq!(j["offsets_kept"], true);
    assert_eq!(
        (j["vendor"].clone(), j["part"].clone()),
        (0xffffff.into(), 0.into())
    );
    assert_eq!(j["on_demand_from"], 65536);
    assert!((j["rows"][0]["miss_over_pinned"].as_f64().unwrap() - 1.2).abs() < 1e-9);
    assert!((j["rows"][0]["first_touch_us"].as_f64().unwrap() - 3.0).abs() < 1e-9);

    let s = measured(Ok(Offsets {
        kept: false,
        landed_at: Some(0),
    }));
    let t = text(&s, 1.0);
    assert!(t.contains("\non-demand offsets: rxe0 misplaces data: 64 bytes RDMA-written at offset 100 of a fresh on-demand registration landed at offset 0\n"), "{t}");
    assert!(t.contains(&format!("\non-demand profile: rxe0 (vendor 0xffffff part 0 firmware \"0.0.0\", kernel {}): never on demand: its on-demand transfers misplace data\n", mrcache::node::running_kernel())), "{t}");
    assert!(
        profile(&s)
            .unwrap()
            .render()
            .contains("\noffsets misplaced\n")
    );
    assert_eq!(json(&s)["offsets_kept"], false);

    // The check failed: no profile, and the JSON says why.
    let s = measured(Err("an on-demand RDMA WRITE failed: status 10".into()));
    let j = json(&s);
    assert_eq!(j["offsets_kept"], serde_json::Value::Null);
    assert_eq!(j["on_demand_from"], serde_json::Value::Null);
    assert!(
        j["profile_why_not"]
            .as_str()
            .unwrap()
            .contains("on-demand writes land is not known: an on-demand RDMA WRITE failed")
    );
    assert!(
        text(&s, 1.0).contains(
            "\non-demand offsets: not known: an on-demand RDMA WRITE failed: status 10\n"
        )
    );
}

/// An empty directory of this process's for test `name`, and the profile's path in it.
fn scratch(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("mrcache-odp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("p");
    (dir, file)
}

/// No profile where the device offers no ODP or the rows stopped, in one line; nothing
/// written.
#[test]
fn no_profile_is_one_line_and_no_file() {
    let (dir, file) = scratch("profile");
    let none = section(Ok(0), vec![]);
    let e = profile::write(&none, &file).unwrap_err();
    assert_eq!(
        e,
        format!(
            "--odp-profile {}: no profile written: rxe0 offers no explicit on-demand paging (ODP) for RC: no on-demand rows",
            file.display()
        )
    );
    let mut stopped = measured(Ok(Offsets {
        kept: true,
        landed_at: Some(WITHIN),
    }));
    stopped.stopped = Some("ibv_reg_mr failed".into());
    let e = profile::write(&stopped, &file).unwrap_err();
    assert!(
        e.ends_with(": no profile written: the on-demand rows stopped: ibv_reg_mr failed"),
        "{e}"
    );
    assert!(!e.contains('\n'));
    assert!(!file.exists());
    let ok = measured(Ok(Offsets {
        kept: true,
        landed_at: Some(WITHIN),
    }));
    profile::write(&ok, &file).unwrap();
    assert_eq!(
        OdpProfile::parse(&std::fs::read_to_string(&file).unwrap()).unwrap(),
        profile(&ok).unwrap()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A profile that would not read back as measured is not written; a link planted at the
/// temporary name is not followed (the write fails, the link's target is untouched); the
/// file is replaced whole, never left partly written. Seen failing before: a firmware
/// version with a tab was written and read back as a bad profile, and the planted link's
/// target was emptied.
#[test]
fn the_profile_is_written_whole_as_it_reads_back() {
    let (dir, file) = scratch("write");
    let mut tab = measured(Ok(Offsets {
        kept: true,
        landed_at: Some(WITHIN),
    }));
    tab.ids = Some((0xffffff, 0, "1.0\tbeta".into()));
    let e = profile::write(&tab, &file).unwrap_err();
    assert!(e.contains("would not read back"), "{e}");
    assert!(!file.exists());
    let ok = measured(Ok(Offsets {
        kept: true,
        landed_at: Some(WITHIN),
    }));
    let victim = dir.join("victim");
    std::fs::write(&victim, "old").unwrap();
    let tmp = profile::temporary(&file);
    std::os::unix::fs::symlink(&victim, &tmp).unwrap();
    assert!(profile::write(&ok, &file).is_err());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "old");
    std::fs::remove_file(&tmp).unwrap();
    std::fs::write(&file, "an older profile").unwrap();
    profile::write(&ok, &file).unwrap();
    assert_eq!(
        OdpProfile::parse(&std::fs::read_to_string(&file).unwrap()).unwrap(),
        profile(&ok).unwrap()
    );
    assert!(!tmp.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
