//! Whether the kernel charges this process's pins against `RLIMIT_MEMLOCK` now: as
//! `ib_umem_get` decides, a finite soft limit and no CAP_IPC_LOCK in the initial user
//! namespace (`capable()`). Asked live (a program may lower its limit or drop the
//! capability after start-up): two system calls, no allocation, no lock.

use super::syscall6;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// Whether a new pin now counts against a finite `RLIMIT_MEMLOCK`. True when in doubt (a
/// call failed): the caller then only gives up a containing-range hit.
pub fn pins_charged() -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    let got = syscall6(
        libc::SYS_prlimit64,
        0,
        libc::RLIMIT_MEMLOCK as usize,
        0,
        &raw mut lim as usize,
        0,
        0,
    );
    if got != 0 {
        return true;
    }
    if lim.rlim_cur == libc::RLIM_INFINITY {
        return false;
    }
    !(cap_ipc_lock() && initial_user_ns())
}

const CAP_IPC_LOCK: u32 = 14;
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// CAP_IPC_LOCK in this thread's effective set (`capget`, version 3: two 32-bit words).
fn cap_ipc_lock() -> bool {
    let mut header = [CAPABILITY_VERSION_3, 0u32]; // version, pid 0: this thread
    let mut data = [0u32; 6]; // {effective, permitted, inheritable} x 2
    let got = syscall6(
        libc::SYS_capget,
        header.as_mut_ptr() as usize,
        data.as_mut_ptr() as usize,
        0,
        0,
        0,
        0,
    );
    got == 0 && data[0] & (1 << CAP_IPC_LOCK) != 0
}

/// 0: not read yet, 1: the initial user namespace, 2: another (or unreadable). Read once:
/// a process leaves its user namespace only by `unshare`/`setns` of a single thread.
static USER_NS: AtomicU8 = AtomicU8::new(0);

fn initial_user_ns() -> bool {
    if USER_NS.load(Relaxed) == 0 {
        let mut buf = [0u8; 64];
        let n = syscall6(
            libc::SYS_readlinkat,
            libc::AT_FDCWD as usize,
            c"/proc/self/ns/user".as_ptr() as usize,
            buf.as_mut_ptr() as usize,
            buf.len(),
            0,
            0,
        );
        let initial =
            n > 0 && buf.get(..n as usize) == Some(mrcache::node::INITIAL_USER_NS.as_bytes());
        USER_NS.store(if initial { 1 } else { 2 }, Relaxed);
    }
    USER_NS.load(Relaxed) == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's answer agrees with what `/proc` says of it.
    #[test]
    fn agrees_with_proc() {
        let charged = matches!(
            mrcache::node::Memlock::current(),
            mrcache::node::Memlock::Limit(_) | mrcache::node::Memlock::Unknown
        );
        assert_eq!(pins_charged(), charged);
    }
}
