/* Registration benchmark: a loop of ibv_reg_mr + ibv_dereg_mr of one buffer, per buffer
 * size. Prints one line per size: BENCH size=<bytes> iters=<n> ns_per_pair=<ns>
 * regs_per_s=<r>. Run it with and without libmrcache.so preloaded (ci/bench does both in
 * one VM boot and prints the ratio). */
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
    double seconds = argc > 1 ? atof(argv[1]) : 2.0; /* per size */
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
    size_t sizes[] = {4096, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t len = sizes[s];
        char *buf = malloc(len);
        memset(buf, 1, len);
        long iters = 0;
        double t0 = now(), t;
        do {
            for (int k = 0; k < 16; k++, iters++) {
                struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
                if (!mr || ibv_dereg_mr(mr)) {
                    fprintf(stderr, "registration failed at size %zu\n", len);
                    return 1;
                }
            }
            t = now();
        } while (t - t0 < seconds);
        double ns = (t - t0) * 1e9 / iters;
        printf("BENCH size=%zu iters=%ld ns_per_pair=%.0f regs_per_s=%.0f\n", len, iters, ns, 1e9 / ns);
        fflush(stdout);
        free(buf);
    }
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    return 0;
}
