//! What the bench reads of `/proc`: the pages this process has pinned, the memory the
//! system has available.

/// A `Name:  N kB` field of a `/proc` file, in bytes.
fn kib_field(path: &str, name: &str) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// `VmPin` of this process, in bytes: pages pinned by registrations (ib_umem).
pub fn pinned() -> Option<u64> {
    kib_field("/proc/self/status", "VmPin")
}

/// `MemAvailable` from /proc/meminfo, in bytes.
pub fn mem_available() -> Option<u64> {
    kib_field("/proc/meminfo", "MemAvailable")
}
