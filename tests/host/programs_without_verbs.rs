//! The inertness suite: programs that never call verbs, run with and without the preload
//! (`LD_PRELOAD=libmrcache.so`, the patch monitor, every logging and statistics variable
//! set), must end with the same exit status and print the same bytes on stdout and stderr,
//! and the preloaded runs must write no file. The programs are in `tests/c/host/prog_*`:
//! a C++ program whose static objects run threads from static initialisation until exit,
//! python3 (threads, mmap, fork, multiprocessing, subprocess, ctypes), a bash script,
//! jemalloc purging and unmapping under threads (preloaded before and after us), a program
//! with its own `pthread_atfork` handlers forking from several threads, and fork/exec-heavy
//! shell loops. Each program's output depends only on its work, never on timing, so any
//! difference is the preload's doing. Each test prints its run count and time
//! (`cargo test --release --test host -- programs_without_verbs --nocapture`).

use crate::common;

use common::{lib, noisy_env, tempdir};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
/// A run that takes longer than this has hung (the slowest takes well under a second).
const HUNG: Duration = Duration::from_secs(60);

fn program_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c/host")
        .join(name)
}

/// Builds `tests/c/host/SRC` with `compiler` (cc or g++) and the project's warning flags.
fn build(compiler: &str, src: &str, out: &str, flags: &[&str]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("programs_without_verbs");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(out);
    let st = Command::new(compiler)
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-o"])
        .arg(&out)
        .arg(program_source(src))
        .args(flags)
        .status()
        .unwrap_or_else(|e| panic!("{compiler}: {e} (ci/install-deps.sh installs it)"));
    assert!(st.success(), "{compiler} {src} failed");
    out
}

