/* Counts the calling thread's clock_gettime calls, preloaded after libmrcache.so (whose
 * clock reads, through Rust's Instant, are libc calls it binds to this definition first):
 * clock_reads_here() is this thread's count so far. Forwards to the system call. The coarse
 * clocks are not counted: the vDSO serves them from its data page without a counter read or
 * a system call, in the TCG guest too (mrcache reads CLOCK_MONOTONIC_COARSE on each call
 * of a program without threads, for its inline drain cycle). Also process_vm_readv
 * (probes_here()). */
#define _GNU_SOURCE
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static __thread long reads;

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (id != CLOCK_MONOTONIC_COARSE && id != CLOCK_REALTIME_COARSE)
        reads++;
    return (int)syscall(SYS_clock_gettime, id, ts);
}

long clock_reads_here(void) { return reads; }

/* The same for process_vm_readv, the device-memory probe's system call. */
#include <sys/uio.h>
static __thread long probes;

ssize_t process_vm_readv(pid_t pid, const struct iovec *l, unsigned long ln, const struct iovec *r, unsigned long rn,
                         unsigned long flags) {
    probes++;
    return syscall(SYS_process_vm_readv, pid, l, ln, r, rn, flags);
}

long probes_here(void) { return probes; }
