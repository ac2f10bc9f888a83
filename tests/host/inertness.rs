//! In a process that never touches verbs the library is invisible: the same output and exit
//! status for ordinary programs, no thread started, libibverbs not loaded, nothing printed,
//! nothing written (even with every logging and statistics variable set, even with bad
//! values). And the launcher composes with an existing LD_PRELOAD and passes the program's
//! exit status through.

use crate::common::{launcher, lib};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn run(args: &[&str], preload: bool, env: &[(&str, &str)], stdin: &str) -> Output {
    let mut cmd = Command::new(args[0]);
    cmd.args(&args[1..])
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    if preload {
        cmd.env("LD_PRELOAD", lib());
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{}: {e}", args[0]));
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Every logging and statistics knob on, pointing into `dir`.
fn noisy_env(dir: &std::path::Path) -> Vec<(&'static str, String)> {
    vec![
        ("MRCACHE_LOG", "trace".into()),
        ("MRCACHE_LOG_FILE", dir.join("log.%p").display().to_string()),
        ("MRCACHE_STATS", "json".into()),
        (
            "MRCACHE_STATS_FILE",
            dir.join("stats.%p").display().to_string(),
        ),
    ]
}

#[test]
fn ordinary_programs_behave_identically() {
    let dir = tempdir("ordinary");
    let env = noisy_env(&dir);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let input: String = (0..5000)
        .map(|i| format!("{}\n", (i * 7919) % 10007))
        .collect();
    let programs: &[(&[&str], &str)] = &[
        (&["sh", "-c", "echo out; echo err >&2; exit 3"], ""),
        (&["ls", "-la", "/usr/include/infiniband"], ""),
        (&["sort", "-n"], &input),
        (&["sh", "-c", "gzip -c | gunzip | md5sum"], &input),
        (
            &[
                "python3",
                "-c",
                "import json,sys; print(json.dumps({'a': list(range(5))})); sys.exit(5)",
            ],
            "",
        ),
        (&["git", "--version"], ""),
        (&["awk", "{ s += $1 } END { print s }"], &input),
        (&["sh", "-c", "false"], ""),
    ];
    for (args, stdin) in programs {
        let plain = run(args, false, &[], stdin);
        let pre = run(args, true, &env, stdin);
        assert_eq!(
            plain.status.code(),
            pre.status.code(),
            "{args:?}: exit status differs"
        );
        assert_eq!(plain.stdout, pre.stdout, "{args:?}: stdout differs");
        assert_eq!(plain.stderr, pre.stderr, "{args:?}: stderr differs");
    }
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "a process without verbs wrote files"
    );
}

#[test]
fn no_thread_no_libibverbs_nothing_printed() {
    let dir = tempdir("quiet");
    let mut env = noisy_env(&dir);
    env.push(("MRCACHE_MAX_BYTES", "4X".into())); // a bad value: reported only at a verbs call
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = run(
        &[
            "python3",
            "-c",
            "import os; print(len(os.listdir('/proc/self/task')))",
        ],
        true,
        &env,
        "",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "1",
        "a thread was started"
    );
    assert!(
        out.stderr.is_empty(),
        "printed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(
        &["sh", "-c", "grep -c libibverbs /proc/$$/maps; true"],
        true,
        &env,
        "",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "0",
        "libibverbs was loaded"
    );
    let out = run(
        &["grep", "-c", "libmrcache", "/proc/self/maps"],
        true,
        &env,
        "",
    );
    assert_ne!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "0",
        "the library was not even loaded"
    );
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "files were written"
    );
}

#[test]
fn launcher_composes_with_ld_preload_and_passes_the_exit_status() {
    let mrcache = launcher();
    let other = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
    let out = Command::new(&mrcache)
        .args(["run", "--", "sh", "-c", "echo \"$LD_PRELOAD\"; exit 7"])
        .env("LD_PRELOAD", other)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "the program's exit status");
    let lib = std::fs::canonicalize(lib()).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{}:{other}", lib.display())
    );

    let out = Command::new(&mrcache)
        .args(["run", "--max-bytes", "4X", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("MRCACHE_MAX_BYTES") && err.contains("4X") && err.contains("allowed"),
        "{err}"
    );

    let out = Command::new(&mrcache)
        .args([
            "run",
            "--stats",
            "json",
            "--log",
            "info",
            "--",
            "sh",
            "-c",
            "env | grep -E '^MRCACHE_(LOG|STATS)=' | sort",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "MRCACHE_LOG=info\nMRCACHE_STATS=json\n"
    );
}

fn tempdir(tag: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("inert-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Root in a user namespace of its own (a rootless container, `unshare -r`) has
/// CAP_IPC_LOCK in its effective set, but the kernel honours it only in the initial
/// namespace: its pins are charged against RLIMIT_MEMLOCK all the same, so the default byte
/// cap must stay under that limit and `mrcache info` must say the limit applies.
#[test]
fn cap_ipc_lock_in_a_user_namespace_does_not_lift_the_memlock_cap() {
    let script = format!(
        "ulimit -l 64 && grep CapEff /proc/self/status && exec {} info",
        launcher().display()
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["--user", "--map-root-user", "sh", "-c", &script]);
    for v in mrcache::node::LAUNCHER_VARIABLES
        .iter()
        .chain(&["MRCACHE_MAX_BYTES"])
    {
        cmd.env_remove(v);
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains("CapEff:") {
        // No user namespaces here (kernel or container policy): nothing to check.
        eprintln!(
            "skipped: unshare --user failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    assert!(text.contains("RLIMIT_MEMLOCK: 65536 bytes"), "{text}");
    assert!(text.contains("max bytes: 49152 "), "{text}");
}
