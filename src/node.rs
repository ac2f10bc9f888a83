//! What the default byte cap (`MRCACHE_MAX_BYTES=auto`) depends on besides physical memory:
//! how many ranks of the job share this node (each runs its own cache) and the locked
//! memory limit (`RLIMIT_MEMLOCK`), which pinned registrations count against.
//!
//! Launchers say how many ranks they started on the node in the environment of each rank;
//! the first of these that is set and valid is used:
//!
//! | variable | set by |
//! |---|---|
//! | `OMPI_COMM_WORLD_LOCAL_SIZE` | Open MPI's `mpirun` (ranks of this job on this node) |
//! | `MPI_LOCALNRANKS` | MPICH's Hydra `mpiexec` |
//! | `SLURM_STEP_TASKS_PER_NODE` + `SLURM_NODEID` | `srun`: tasks per node of the step, compressed (`2(x3),1`), indexed by the node's relative id |
//! | `SLURM_NTASKS_PER_NODE` | Slurm, when the job asked for `--ntasks-per-node` |

use std::fmt;

/// The node-local rank count and the variable it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalRanks {
    /// Ranks on this node.
    pub count: u32,
    /// The launcher variable it was read from.
    pub from: &'static str,
}

/// The launcher variables read, in order of preference.
pub const LAUNCHER_VARIABLES: [&str; 5] = [
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_NODEID",
    "SLURM_NTASKS_PER_NODE",
];

/// The node-local rank count from the launcher's variables (`get` looks one up), if any
/// launcher set one: None for a process not started by a known launcher.
pub fn local_ranks<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Option<LocalRanks> {
    let count = |v: &str| v.trim().parse::<u32>().ok().filter(|&n| n > 0);
    for from in ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"] {
        if let Some(n) = get(from).and_then(count) {
            return Some(LocalRanks { count: n, from });
        }
    }
    if let Some(list) = get("SLURM_STEP_TASKS_PER_NODE") {
        let n = match get("SLURM_NODEID").and_then(|v| v.trim().parse::<usize>().ok()) {
            Some(node) => slurm_tasks_on_node(list, node),
            // Which node this is is unknown: only a list the same on every node answers.
            None => slurm_same_on_every_node(list),
        };
        if let Some(n) = n {
            return Some(LocalRanks {
                count: n,
                from: "SLURM_STEP_TASKS_PER_NODE",
            });
        }
    }
    let from = "SLURM_NTASKS_PER_NODE";
    get(from)
        .and_then(count)
        .map(|n| LocalRanks { count: n, from })
}

/// The task count of a Slurm list whose entries are all the same, if they are.
fn slurm_same_on_every_node(list: &str) -> Option<u32> {
    let mut count = None;
    for part in list.trim().split(',') {
        let n = slurm_tasks_on_node(part, 0)?;
        if *count.get_or_insert(n) != n {
            return None;
        }
    }
    count
}

/// Slurm's compressed per-node task list (`2(x3),1`: three nodes with 2 tasks, then one
/// with 1), entry `node`.
pub(crate) fn slurm_tasks_on_node(list: &str, node: usize) -> Option<u32> {
    let mut index = 0usize;
    for part in list.trim().split(',') {
        let (n, repeat) = match part.split_once("(x") {
            Some((n, rest)) => (n, rest.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (part, 1),
        };
        let n = n.parse::<u32>().ok().filter(|&n| n > 0)?;
        // Saturating: a (bogus) list longer than usize::MAX nodes must not wrap around.
        let end = index.saturating_add(repeat);
        if node < end {
            return Some(n);
        }
        index = end;
    }
    None
}

/// `RLIMIT_MEMLOCK` as it applies to RDMA pinning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memlock {
    /// The soft limit, in bytes.
    Limit(u64),
    /// No limit (`RLIMIT_INFINITY`).
    Unlimited,
    /// The process has CAP_IPC_LOCK: the kernel does not charge its pins against the limit.
    CapIpcLock,
    /// Could not be read.
    Unknown,
}

impl Memlock {
    /// From the text of `/proc/self/limits` and `/proc/self/status`, and the target of
    /// `/proc/self/ns/user`.
    pub(crate) fn from_proc(limits: &str, status: &str, user_ns: &str) -> Memlock {
        // The kernel asks capable(CAP_IPC_LOCK), i.e. in the initial user namespace: root in
        // a namespace of its own (rootless containers) has the bit, yet its pins are charged.
        if user_ns == INITIAL_USER_NS && has_cap_ipc_lock(status) {
            return Memlock::CapIpcLock;
        }
        let Some(line) = limits.lines().find(|l| l.starts_with("Max locked memory")) else {
            return Memlock::Unknown;
        };
        match line["Max locked memory".len()..].split_whitespace().next() {
            Some("unlimited") => Memlock::Unlimited,
            Some(v) => v.parse().map_or(Memlock::Unknown, Memlock::Limit),
            None => Memlock::Unknown,
        }
    }

