//! fork() in programs that bring their own `pthread_atfork` handlers: no fork
//! may deadlock, whatever those handlers do or hold, and the fork guarantees stay. Host
//! tests with a fake verbs provider (tests/c/host/fork_fake.h) and, behind libmrcache.so,
//! a stand-in for libibverbs (tests/c/host/fork_shim.c: passthrough reg/dereg, and
//! ibv_dontfork_range / ibv_dofork_range that record what they are given). Every program
//! bounds itself (alarm() in parent and child, or a timer where SIGALRM is the program's),
//! and runs under `timeout -s KILL` (30 s unless said).

use crate::common;

use common::text;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fork_with_atfork_handlers")
}

/// The shim and `prog` built for `name` (one binary per test: tests run in parallel, and
/// exec of a file another test is still writing fails with ETXTBSY).
fn programs(prog: &str, name: &str) -> (PathBuf, PathBuf) {
    let libs = ["-libverbs", "-ldl", "-lpthread"];
    common::shim_and_program("host", "fork_shim", prog, &dir(), name, &libs)
}

/// How a run ended, in words (`timeout` passes a signal that killed the program on by
/// killing itself with it).
fn ending(out: &Output) -> Option<String> {
    let st = out.status;
    match (st.code(), st.signal()) {
        (Some(0), _) => None,
        (Some(1), _) => Some("broken".into()),
        (Some(3), _) => Some("set-up failed".into()),
        (_, Some(libc::SIGALRM)) => Some("hung (killed by its own alarm)".into()),
        (_, Some(libc::SIGVTALRM)) => Some("hung (killed by its own bound)".into()),
        (_, Some(libc::SIGKILL)) => Some("hung (killed by the timeout)".into()),
        _ => Some(format!("failed ({st})")),
    }
}

/// Runs `prog args` preloaded (libmrcache.so, then the shim) with `env`, killed after 30 s.
fn run(prog: &str, name: &str, args: &[&str], env: &[(&str, &str)]) -> (Option<String>, String) {
    run_for(30, prog, name, args, env)
}

/// `run`, killed after `limit` seconds.
fn run_for(
    limit: u32,
    prog: &str,
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Option<String>, String) {
    let (shim, prog) = programs(prog, name);
    let out = Command::new("timeout")
        .args(["-s", "KILL", &limit.to_string()])
        .arg(&prog)
        .args(args)
        .env("LD_PRELOAD", common::preload_with(&shim))
        .env("MRCACHE_MONITOR", "patch")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (ending(&out), text(&out))
}

fn passes(prog: &str, name: &str, args: &[&str], env: &[(&str, &str)]) {
    let (why, out) = run(prog, name, args, env);
    if let Some(why) = why {
        panic!("{prog} {args:?} {env:?}: {why}:\n{out}");
    }
}

fn handler_call(place: &str, call: &str) {
    passes(
        "fork_handlers",
        &format!("{place}_{call}"),
        &[place, call],
        &[],
    );
}

#[test]
fn registration_in_prepare_handler() {
    handler_call("prepare", "reg");
}

#[test]
fn registration_in_parent_handler() {
    handler_call("parent", "reg");
}

#[test]
fn registration_in_child_handler() {
    handler_call("child", "reg");
}

#[test]
fn dead_entry_released_in_prepare_handler() {
    handler_call("prepare", "dead");
}

#[test]
fn dead_entry_released_in_parent_handler() {
    handler_call("parent", "dead");
}

#[test]
fn dead_entry_released_in_child_handler() {
    handler_call("child", "dead");
}

#[test]
fn shadow_released_in_prepare_handler() {
    handler_call("prepare", "shadow");
}

#[test]
fn shadow_released_in_parent_handler() {
    handler_call("parent", "shadow");
}

#[test]
fn shadow_released_in_child_handler() {
    handler_call("child", "shadow");
}

