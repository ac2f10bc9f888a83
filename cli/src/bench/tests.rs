//! Tests of `bench` (the command line's checks, the library's copies, the inherited
//! configuration).

use super::*;

#[test]
fn sizes_parse_and_bad_ones_name_what_is_allowed() {
    assert_eq!(
        parse_sizes("4k,64k,1m,16m,64m").unwrap(),
        vec![4096, 65536, 1 << 20, 16 << 20, 64 << 20]
    );
    assert_eq!(parse_sizes("1g, 100").unwrap(), vec![1 << 30, 100]);
    for bad in [
        "",
        "4k,",
        "x",
        "0",
        "2g",
        "auto",
        "unlimited",
        "-4k",
        "4k,,8k",
    ] {
        let e = parse_sizes(bad).unwrap_err();
        assert!(
            e.starts_with(&format!("--sizes \"{bad}\" is not valid")),
            "{e}"
        );
        assert!(e.contains("allowed:") && !e.contains('\n'), "{e}");
    }
    assert!(parse_sizes(&vec!["4k"; 17].join(",")).is_err());
    // The same size twice (in any spelling) would give duplicate rows.
    for dup in ["4k,4k,4k", "4k,4096", "1m,64k,1024k"] {
        let e = parse_sizes(dup).unwrap_err();
        assert!(e.contains("is given twice") && !e.contains('\n'), "{e}");
    }
}

#[test]
fn memory_check_names_what_is_mapped() {
    let gib = 1u64 << 30;
    // 1 GiB on a 2 GiB guest: 2 GiB and more mapped.
    let e = check_memory(&[1 << 30], Some(gib * 17 / 10)).unwrap_err();
    let need = memory_needed(&[1 << 30]);
    assert!(need > 2 * gib);
    assert!(
        e.contains(&format!("maps {need} bytes"))
            && e.contains("MemAvailable")
            && !e.contains('\n'),
        "{e}"
    );
    let sizes = [4096, 64 << 20];
    let need = memory_needed(&sizes);
    assert!(check_memory(&sizes, Some(need / 3 * 4 + 4096)).is_ok());
    assert!(check_memory(&sizes, Some(need)).is_err());
    assert!(check_memory(&sizes, None).is_ok());
}

#[test]
fn copies_of_the_library_are_found_in_maps() {
    for p in [
        "/a/libmrcache.so",
        "libmrcache.so.1",
        "/tmp/cp2/libmrcache-1.2.so",
    ] {
        assert!(is_libmrcache(p), "{p}");
    }
    for p in [
        "/a/libmrcachex.txt",
        "/a/mylibmrcache.so",
        "/libmrcache/x.so",
        "",
    ] {
        assert!(!is_libmrcache(p), "{p}");
    }
    let maps = "7f00-7f01 r--p 00000000 08:01 12 /w/target/release/libmrcache.so\n\
                7f01-7f02 r-xp 00001000 08:01 12 /w/target/release/libmrcache.so\n\
                7f02-7f03 rw-p 00000000 00:00 0 \n\
                7f03-7f04 r--p 00000000 08:01 99 /tmp/cp2/libmrcache.so\n\
                7f04-7f05 r--p 00000000 08:01 7 /usr/lib/libibverbs.so.1.14\n";
    assert_eq!(
        mapped_copies(maps),
        vec!["/w/target/release/libmrcache.so", "/tmp/cp2/libmrcache.so"]
    );
    assert_eq!(
        mapped_copies(&maps.lines().take(3).collect::<Vec<_>>().join("\n")).len(),
        1
    );
}

#[test]
fn inherited_variables_fail_or_are_not_applied() {
    let v = |k: &str, x: &str| (k.to_string(), x.to_string());
    let e = inherited(&[v("MRCACHE_ENABLE", "0")]).unwrap_err();
    assert!(e.contains("MRCACHE_ENABLE") && !e.contains('\n'), "{e}");
    let e = inherited(&[v("MRCACHE_MAX_BYTES", "garbage")]).unwrap_err();
    assert!(
        e.starts_with("MRCACHE_MAX_BYTES=\"garbage\" is not valid") && e.contains("unset it"),
        "{e}"
    );
    // A valid cap is not applied: the figures are the default's.
    assert_eq!(
        inherited(&[
            v("MRCACHE_MAX_BYTES", "1m"),
            v("MRCACHE_BIN", "/x"),
            v("MRCACHE_ADMIT", "auto")
        ])
        .unwrap(),
        vec!["MRCACHE_MAX_BYTES", "MRCACHE_ADMIT"]
    );
    assert!(inherited(&[v("MRCACHE_PRELOAD", "/x")]).unwrap().is_empty());
}

