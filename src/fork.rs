//! The fork policy: what the cache does with its registrations when the process forks.
//! Decided once, by the library when the cache is created and by `mrcache info` to show it.

use crate::config::ForkMode;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

/// What this process does at fork.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Deregister idle entries before the fork.
    pub flush_idle: bool,
    /// Mark the ranges of entries in use DONTFORK for the fork's duration.
    pub dontfork_in_use: bool,
    /// The reason, for the log line and the report.
    pub why: String,
}

/// Decide from `MRCACHE_FORK`, whether the kernel copies pinned pages at fork (libibverbs'
/// `ibv_is_fork_initialized() == IBV_FORK_UNNEEDED`; None: it cannot say) and whether
/// libibverbs' fork tracking is on (with it, libibverbs alone would have every range in use
/// marked DONTFORK, which the child does not inherit: keep that, whatever the kernel does).
pub fn decide(mode: ForkMode, copy_on_fork: Option<bool>, tracking: bool) -> Decision {
    // rdma-core >= 51 (5a11b68ca) ignores RDMAV_FORK_SAFE et al. when the kernel copies
    // pinned pages: its ibv_dontfork_range, which marks the ranges, is then a no-op.
    let tracking_why = match (tracking, copy_on_fork) {
        (true, Some(true)) => {
            "libibverbs fork tracking is asked for: ranges in use are marked DONTFORK for the fork through libibverbs (a no-op with rdma-core >= 51, which leaves tracking off when the kernel copies pinned pages)"
        }
        (true, _) => {
            "libibverbs fork tracking is on: ranges in use are marked DONTFORK for the fork"
        }
        (false, _) => "libibverbs fork tracking is off",
    };
    let (flush_idle, why) = match (mode, copy_on_fork) {
        (ForkMode::Keep, _) => (
            false,
            "MRCACHE_FORK=keep: idle entries are kept across fork",
        ),
        (ForkMode::Flush, _) => (
            true,
            "MRCACHE_FORK=flush: idle entries are deregistered before fork",
        ),
        (ForkMode::Auto, Some(true)) => (
            false,
            "auto: the kernel copies pinned pages at fork (ibv_is_fork_initialized = IBV_FORK_UNNEEDED): idle entries are kept",
        ),
        (ForkMode::Auto, Some(false)) => (
            true,
            "auto: the kernel does not copy pinned pages at fork: idle entries are deregistered before fork",
        ),
        (ForkMode::Auto, None) => (
            true,
            "auto: libibverbs cannot say whether the kernel copies pinned pages (no ibv_is_fork_initialized): idle entries are deregistered before fork",
        ),
    };
    Decision {
        flush_idle,
        dontfork_in_use: tracking,
        why: format!("{why}; {tracking_why}"),
    }
}

/// Whether libibverbs' fork tracking is turned on by the environment (`ibv_fork_init()` at
/// run time also turns it on).
pub fn tracking_in_env(get: impl Fn(&str) -> Option<String>) -> bool {
    ["RDMAV_FORK_SAFE", "IBV_FORK_SAFE"]
        .iter()
        .any(|k| get(k).is_some_and(|v| v != "0"))
}

/// Flushes of idle entries that `_Fork()` in the parent asked for, and those done. A
/// caller that finds one outstanding flushes before it looks anything up, and the request
/// stays outstanding until a flush that began after it has finished: a thread never skips
/// its flush because another thread's flush is still deregistering.
pub struct FlushRequests {
    asked: AtomicU64,
    done: AtomicU64,
}

impl FlushRequests {
    /// None asked, none done.
    pub const fn new() -> FlushRequests {
        FlushRequests {
            asked: AtomicU64::new(0),
            done: AtomicU64::new(0),
        }
    }

    /// `_Fork()` returned in the parent (async-signal-safe: one atomic add).
    pub fn ask(&self) {
        self.asked.fetch_add(1, SeqCst);
    }

    /// The request a flush begun now answers, or None when none is outstanding.
    pub fn outstanding(&self) -> Option<u64> {
        let asked = self.asked.load(SeqCst);
        (self.done.load(SeqCst) < asked).then_some(asked)
    }

    /// A flush begun when `outstanding` returned `ticket` has finished.
    pub fn done(&self, ticket: u64) {
        self.done.fetch_max(ticket, SeqCst);
    }

    /// In a fork child (async-signal-safe): nothing outstanding, its cache is replaced.
    pub fn forget(&self) {
        self.done.store(self.asked.load(SeqCst), SeqCst);
    }
}

impl Default for FlushRequests {
    fn default() -> FlushRequests {
        FlushRequests::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions() {
        assert!(!decide(ForkMode::Auto, Some(true), false).flush_idle);
        assert!(decide(ForkMode::Auto, Some(false), false).flush_idle);
        assert!(decide(ForkMode::Auto, None, false).flush_idle);
        assert!(!decide(ForkMode::Keep, Some(false), false).flush_idle);
        assert!(decide(ForkMode::Flush, Some(true), false).flush_idle);
        let d = decide(ForkMode::Auto, Some(true), true);
        assert!(d.dontfork_in_use && d.why.contains("IBV_FORK_UNNEEDED"));
        // rdma-core >= 51 marks nothing then: the text must not promise DONTFORK.
        assert!(d.why.contains("a no-op with rdma-core >= 51"), "{}", d.why);
        let d = decide(ForkMode::Auto, Some(false), true);
        assert!(
            d.why
                .contains("tracking is on: ranges in use are marked DONTFORK")
        );
        assert!(tracking_in_env(
            |k| (k == "IBV_FORK_SAFE").then(|| "1".into())
        ));
        assert!(!tracking_in_env(
            |k| (k == "RDMAV_FORK_SAFE").then(|| "0".into())
        ));
    }

    #[test]
    fn a_flush_in_progress_does_not_let_another_caller_skip_its_own() {
        let r = FlushRequests::new();
        assert_eq!(r.outstanding(), None);
        r.ask();
        let a = r.outstanding().expect("a fork asked for a flush");
        // Thread A is deregistering; thread B must not look anything up before flushing.
        assert!(
            r.outstanding().is_some(),
            "a flush still running on another thread let this caller skip its own"
        );
        r.done(a);
        assert_eq!(r.outstanding(), None);
    }

    #[test]
    fn a_fork_during_a_flush_is_not_lost() {
        let r = FlushRequests::new();
        r.ask();
        let a = r.outstanding().unwrap();
        r.ask();
        r.done(a);
        assert!(
            r.outstanding().is_some(),
            "the second fork's flush was lost"
        );
        r.forget();
        assert_eq!(r.outstanding(), None);
    }
}
