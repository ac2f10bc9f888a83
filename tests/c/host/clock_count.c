/* Counts the calling thread's clock_gettime calls, preloaded after libmrcache.so (whose
 * clock reads, through Rust's Instant, are libc calls it binds to this definition first):
 * clock_reads_here() is this thread's count so far. Forwards to the system call. */
#define _GNU_SOURCE
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static __thread long reads;

int clock_gettime(clockid_t id, struct timespec *ts) {
    reads++;
    return (int)syscall(SYS_clock_gettime, id, ts);
}

long clock_reads_here(void) { return reads; }
