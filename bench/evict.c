/* Eviction cost on a real device: N buffers of 64 KiB registered and deregistered in turn,
 * round robin, for SECONDS. Run plain, and preloaded with MRCACHE_MAX_ENTRIES smaller than
 * N (every call then misses and evicts the least recently used idle entry: the cache's
 * worst case) or at least N (every call after the first round hits).
 *   evict N [SECONDS]
 * Prints: BENCH evict buffers=<N> iters=<n> ns_per_pair=<ns> pairs_per_s=<r> */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LEN (64 << 10)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 64;
    double seconds = argc > 2 ? atof(argv[2]) : 2.0;
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
    struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
    if (n < 1 || !pd) {
        fprintf(stderr, "usage: evict N [SECONDS] (needs an RDMA device)\n");
        return 1;
    }
    char *bufs = malloc((size_t)n * LEN);
    memset(bufs, 1, (size_t)n * LEN);
    long iters = 0;
    double t0 = now(), t;
    do {
        for (int k = 0; k < n; k++, iters++) {
            struct ibv_mr *mr = ibv_reg_mr(pd, bufs + (size_t)k * LEN, LEN, IBV_ACCESS_LOCAL_WRITE);
            if (!mr || ibv_dereg_mr(mr)) {
                fprintf(stderr, "registration failed\n");
                return 1;
            }
        }
        t = now();
    } while (t - t0 < seconds);
    double ns = (t - t0) * 1e9 / iters;
    printf("BENCH evict buffers=%d iters=%ld ns_per_pair=%.0f pairs_per_s=%.0f\n", n, iters, ns, 1e9 / ns);
    free(bufs);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    return 0;
}