/// A library's prepare handler takes its lock L, which its other thread holds across
/// `ibv_reg_mr`: 50 forks while that thread registers (each a miss) under L.
#[test]
fn prepare_handler_lock_held_across_registration() {
    passes("fork_lock", "lock", &["50"], &[]);
}

/// fork() in a SIGALRM handler (300 us after the last handler returned) while the main
/// thread maps, registers (a miss), registers again (a hit), deregisters and unmaps, 20,000
/// rounds (about 700 forks): no fork waits for the cache lock the interrupted frame holds
/// (tests/c/host/fork_in_signal_handler.c).
#[test]
fn fork_in_a_signal_handler_that_interrupted_a_registration() {
    passes("fork_in_signal_handler", "storm", &["20000"], &[]);
}

/// `_Fork()` in a program that starts no threads, 4,000 times while cached entries die and
/// are deregistered: it stays single-threaded (no thread of ours), each child's calloc
/// returns, and every dead entry is deregistered by the next call
/// (tests/c/host/underscore_fork_single_thread.c).
#[test]
fn underscore_fork_children_of_a_single_threaded_program_may_malloc() {
    let (why, out) = run_for(
        150,
        "underscore_fork_single_thread",
        "single_thread",
        &["4000"],
        &[],
    );
    if let Some(why) = why {
        panic!("underscore_fork_single_thread 4000: {why}:\n{out}");
    }
    println!("{out}");
}

/// `MRCACHE_FORK=flush`: no idle entry is a hit after fork() in the parent, neither one
/// idle before the fork nor one released or registered in the fork's window (by the
/// program's prepare handler, after ours); the child's registrations are its own.
#[test]
fn flush_leaves_nothing_idle_across_fork() {
    passes(
        "fork_handlers",
        "guarantees_flush",
        &["guarantees", "flush"],
        &[("MRCACHE_FORK", "flush")],
    );
}

/// `MRCACHE_FORK=keep`: the idle entry is a hit after the fork; the child still misses.
#[test]
fn keep_keeps_idle_entries_and_the_child_starts_afresh() {
    passes(
        "fork_handlers",
        "guarantees_keep",
        &["guarantees", "keep"],
        &[("MRCACHE_FORK", "keep")],
    );
}

/// With libibverbs' fork tracking on, the range of an entry in use is marked DONTFORK
/// before the fork and unmarked once in the parent after it.
#[test]
fn in_use_ranges_are_marked_dontfork_for_the_fork() {
    passes(
        "fork_handlers",
        "dontfork",
        &["dontfork", "-"],
        &[("RDMAV_FORK_SAFE", "1")],
    );
}

/// `MRCACHE_LOG=trace` to a file: 20 forks while the trace writer drains; each child
/// registers and exits through exit() (which flushes the trace).
#[test]
fn fork_while_the_trace_writer_writes_to_a_file() {
    passes(
        "fork_trace",
        "file",
        &["20"],
        &[("MRCACHE_LOG", "trace"), ("MRCACHE_LOG_FILE", "/dev/null")],
    );
}

/// The same with the trace on stderr (here a file).
#[test]
fn fork_while_the_trace_writer_writes_to_stderr() {
    let (shim, prog) = programs("fork_trace", "stderr");
    let err = dir().join("fork_trace_stderr.txt");
    let out = Command::new("timeout")
        .args(["-s", "KILL", "30"])
        .arg(&prog)
        .arg("20")
        .env("LD_PRELOAD", common::preload_with(&shim))
        .env("MRCACHE_MONITOR", "patch")
        .env("MRCACHE_LOG", "trace")
        .stderr(Stdio::from(std::fs::File::create(&err).unwrap()))
        .output()
        .unwrap();
    let errors: String = std::fs::read_to_string(&err)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with("mrcache["))
        .take(20)
        .collect::<Vec<_>>()
        .join("\n");
    let _ = std::fs::remove_file(&err);
    if let Some(why) = ending(&out) {
        panic!(
            "fork_trace to stderr: {why}:\n{}{errors}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
