/* Registration benchmark: a loop of ibv_reg_mr + ibv_dereg_mr of one buffer, for SECONDS
 * per size, with local-only access (LOCAL_WRITE) or remote access (LOCAL_WRITE |
 * REMOTE_WRITE, which MRCACHE_REMOTE governs under the preload).
 *   regmr [SECONDS] [local|remote] [SIZE...]   (SIZE in bytes, or with a k/m/g suffix;
 *                                              default 2 s, remote, 4k 64k 1m 16m 64m)
 * Prints one line per size:
 *   BENCH size=<bytes> access=<local|remote> iters=<n> ns_per_pair=<ns> regs_per_s=<r>
 *         first_pair_ns=<ns>
 * The first pair of each size is made before the timed loop and reported apart
 * (first_pair_ns): under the preload the first registration of the process sets the
 * library up (configuration, patching libc, the self-test, the drain thread), 150-230 ms in
 * the rxe guest at load 6-9, which inside a 1 s loop made every pass-through look 0.55-0.8x
 * libibverbs alone whatever the per-call cost (docs/performance.md).
 * Run it with and without libmrcache.so preloaded (ci/bench does both in one VM boot,
 * alternating, one process per size, and prints the ratios). */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static size_t parse_size(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    }
    return *end || v == 0 ? 0 : (size_t)v;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0; /* per size */
    const char *access = argc > 2 ? argv[2] : "remote";
    int flags = IBV_ACCESS_LOCAL_WRITE;
    if (!strcmp(access, "remote"))
        flags |= IBV_ACCESS_REMOTE_WRITE;
    else if (strcmp(access, "local")) {
        fprintf(stderr, "regmr: access '%s': use local or remote\n", access);
        return 2;
    }
    size_t sizes[32] = {4096, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
    int n = 5;
    if (argc > 3) {
        n = 0;
        for (int i = 3; i < argc && n < 32; i++) {
            sizes[n] = parse_size(argv[i]);
            if (!sizes[n]) {
                fprintf(stderr, "regmr: size '%s': use bytes or a k/m/g suffix\n", argv[i]);
                return 2;
            }
            n++;
        }
    }
    struct ibv_device **list = ibv_get_device_list(NULL);
    if (!list || !list[0]) {
        fprintf(stderr, "no RDMA device\n");
        return 1;
    }
    struct ibv_context *ctx = ibv_open_device(list[0]);
    struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
    if (!pd) {
        fprintf(stderr, "cannot open the device\n");
        return 1;
    }
    for (int s = 0; s < n; s++) {
        size_t len = sizes[s];
        char *buf = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);
        if (!buf) {
            fprintf(stderr, "no memory for %zu bytes\n", len);
            return 1;
        }
        memset(buf, 1, len);
        double f0 = now();
        struct ibv_mr *first = ibv_reg_mr(pd, buf, len, flags);
        if (!first || ibv_dereg_mr(first)) {
            fprintf(stderr, "registration failed at size %zu\n", len);
            return 1;
        }
        double first_ns = (now() - f0) * 1e9;
        long iters = 0;
        double t0 = now(), t;
        do {
            for (int k = 0; k < 16; k++, iters++) {
                struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, flags);
                if (!mr || ibv_dereg_mr(mr)) {
                    fprintf(stderr, "registration failed at size %zu\n", len);
                    return 1;
                }
            }
            t = now();
        } while (t - t0 < seconds);
        double ns = (t - t0) * 1e9 / iters;
        printf("BENCH size=%zu access=%s iters=%ld ns_per_pair=%.0f regs_per_s=%.0f "
               "first_pair_ns=%.0f\n", len, access, iters, ns, 1e9 / ns, first_ns);
        fflush(stdout);
        free(buf);
    }
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    return 0;
}
