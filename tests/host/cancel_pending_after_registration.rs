//! A thread cancelled (deferred) before its registration: the cancel acts at the thread's
//! own next cancellation point, as without the preload. A cancellation point inside a hook
//! (the miss path's `msync`, a log line's `write`, the set-up's file reads) would unwind
//! glibc's forced unwind through the library's frames, and the process aborts there.

use crate::common;

use common::{fake_scenario, tempdir, text};

/// `tag`: the test's own directory (tests run in parallel; exec of a program another test is
/// still writing fails with ETXTBSY).
fn cancelled(tag: &str, scenario: &str, env: &[(&str, &str)]) {
    let dir = tempdir(&format!("cancel-{tag}"));
    let out = fake_scenario(&dir, "cancel_pending", scenario, env);
    let t = text(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{scenario} {env:?}: the process died ({:?}):\n{t}",
        out.status
    );
    assert!(t.contains("thread cancelled"), "{scenario} {env:?}:\n{t}");
}

#[test]
fn a_pending_cancel_acts_after_the_first_registration() {
    cancelled("first", "cold", &[]);
}

#[test]
fn a_pending_cancel_acts_after_a_miss() {
    cancelled("miss", "warm", &[]);
}

#[test]
fn a_pending_cancel_acts_after_a_logged_miss() {
    cancelled("logged", "warm", &[("MRCACHE_LOG", "debug")]);
}
