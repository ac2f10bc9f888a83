use super::*;

fn figures(size: u64, miss_over_pinned: f64) -> SizeFigures {
    SizeFigures {
        size,
        rounds: MIN_ROUNDS,
        pinned_us: 10.0,
        on_demand_us: 5.0,
        first_touch_us: 1.0,
        miss_over_pinned,
        miss_over_pinned_min: miss_over_pinned,
        miss_over_pinned_max: miss_over_pinned,
    }
}

fn profile() -> OdpProfile {
    OdpProfile {
        device: "mlx5_0".into(),
        vendor: 0x02c9,
        part: 4129,
        firmware: "16.35.2000".into(),
        kernel: "6.1.0-28-amd64".into(),
        offsets_kept: true,
        sizes: vec![figures(4096, 1.8), figures(1 << 20, 0.5)],
        on_demand_from: Some(1 << 20),
    }
}

#[test]
fn on_demand_from_the_smallest_size_of_the_paying_tail() {
    let s = [
        figures(1 << 20, 0.6),
        figures(4096, 0.9),
        figures(65536, 1.2),
        figures(1 << 24, 0.4),
    ];
    assert_eq!(on_demand_from(&s), Some(1 << 20));
    assert_eq!(on_demand_from(&s[..2]), Some(4096));
    assert_eq!(
        on_demand_from(&[figures(4096, 0.5), figures(65536, 1.0)]),
        None
    );
    assert_eq!(on_demand_from(&[]), None);
}

#[test]
fn a_size_pays_only_over_enough_rounds_and_a_ratio_above_zero() {
    let few = SizeFigures {
        rounds: MIN_ROUNDS - 1,
        ..figures(1 << 20, 0.5)
    };
    assert_eq!(on_demand_from(&[figures(4096, 0.5), few]), None);
    assert_eq!(
        on_demand_from(&[figures(4096, 0.5), figures(65536, -12.7)]),
        None
    );
    assert_eq!(
        on_demand_from(&[figures(4096, 0.0), figures(65536, 0.7)]),
        Some(65536)
    );
    let one_round_over = SizeFigures {
        miss_over_pinned_max: 1.4,
        ..figures(1 << 20, 0.5)
    };
    assert_eq!(on_demand_from(&[one_round_over]), None, "a round at 1.4");
    let one_round_under = SizeFigures {
        miss_over_pinned_min: -3.0,
        ..figures(1 << 20, 0.5)
    };
    assert_eq!(on_demand_from(&[one_round_under]), None, "a round at -3");
}

#[test]
fn a_rendered_profile_reads_back() {
    let mut p = profile();
    // Figures as measured, not round: each must read back exactly.
    p.sizes[0].pinned_us = 29.412_345_678_9;
    p.sizes[0].on_demand_us = 1.0 / 3.0;
    p.sizes[0].first_touch_us = -2_840.447_123;
    p.sizes[0].miss_over_pinned_min = 0.999_96;
    assert_eq!(OdpProfile::parse(&p.render()), Ok(p.clone()));
    let never = OdpProfile {
        offsets_kept: false,
        on_demand_from: None,
        ..p
    };
    assert_eq!(OdpProfile::parse(&never.render()), Ok(never));
}

#[test]
fn pays_needs_kept_offsets_and_the_size() {
    let p = profile();
    assert!(!p.pays(4096));
    assert!(!p.pays((1 << 20) - 1));
    assert!(p.pays(1 << 20));
    assert!(p.pays(1 << 30));
    let misplaced = OdpProfile {
        offsets_kept: false,
        ..p.clone()
    };
    assert!(!misplaced.pays(1 << 30));
    let never = OdpProfile {
        on_demand_from: None,
        ..p
    };
    assert!(!never.pays(u64::MAX));
}

#[test]
fn bad_profiles_say_which_line_and_what_is_allowed() {
    let good = profile().render();
    let cases: &[(&str, &str, &str)] = &[
        (
            "offsets kept",
            "offsets maybe",
            "line 9: offsets \"maybe\": allowed: kept, misplaced",
        ),
        ("vendor 0x2c9", "vendor 0xzz", "allowed: a 32-bit id"),
        (
            "on-demand-from 1048576",
            "on-demand-from 0",
            "allowed: a positive byte count, or never",
        ),
        ("part 4129", "part 4129\npart 1", "a second part line"),
        ("device mlx5_0\n", "", "no device line"),
        (
            "offsets kept",
            "offsets kept\ncolour blue",
            "unknown item \"colour\"",
        ),
        (
            HEADER,
            "mrcache on-demand profile 2",
            "is not \"mrcache on-demand profile 1\"",
        ),
        (
            "size 4096 rounds 3 pinned_us",
            "size 4096 rounds 3 pinnd_us",
            "allowed: BYTES rounds N",
        ),
    ];
    for (from, to, want) in cases {
        assert!(good.contains(from), "{from}");
        let text = good.replacen(from, to, 1);
        let e = OdpProfile::parse(&text).unwrap_err();
        assert!(e.contains(want), "{from} -> {to}: {e}");
    }
    assert!(OdpProfile::parse("").unwrap_err().contains("empty"));
    assert!(
        OdpProfile::parse("# only a comment\n")
            .unwrap_err()
            .contains("empty")
    );
}

#[test]
fn the_summary_says_what_auto_does() {
    let p = profile();
    assert_eq!(
        p.summary(),
        "mlx5_0 (vendor 0x2c9 part 4129 firmware \"16.35.2000\", kernel 6.1.0-28-amd64): on demand from 1048576 bytes"
    );
    let misplaced = OdpProfile {
        offsets_kept: false,
        ..p
    };
    assert!(misplaced.summary().contains("never on demand"));
}

#[test]
fn ids_are_digits_only_and_names_printable() {
    let good = profile().render();
    for (from, to) in [
        ("vendor 0x2c9", "vendor 0x+2c9"),
        ("part 4129", "part +4129"),
        ("device mlx5_0", "device mlx5_0\u{1b}[2J"),
        ("kernel 6.1.0-28-amd64", "kernel \u{7}"),
        ("kernel 6.1.0-28-amd64\n", ""),
    ] {
        assert!(good.contains(from), "{from}");
        let text = good.replacen(from, to, 1);
        assert!(OdpProfile::parse(&text).is_err(), "{to:?} accepted");
    }
    let no_fw = good.replacen("firmware 16.35.2000", "firmware", 1);
    assert_eq!(OdpProfile::parse(&no_fw).unwrap().firmware, "");
}

#[test]
fn an_error_quotes_at_most_sixty_characters() {
    let long = "x".repeat(100_000);
    let text = profile()
        .render()
        .replacen("offsets kept", &format!("offsets {long}"), 1);
    let e = OdpProfile::parse(&text).unwrap_err();
    assert!(e.len() < 200, "{} bytes", e.len());
    let e = OdpProfile::parse(&long).unwrap_err();
    assert!(e.len() < 200, "{} bytes", e.len());
}

#[test]
fn a_profile_holds_under_its_own_kernel_and_firmware() {
    let p = profile();
    assert!(p.matches(0x2c9, 4129, "16.35.2000"));
    assert!(!p.matches(0x2c9, 4129, "16.35.2004"));
    assert!(!p.matches(0x2c9, 4130, "16.35.2000"));
    assert_eq!(p.verdict_under("6.1.0-28-amd64"), p.summary());
    assert!(p.verdict_under("7.3.4+deb13-amd64").ends_with(
        "not used: this is kernel 7.3.4+deb13-amd64 (measure again with mrcache bench --odp-profile)"
    ));
}
