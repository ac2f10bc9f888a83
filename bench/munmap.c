/* Cost of munmap on memory the cache does not hold: mmap + touch + munmap of 64 KiB, with
 * only the munmap timed. Run with and without libmrcache.so preloaded (ci/bench compares).
 * With "active", the process first registers a buffer so the cache exists and every
 * munmap is reported to it (the cost a verbs program pays); without, the process never
 * touches verbs (the cost every other process pays).
 *   munmap [active] [iterations]
 * Prints: BENCH munmap mode=<idle|active> iters=<n> ns_per_munmap=<ns> */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int active = argc > 1 && !strcmp(argv[1], "active");
    long iters = argc > 2 ? atol(argv[2]) : 20000;
    struct ibv_mr *mr = NULL;
    if (active) {
        struct ibv_device **list = ibv_get_device_list(NULL);
        struct ibv_context *ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
        struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
        static char buf[1 << 16];
        mr = pd ? ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE) : NULL;
        if (!mr) {
            fprintf(stderr, "active mode needs an RDMA device\n");
            return 1;
        }
    }
    size_t len = 64 << 10;
    double total = 0;
    for (long i = 0; i < iters; i++) {
        char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return 1;
        p[0] = 1;
        double t0 = now();
        munmap(p, len);
        total += now() - t0;
    }
    printf("BENCH munmap mode=%s iters=%ld ns_per_munmap=%.0f\n", active ? "active" : "idle", iters, total * 1e9 / iters);
    if (mr)
        ibv_dereg_mr(mr);
    return 0;
}
