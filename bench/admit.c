/* Admission benchmark (issue 21): a loop of ibv_reg_mr + ibv_dereg_mr of one buffer per
 * size, 4 KiB to 64 MiB, with local-only or remote (REMOTE_WRITE) access. Run it with and
 * without libmrcache.so preloaded in one VM boot and compare.
 *   admit local|remote [SECONDS_PER_SIZE]
 * Prints: BENCH access=<local|remote> size=<bytes> iters=<n> ns_per_pair=<ns> */
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

int main(int argc, char **argv) {
    const char *kind = argc > 1 ? argv[1] : "local";
    double seconds = argc > 2 ? atof(argv[2]) : 2.0;
    int access = IBV_ACCESS_LOCAL_WRITE;
    if (!strcmp(kind, "remote"))
        access |= IBV_ACCESS_REMOTE_WRITE;
    else if (strcmp(kind, "local")) {
        fprintf(stderr, "usage: admit local|remote [SECONDS_PER_SIZE]\n");
        return 2;
    }
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
    struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
    if (!pd) {
        fprintf(stderr, "admit: no RDMA device\n");
        return 1;
    }
    size_t sizes[] = {4096, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t len = sizes[s];
        char *buf = malloc(len);
        memset(buf, 1, len);
        long iters = 0;
        double t0 = now(), t;
        do {
            for (int k = 0; k < 8; k++, iters++) {
                struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, access);
                if (!mr || ibv_dereg_mr(mr)) {
                    fprintf(stderr, "admit: registration failed at size %zu\n", len);
                    return 1;
                }
            }
            t = now();
        } while (t - t0 < seconds);
        printf("BENCH access=%s size=%zu iters=%ld ns_per_pair=%.0f\n", kind, len, iters,
               (t - t0) * 1e9 / iters);
        fflush(stdout);
        free(buf);
    }
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    return 0;
}
