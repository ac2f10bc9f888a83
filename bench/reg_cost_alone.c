/* What an application without the preload pays for ibv_reg_mr +
 * ibv_dereg_mr of one populated buffer, in the process's own libibverbs, one device
 * context, nothing else loaded: (a) back to back (consecutive 1 ms rounds, nothing
 * between) and (b) 1 ms bursts with 2 ms idle between (as the base copy sees it in the
 * bench's control, which runs two other phases between). Prints medians in us. */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
#define ROUNDS 400
int main(int argc, char **argv) {
    double budget_s = argc > 1 ? atof(argv[1]) : 0.5;
    int n;
    struct ibv_device **l = ibv_get_device_list(&n);
    if (!l || !n) { fprintf(stderr, "no device\n"); return 1; }
    struct ibv_context *ctx = ibv_open_device(l[0]);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    size_t sizes[] = {4096, 65536, 1 << 20, 64 << 20};
    for (int s = 0; s < 4; s++) {
        for (int a = 0; a < 2; a++) {
            size_t len = sizes[s];
            int fl = IBV_ACCESS_LOCAL_WRITE | (a ? IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE : 0);
            char *buf = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
            memset(buf, 1, len);
            for (int i = 0; i < 3; i++) ibv_dereg_mr(ibv_reg_mr(pd, buf, len, fl));
            double res[2];
            for (int mode = 0; mode < 2; mode++) {
                static double r[ROUNDS];
                int k = 0;
                double t0 = now_ns();
                while (k < ROUNDS && (k == 0 || now_ns() - t0 < budget_s * 1e9)) {
                    double t = now_ns();
                    int p = 0;
                    do {
                        struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, fl);
                        if (!mr) { perror("reg"); return 1; }
                        ibv_dereg_mr(mr);
                        p++;
                    } while (now_ns() - t < 1e6);
                    r[k++] = (now_ns() - t) / p;
                    if (mode == 1) {
                        struct timespec z = {0, 2000000};
                        nanosleep(&z, 0);
                    }
                }
                res[mode] = median(r, k) / 1000;
            }
            printf("app %zu %s back_to_back_us %.1f bursts_us %.1f\n", len, a ? "remote" : "local", res[0], res[1]);
            munmap(buf, len);
        }
    }
    return 0;
}