/// Runs `argv` with `env` and, when given, `LD_PRELOAD=preload`; no inherited `LD_PRELOAD`
/// or `MRCACHE_*` variable. Panics when it runs longer than `HUNG`.
fn run(argv: &[&str], env: &[(String, String)], preload: Option<&str>) -> Output {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..])
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("MRCACHE_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    if let Some(p) = preload {
        cmd.env("LD_PRELOAD", p);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let reader = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            pipe.read_to_end(&mut v).unwrap();
            v
        })
    };
    let out = reader(Box::new(child.stdout.take().unwrap()));
    let err = reader(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > HUNG {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{argv:?} (LD_PRELOAD={preload:?}) hung: killed after {HUNG:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn describe(o: &Output) -> String {
    format!(
        "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// One program of the suite: what to run and its environment (both variants).
struct Guest<'a> {
    name: &'a str,
    argv: &'a [&'a str],
    env: Vec<(String, String)>,
    /// `LD_PRELOAD` of the plain run (jemalloc alone), if any.
    baseline: Option<&'a str>,
}

/// Runs `g` plainly twice (the reference; both must agree, or the program is not
/// deterministic and proves nothing), then `runs` times under each preload value in
/// `preloads`, with the noisy environment: every run must equal the reference, and no file
/// may appear in the noisy directory. Returns the number of preloaded runs and their time.
fn compare(g: &Guest, preloads: &[String], runs: usize) -> (usize, Duration) {
    let plain = run(g.argv, &g.env, g.baseline);
    let again = run(g.argv, &g.env, g.baseline);
    assert!(
        plain == again,
        "{}: two plain runs differ, the program is not deterministic:\n{}\n=== vs ===\n{}",
        g.name,
        describe(&plain),
        describe(&again)
    );
    let noisy = tempdir(&format!("noisy-{}", g.name));
    let mut env = g.env.clone();
    env.extend(noisy_env(&noisy));
    // A bad value: reported only at a verbs call, so never here.
    env.push(("MRCACHE_MAX_BYTES".into(), "4X".into()));
    let start = Instant::now();
    let mut differ = Vec::new();
    for p in preloads {
        for i in 0..runs {
            let pre = run(g.argv, &env, Some(p));
            if pre != plain {
                differ.push((p.clone(), i, pre));
            }
        }
    }
    let took = start.elapsed();
    let total = preloads.len() * runs;
    if let Some((p, i, first)) = differ.first() {
        let mut statuses = std::collections::BTreeMap::new();
        for (_, _, o) in &differ {
            *statuses.entry(o.status.to_string()).or_insert(0) += 1;
        }
        panic!(
            "{}: {} of {total} preloaded runs differ from the plain run ({statuses:?}); the \
             first (run {i}, LD_PRELOAD={p}):\n{}\n=== plain ===\n{}",
            g.name,
            differ.len(),
            describe(first),
            describe(&plain)
        );
    }
    let written: Vec<_> = std::fs::read_dir(&noisy)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        written.is_empty(),
        "{}: a process without verbs wrote {written:?}",
        g.name
    );
    println!(
        "{}: {total} preloaded runs in {:.1} s, all identical to the plain run ({})",
        g.name,
        took.as_secs_f64(),
        plain.status
    );
    (total, took)
}

fn ours() -> String {
    let l = lib();
    assert!(
        l.is_file(),
        "{} not built: cargo build --release --workspace first",
        l.display()
    );
    l.display().to_string()
}

/// Static `std::thread`s started by global constructors run new/delete, vector growth,
/// realloc (mremap), mmap/munmap/madvise/mremap while main runs, joined by the static
/// destructors at exit: 200 preloaded runs.
#[test]
fn cxx_static_threads() {
    let prog = build("g++", "prog_static_threads.cpp", "prog_static_threads", &[]);
    let argv = [prog.to_str().unwrap()];
    let g = Guest {
        name: "cxx_static_threads",
        argv: &argv,
        env: vec![],
        baseline: None,
    };
    compare(&g, &[ours()], 200);
}

/// The same static threads in a C++ shared library the program links (DT_NEEDED), as a
/// thread pool or tracing library would be: its constructors start the threads before
/// libmrcache.so's constructor runs, which patches libc's munmap/madvise under them.
/// When that patching raced the threads, 14 and then 18 of 200 runs died (14 SIGSEGV,
/// 4 SIGILL; gdb: a worker's `free` -> `munmap_chunk` -> `munmap+7`, returning from the
/// system call into the middle of the jump written over the stub).
#[test]
fn cxx_static_threads_in_a_needed_library() {
    let lib = build(
        "g++",
        "prog_static_threads.cpp",
        "libprog_static_threads.so",
        &["-shared", "-fPIC", "-DAS_LIBRARY"],
    );
    let dir = lib.parent().unwrap().display().to_string();
    let prog = build(
        "cc",
        "prog_static_threads_main.c",
        "prog_static_threads_main",
        &[
            &format!("-L{dir}"),
            "-lprog_static_threads",
            &format!("-Wl,-rpath,{dir}"),
        ],
    );
    let argv = [prog.to_str().unwrap()];
    let g = Guest {
        name: "cxx_static_threads_in_a_needed_library",
        argv: &argv,
        env: vec![],
        baseline: None,
    };
    compare(&g, &[ours()], 200);
}

/// python3: threads with large bytearrays, the mmap module, os.fork, multiprocessing
/// (fork, spawn, forkserver), subprocess, posix_spawn, ctypes calling libc's
/// mmap/madvise/munmap; exits 7.
#[test]
fn python_threads_mmap_fork_ctypes() {
    let src = program_source("prog_python.py");
    let argv = ["python3", src.to_str().unwrap()];
    let g = Guest {
        name: "python",
        argv: &argv,
        env: vec![],
        baseline: None,
    };
    compare(&g, &[ours()], 10);
}

/// bash: pipelines, subshells, command substitution, background jobs and wait, traps,
/// large variables; exits 5.
#[test]
fn bash_script() {
    let src = program_source("prog_bash.sh");
    let jobs = tempdir("bash-jobs");
    let argv = ["bash", src.to_str().unwrap()];
    let g = Guest {
        name: "bash",
        argv: &argv,
        env: vec![("JOBS_DIR".into(), jobs.display().to_string())],
        baseline: None,
    };
    compare(&g, &[ours()], 20);
}

/// jemalloc (preloaded) under 4 threads allocating and freeing large blocks, with its
/// default settings, with immediate purging (madvise), and with retain:false (munmap);
/// against jemalloc alone, with libmrcache.so after it and before it in LD_PRELOAD.
#[test]
fn jemalloc_both_orders() {
    if !Path::new(JEMALLOC).is_file() {
        println!("skipped: no {JEMALLOC} (ci/install-deps.sh installs libjemalloc2)");
        return;
    }
    let prog = build("cc", "prog_jemalloc.c", "prog_jemalloc", &["-ldl"]);
    let argv = [prog.to_str().unwrap()];
    let ours = ours();
    let orders = [format!("{JEMALLOC} {ours}"), format!("{ours} {JEMALLOC}")];
    for (name, conf) in [
        ("jemalloc_default", None),
        (
            "jemalloc_purge_madvise",
            Some("dirty_decay_ms:0,muzzy_decay_ms:0"),
        ),
        (
            "jemalloc_purge_munmap",
            Some("retain:false,dirty_decay_ms:0,muzzy_decay_ms:0"),
        ),
    ] {
        let g = Guest {
            name,
            argv: &argv,
            env: conf
                .map(|c| vec![("MALLOC_CONF".into(), c.into())])
                .unwrap_or_default(),
            baseline: Some(JEMALLOC),
        };
        compare(&g, &orders, 5);
    }
}

/// A program's own three `pthread_atfork` handler sets (each allocating, mapping and
/// unmapping) log their order through 20 forks on a fixed schedule over 4 threads, then 40
/// concurrent forks; exits 3.
#[test]
fn own_atfork_handlers() {
    let prog = build("cc", "prog_atfork.c", "prog_atfork", &[]);
    let argv = [prog.to_str().unwrap()];
    let g = Guest {
        name: "atfork",
        argv: &argv,
        env: vec![],
        baseline: None,
    };
    compare(&g, &[ours()], 100);
}

/// Fork/exec-heavy shell: 200 `/bin/true` from a loop, and `xargs -P2` running 300 shells.
#[test]
fn fork_exec_heavy() {
    let loop_ = [
        "sh",
        "-c",
        "for i in $(seq 200); do /bin/true || exit 1; done; echo ran $i",
    ];
    let xargs = [
        "sh",
        "-c",
        "seq 1 300 | xargs -P2 -n1 sh -c 'echo $(($1 * $1))' _ | sort -n | md5sum",
    ];
    for (name, argv) in [("sh_loop_true", &loop_), ("xargs_p2", &xargs)] {
        let g = Guest {
            name,
            argv,
            env: vec![],
            baseline: None,
        };
        compare(&g, &[ours()], 5);
    }
}