    /// This process's limit.
    pub fn current() -> Memlock {
        let read = |p| std::fs::read_to_string(p).unwrap_or_default();
        let user_ns = std::fs::read_link("/proc/self/ns/user")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        Memlock::from_proc(
            &read("/proc/self/limits"),
            &read("/proc/self/status"),
            &user_ns,
        )
    }
}

impl fmt::Display for Memlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Memlock::Limit(b) => write!(f, "{b} bytes"),
            Memlock::Unlimited => write!(f, "unlimited"),
            Memlock::CapIpcLock => write!(f, "not applied (CAP_IPC_LOCK)"),
            Memlock::Unknown => write!(f, "unknown"),
        }
    }
}

/// `/proc/self/ns/user` in the initial user namespace (its inode is fixed: PROC_USER_INIT_INO).
pub const INITIAL_USER_NS: &str = "user:[4026531837]";

/// CAP_IPC_LOCK (bit 14) in the effective set of a `/proc/PID/status` text.
fn has_cap_ipc_lock(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

/// What the default byte cap is derived from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Node {
    pub(crate) physical_memory: u64,
    pub local_ranks: Option<LocalRanks>,
    pub memlock: Memlock,
}

/// The default cap and why: a quarter of physical memory, divided among the node's ranks,
/// and at most three quarters of the locked memory limit (the rest is left for what the
/// process pins outside the cache: uncached registrations, queues, the app's own mlock).
pub(crate) fn auto_max_bytes(node: &Node) -> (u64, String) {
    let mut why = Vec::new();
    let mut bytes = if node.physical_memory == 0 {
        why.push("physical memory unknown".to_string());
        u64::MAX
    } else {
        why.push(format!(
            "a quarter of {} bytes of memory",
            node.physical_memory
        ));
        node.physical_memory / 4
    };
    if let Some(r) = node.local_ranks.filter(|r| r.count > 1)
        && bytes != u64::MAX
    {
        bytes /= r.count as u64;
        why.push(format!(
            "divided by {} ranks on this node ({})",
            r.count, r.from
        ));
    }
    if let Memlock::Limit(limit) = node.memlock {
        let cap = limit / 4 * 3;
        if cap < bytes {
            bytes = cap;
            why.push(format!("capped at 3/4 of RLIMIT_MEMLOCK ({limit} bytes)"));
        }
    }
    (bytes, why.join(", "))
}

