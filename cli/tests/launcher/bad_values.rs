//! What the launcher tells a user before the program runs: a bad inherited `MRCACHE_*`
//! value (one line, then the program runs anyway), and `mrcache info` marking a bad value in
//! its table row.

use std::process::Command;

fn mrcache() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mrcache"));
    c.env_remove("LD_PRELOAD");
    for (k, _) in std::env::vars() {
        if k.starts_with("MRCACHE_") {
            c.env_remove(k);
        }
    }
    c
}

#[test]
fn run_reports_a_bad_inherited_value_and_still_runs() {
    let out = mrcache()
        .env("MRCACHE_MAX_ENTRIES", "banana")
        .args(["run", "--", "sh", "-c", "echo ran; exit 3"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    assert_eq!(out.status.code(), Some(3), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("MRCACHE_MAX_ENTRIES=\"banana\"")
            && lines[0].contains("allowed: a positive integer, or unlimited"),
        "{err}"
    );
    // A good value, or one an option overrides, says nothing.
    let out = mrcache()
        .env("MRCACHE_MAX_ENTRIES", "banana")
        .args(["run", "--max-entries", "5", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    assert!(out.status.success());
}

#[test]
fn info_marks_an_invalid_value_in_its_row() {
    let out = mrcache()
        .env("MRCACHE_MAX_ENTRIES", "banana")
        .env("MRCACHE_FORK", "keep")
        .arg("info")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let row = |name: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no row for {name}:\n{text}"))
            .to_string()
    };
    let bad = row("MRCACHE_MAX_ENTRIES");
    assert!(bad.contains("banana") && bad.contains("INVALID"), "{bad}");
    let good = row("MRCACHE_FORK");
    assert!(good.contains("keep") && !good.contains("INVALID"), "{good}");
}

/// Another program's variable that is not UTF-8 is none of our business: `run` still runs
/// the program and `info` still prints. A non-UTF-8 `MRCACHE_*` value is a bad value.
#[test]
fn a_non_utf8_environment_does_not_stop_the_launcher() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let not_utf8 = OsStr::from_bytes(b"\xff");
    let out = mrcache()
        .env("SOMEONE_ELSES", not_utf8)
        .args(["run", "--", "sh", "-c", "echo ran"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n", "{err}");
    assert_eq!(err, "");
    let out = mrcache()
        .env("MRCACHE_MAX_ENTRIES", not_utf8)
        .args(["run", "--", "sh", "-c", "echo ran"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n", "{err}");
    assert!(err.contains("MRCACHE_MAX_ENTRIES="), "{err}");
    let out = mrcache()
        .env("SOMEONE_ELSES", not_utf8)
        .env("MRCACHE_MAX_ENTRIES", not_utf8)
        .arg("info")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("MRCACHE_MAX_ENTRIES"),
        "{}{text}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The library named by MRCACHE_LIB or --lib must be an ELF shared object exporting
/// `mrcache_version`; otherwise one line names where the path came from and what is wrong,
/// and the program does not run (a `/bin/true` ran it uncached with only ld.so's complaint).
#[test]
fn a_bad_library_path_is_refused_naming_its_source() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("launcher-badlib");
    let _ = std::fs::create_dir_all(&dir);
    let tiny = dir.join("libmrcache.so");
    std::fs::write(&tiny, b"\x7fELF").unwrap();
    let cases: [(&str, Option<&str>, &str, &str); 5] = [
        (
            "MRCACHE_LIB",
            Some("/bin/true"),
            "MRCACHE_LIB=/bin/true",
            "mrcache_version",
        ),
        (
            "MRCACHE_LIB",
            Some(tiny.to_str().unwrap()),
            "MRCACHE_LIB=",
            "not an ELF",
        ),
        ("MRCACHE_LIB", Some(""), "MRCACHE_LIB is empty", ""),
        (
            "MRCACHE_LIB",
            Some("/nonexistent/libmrcache.so"),
            "MRCACHE_LIB=/nonexistent/libmrcache.so",
            "No such file",
        ),
        (
            "--lib",
            None,
            "--lib /usr/lib/x86_64-linux-gnu/libc.so.6",
            "mrcache_version",
        ),
    ];
    for (source, value, names, why) in cases {
        let mut c = mrcache();
        match value {
            Some(v) => {
                c.env("MRCACHE_LIB", v)
                    .args(["run", "--", "sh", "-c", "echo ran"]);
            }
            None => {
                c.args([
                    "run",
                    "--lib",
                    "/usr/lib/x86_64-linux-gnu/libc.so.6",
                    "--",
                    "sh",
                    "-c",
                    "echo ran",
                ]);
            }
        }
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{source}={value:?}: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "",
            "{source}={value:?} ran the program: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{source}={value:?}: {err}");
        assert!(
            err.contains(names) && err.contains(why),
            "{source}={value:?}: {err}"
        );
    }
}
