/* What a registration passed through to libibverbs costs the preloaded process in clock
 * reads (in the TCG guest a clock_gettime is an emulated HPET read, 1.4-4.5 us,
 * and every pass-through paid two to four of them). A fake provider behind libmrcache.so,
 * libclock_count.so (counts this thread's clock_gettime calls) and verbs_shim.so (libibverbs'
 * reg/dereg for calls passed through: counts them).
 *   pass_clock bypass   remote access under MRCACHE_REMOTE=bypass: every call passes through
 *   pass_clock scan     local access, 64 buffers cycled through MRCACHE_MAX_ENTRIES=8 under
 *                       MRCACHE_ADMIT=auto: the scan rule passes most calls through
 * Prints "<scenario>: P of N pairs passed through, R clock reads in them, P2 device-memory
 * probes" (the reads made
 * inside the pairs that passed through, this thread only), and P2 device-memory probes
 * (process_vm_readv) in them. exit 0; 3: set-up failed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define LEN 65536ul
static struct ibv_pd pd;

#include "fake_mr.h"

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    long (*reads)(void) = (long (*)(void))dlsym(RTLD_DEFAULT, "clock_reads_here");
    long (*probes)(void) = (long (*)(void))dlsym(RTLD_DEFAULT, "probes_here");
    int *shim_regs = dlsym(RTLD_DEFAULT, "shim_regs");
    if (!reads || !probes || !shim_regs) {
        fprintf(stderr, "pass_clock: libclock_count.so or verbs_shim.so is not preloaded\n");
        return 3;
    }
    int bypass = !strcmp(argv[1], "bypass");
    if (!bypass && strcmp(argv[1], "scan")) return 2;
    int nbuf = bypass ? 1 : 64, access = IBV_ACCESS_LOCAL_WRITE;
    if (bypass) access |= IBV_ACCESS_REMOTE_WRITE;
    char *bufs = mmap(NULL, nbuf * 2 * LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (bufs == MAP_FAILED) return 3;
    long passed = 0, in_passed = 0, probed = 0, pairs = 4000;
    for (long i = 0; i < pairs + 200; i++) {
        char *b = bufs + (i % nbuf) * 2 * LEN;
        int before = *shim_regs;
        long r0 = reads(), p0 = probes();
        struct ibv_mr *mr = ibv_reg_mr(&pd, b, LEN, access);
        if (!mr || ibv_dereg_mr(mr)) {
            fprintf(stderr, "pass_clock: reg/dereg failed\n");
            return 3;
        }
        /* The first 200 pairs set up (the library's start, the first figures). */
        if (i >= 200 && *shim_regs != before) passed++, in_passed += reads() - r0, probed += probes() - p0;
    }
    printf("%s: %ld of %ld pairs passed through, %ld clock reads in them, %ld device-memory probes\n", argv[1], passed,
           pairs, in_passed, probed);
    return 0;
}