/// The running kernel's release (`uname -r`), or "" where it cannot be read.
pub fn running_kernel() -> String {
    // SAFETY: utsname is plain bytes, zeroed; uname fills it or fails.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid utsname to fill.
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    let bytes: Vec<u8> = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| *v)
    }

    #[test]
    fn slurm_lists() {
        assert_eq!(slurm_tasks_on_node("4", 0), Some(4));
        assert_eq!(slurm_tasks_on_node("1(x4)", 3), Some(1));
        assert_eq!(slurm_tasks_on_node("1(x4)", 4), None);
        assert_eq!(slurm_tasks_on_node("2(x3),1", 2), Some(2));
        assert_eq!(slurm_tasks_on_node("2(x3),1", 3), Some(1));
        assert_eq!(slurm_tasks_on_node("8,4(x2),16", 3), Some(16));
        for bad in ["", "x", "2(x", "2(x3", "0", "-1", "2(xa)"] {
            assert_eq!(slurm_tasks_on_node(bad, 0), None, "{bad}");
        }
        assert_eq!(slurm_tasks_on_node("2,,3", 1), None);
        // Repeat counts that overflow the node index: no wrap-around (nor a panic).
        let max = usize::MAX;
        let huge = format!("1(x{}),5(x3),7(x{})", max - 1, max - 1);
        assert_eq!(slurm_tasks_on_node(&huge, max - 1), Some(5));
    }

    #[test]
    fn launcher_preference_and_bad_values() {
        assert_eq!(local_ranks(env(&[])), None);
        let r = local_ranks(env(&[
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("MPI_LOCALNRANKS", "2"),
        ]));
        assert_eq!(
            r,
            Some(LocalRanks {
                count: 4,
                from: "OMPI_COMM_WORLD_LOCAL_SIZE"
            })
        );
        let r = local_ranks(env(&[
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "0"),
            ("MPI_LOCALNRANKS", "3"),
        ]));
        assert_eq!(
            r,
            Some(LocalRanks {
                count: 3,
                from: "MPI_LOCALNRANKS"
            })
        );
        let r = local_ranks(env(&[
            ("SLURM_STEP_TASKS_PER_NODE", "2(x3),1"),
            ("SLURM_NODEID", "3"),
            ("SLURM_NTASKS_PER_NODE", "2"),
        ]));
        assert_eq!(
            r,
            Some(LocalRanks {
                count: 1,
                from: "SLURM_STEP_TASKS_PER_NODE"
            })
        );
        let r = local_ranks(env(&[
            ("SLURM_STEP_TASKS_PER_NODE", "junk"),
            ("SLURM_NTASKS_PER_NODE", "8"),
        ]));
        assert_eq!(
            r,
            Some(LocalRanks {
                count: 8,
                from: "SLURM_NTASKS_PER_NODE"
            })
        );
        assert_eq!(local_ranks(env(&[("MPI_LOCALNRANKS", "many")])), None);
        // Without a valid node id only a list that is the same on every node answers.
        for id in [None, Some("abc"), Some("-1")] {
            let mut vars = vec![("SLURM_STEP_TASKS_PER_NODE", "2(x3),1")];
            vars.extend(id.map(|v| ("SLURM_NODEID", v)));
            assert_eq!(local_ranks(env(&vars)), None, "{id:?}");
            vars[0].1 = "4(x2),4";
            assert_eq!(local_ranks(env(&vars)).map(|r| r.count), Some(4), "{id:?}");
        }
    }

    #[test]
    fn memlock_from_proc() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \nMax locked memory         8388608              16777216             bytes     \n";
        let no_caps = "Name:\tx\nCapEff:\t0000000000000000\n";
        let ipc_lock = "CapEff:\t0000000000004000\n";
        let init = INITIAL_USER_NS;
        assert_eq!(
            Memlock::from_proc(limits, no_caps, init),
            Memlock::Limit(8388608)
        );
        assert_eq!(
            Memlock::from_proc(limits, ipc_lock, init),
            Memlock::CapIpcLock
        );
        // Only the initial user namespace's CAP_IPC_LOCK exempts (and an unreadable link
        // is not taken for it).
        for other in ["user:[4026532841]", ""] {
            assert_eq!(
                Memlock::from_proc(limits, ipc_lock, other),
                Memlock::Limit(8388608)
            );
        }
        let unl = "Max locked memory         unlimited            unlimited            bytes\n";
        assert_eq!(Memlock::from_proc(unl, no_caps, init), Memlock::Unlimited);
        assert_eq!(Memlock::from_proc("", no_caps, init), Memlock::Unknown);
    }

    #[test]
    fn default_cap() {
        const GIB: u64 = 1 << 30;
        let node = |ranks: Option<u32>, memlock| Node {
            physical_memory: 64 * GIB,
            local_ranks: ranks.map(|count| LocalRanks {
                count,
                from: "MPI_LOCALNRANKS",
            }),
            memlock,
        };
        assert_eq!(auto_max_bytes(&node(None, Memlock::Unlimited)).0, 16 * GIB);
        assert_eq!(
            auto_max_bytes(&node(Some(1), Memlock::Unlimited)).0,
            16 * GIB
        );
        let (b, why) = auto_max_bytes(&node(Some(64), Memlock::Unknown));
        assert_eq!(b, GIB / 4);
        assert!(
            why.contains("64 ranks") && why.contains("MPI_LOCALNRANKS"),
            "{why}"
        );
        let (b, why) = auto_max_bytes(&node(Some(4), Memlock::Limit(GIB)));
        assert_eq!(b, GIB / 4 * 3);
        assert!(why.contains("RLIMIT_MEMLOCK"), "{why}");
        // A limit above the per-rank share changes nothing; CAP_IPC_LOCK lifts it.
        assert_eq!(
            auto_max_bytes(&node(Some(4), Memlock::Limit(64 * GIB))).0,
            4 * GIB
        );
        assert_eq!(
            auto_max_bytes(&node(Some(4), Memlock::CapIpcLock)).0,
            4 * GIB
        );
        // Unknown physical memory: unlimited, but the memlock cap still applies.
        let unknown = Node {
            physical_memory: 0,
            ..node(Some(4), Memlock::Limit(GIB))
        };
        assert_eq!(auto_max_bytes(&unknown).0, GIB / 4 * 3);
    }
}
