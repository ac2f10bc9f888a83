/* Working sets larger than the cache, on a real device: N buffers of SIZE bytes (default
 * 64 KiB), each registered and deregistered in turn for SECONDS, in one of two orders:
 *   cyclic  round robin 0, 1, ..., N-1, 0, ... (LRU's worst case: with a cache smaller
 *           than N every call misses and evicts);
 *   zipf    a fixed pseudo-random sequence where buffer k comes with weight 1/(k+1)
 *           (a Zipf-like mix, exponent 1: a few hot buffers and a long tail).
 * Run it plain and preloaded with MRCACHE_MAX_ENTRIES (or MRCACHE_MAX_BYTES) below N.
 *   evict N [SECONDS] [cyclic|zipf] [SIZE] [local|remote]
 * Prints: BENCH evict pattern=<p> buffers=<N> size=<bytes> access=<a> iters=<n>
 *         ns_per_pair=<ns> pairs_per_s=<r> first_pair_ns=<ns>
 * (the first pair made before the timed loop and reported apart: see regmr.c) */
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SEQ 8192 /* length of the zipf sequence, replayed in a loop */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* xorshift64*: the same sequence in every run */
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double uniform(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (double)((rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 64;
    double seconds = argc > 2 ? atof(argv[2]) : 2.0;
    const char *pattern = argc > 3 ? argv[3] : "cyclic";
    size_t len = argc > 4 ? strtoull(argv[4], NULL, 10) : 64 << 10;
    const char *access = argc > 5 ? argv[5] : "local";
    int zipf = !strcmp(pattern, "zipf");
    int remote = !strcmp(access, "remote");
    if (n < 1 || len < 1 || (!zipf && strcmp(pattern, "cyclic")) ||
        (!remote && strcmp(access, "local"))) {
        fprintf(stderr, "usage: evict N [SECONDS] [cyclic|zipf] [SIZE] [local|remote]\n");
        return 2;
    }
    len = (len + 4095) & ~(size_t)4095;
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
    struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
    if (!pd) {
        fprintf(stderr, "evict: needs an RDMA device\n");
        return 1;
    }
    int *order = malloc(sizeof(int) * (zipf ? SEQ : n));
    int len_order = zipf ? SEQ : n;
    if (zipf) {
        double *cdf = malloc(sizeof(double) * n), sum = 0;
        for (int k = 0; k < n; k++)
            cdf[k] = sum += 1.0 / (k + 1);
        for (int i = 0; i < SEQ; i++) {
            double u = uniform() * sum;
            int lo = 0, hi = n - 1;
            while (lo < hi) {
                int mid = (lo + hi) / 2;
                if (cdf[mid] < u)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            order[i] = lo;
        }
        free(cdf);
    } else {
        for (int k = 0; k < n; k++)
            order[k] = k;
    }
    int flags = IBV_ACCESS_LOCAL_WRITE | (remote ? IBV_ACCESS_REMOTE_WRITE : 0);
    char *bufs = aligned_alloc(4096, (size_t)n * len);
    if (!bufs) {
        fprintf(stderr, "evict: no memory for %d x %zu bytes\n", n, len);
        return 1;
    }
    memset(bufs, 1, (size_t)n * len);
    /* The first pair (the library's set-up under the preload) before the timed loop, on the
     * pattern's own first buffer so the working set stays the pattern's; see regmr.c. */
    double f0 = now();
    struct ibv_mr *first = ibv_reg_mr(pd, bufs + (size_t)order[0] * len, len, flags);
    if (!first || ibv_dereg_mr(first)) {
        fprintf(stderr, "registration failed\n");
        return 1;
    }
    double first_ns = (now() - f0) * 1e9;
    long iters = 0;
    double t0 = now(), t;
    do {
        for (int i = 0; i < len_order; i++, iters++) {
            struct ibv_mr *mr = ibv_reg_mr(pd, bufs + (size_t)order[i] * len, len, flags);
            if (!mr || ibv_dereg_mr(mr)) {
                fprintf(stderr, "registration failed\n");
                return 1;
            }
            if ((i & 15) == 15 && (t = now()) - t0 >= seconds)
                break;
        }
        t = now();
    } while (t - t0 < seconds);
    double ns = (t - t0) * 1e9 / iters;
    printf("BENCH evict pattern=%s buffers=%d size=%zu access=%s iters=%ld ns_per_pair=%.0f "
           "pairs_per_s=%.0f first_pair_ns=%.0f\n", pattern, n, len, access, iters, ns, 1e9 / ns, first_ns);
    free(bufs);
    free(order);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    return 0;
}