#[test]
fn the_control_runs_without_any_copy_of_the_library() {
    let p = |s: &str| preload_without_us(Some(OsString::from(s)));
    assert_eq!(p("/w/libmrcache.so"), None);
    assert_eq!(
        p("/a/libjemalloc.so.2:/w/libmrcache.so /tmp/cp2/libmrcache.so.1"),
        Some(OsString::from("/a/libjemalloc.so.2"))
    );
    assert_eq!(p(""), None);
    assert_eq!(preload_without_us(None), None);
    // The library under another name, through a symbolic link (libfoo.so).
    let dir = std::env::temp_dir().join(format!("mrcache-bench-link-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let lib = dir.join("libmrcache.so");
    std::fs::write(&lib, b"").unwrap();
    let link = dir.join("libfoo.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&lib, &link).unwrap();
    let link = link.to_str().unwrap().to_string();
    assert_eq!(
        p(&format!("/a/libjemalloc.so.2:{link}")),
        Some(OsString::from("/a/libjemalloc.so.2"))
    );
    // When it loads anyway (a copy under another name), the error names the entries.
    let e = preloaded_in_control(&format!("/a/libjemalloc.so.2:{link}"));
    assert!(
        e.contains(&format!("entry {link}: remove {link} from LD_PRELOAD")) && !e.contains('\n'),
        "{e}"
    );
    let e = preloaded_in_control("/a/libjemalloc.so.2:/b/libcopy.so");
    assert!(
        e.contains("LD_PRELOAD=/a/libjemalloc.so.2:/b/libcopy.so")
            && e.ends_with("remove it from LD_PRELOAD"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn seconds_parse() {
    assert_eq!(parse_seconds("1").unwrap(), 1.0);
    assert_eq!(parse_seconds("0.5").unwrap(), 0.5);
    for bad in ["0", "-1", "x", "", "1e9", "nan", "inf", "0.01"] {
        assert!(
            parse_seconds(bad)
                .unwrap_err()
                .contains("allowed: a number of seconds"),
            "{bad}"
        );
    }
}

#[test]
fn memlock_check_names_the_value_needed() {
    let sizes = [4096, 64 << 20];
    let need = memlock_needed(&sizes);
    // Two 64 MiB entries under a cap of 3/4 of the limit, one more 64 MiB registration
    // awaiting its deregistration, and the hit regions.
    assert!(need as f64 * 0.75 >= (2 * (64 << 20) + HIT_REGIONS * HIT_REGION_BYTES) as f64);
    assert!(need >= (8 * (64 << 20)) / 3 + (64 << 20));
    assert!(need < 256 << 20);
    let e = check_memlock(&sizes, Memlock::Limit(65536)).unwrap_err();
    assert_eq!(
        e,
        format!(
            "RLIMIT_MEMLOCK is 65536 bytes (ulimit -l 64); mrcache bench --sizes up to 64 MiB needs {need} bytes (ulimit -l {}): raise it or give smaller --sizes",
            need / 1024
        )
    );
    assert!(check_memlock(&sizes, Memlock::Limit(need)).is_ok());
    assert!(check_memlock(&sizes, Memlock::Limit(need - 1)).is_err());
    for m in [Memlock::Unlimited, Memlock::CapIpcLock, Memlock::Unknown] {
        assert!(check_memlock(&sizes, m).is_ok());
    }
}

#[test]
fn the_profile_goes_into_an_existing_directory() {
    use std::path::Path;
    assert_eq!(check_profile_dir(Path::new("p")), Ok(()));
    assert_eq!(check_profile_dir(Path::new("/tmp/p")), Ok(()));
    assert_eq!(
        check_profile_dir(Path::new("/nonexistent-mrcache/p")),
        Err("--odp-profile /nonexistent-mrcache/p: /nonexistent-mrcache is not a directory; allowed: a file in an existing directory".into())
    );
}
