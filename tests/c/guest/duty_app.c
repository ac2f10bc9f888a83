/* For the case bench_app_agree: what an application without the preload pays for
 * ibv_reg_mr + ibv_dereg_mr of one populated buffer, at the duty cycle `mrcache bench`
 * measures its no-preload column at: rounds of BUSY seconds of pairs back to back, each
 * followed by IDLE seconds asleep (the control process of the bench does one phase of
 * 1/48 of a row's budget per round, and a round, with its rest, lasts 2 x (2/48 + 1/160)
 * of it: at --seconds 2, 21 ms busy and 75 ms idle). Each round's figure is its total time over its pairs (what the application's run
 * time grows by, every slow pair included); a row is the median over ROW seconds of
 * rounds, as the bench's no-preload column is. The rows come in the bench's order.
 * Usage: duty_app BUSY IDLE ROW (seconds). Prints, per row:
 * app SIZE local|remote mean_us MEDIAN rounds N min MIN max MAX (us). */
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
static void sleep_ns(double ns) {
    long long v = (long long)ns;
    struct timespec z = {(time_t)(v / 1000000000LL), (long)(v % 1000000000LL)};
    nanosleep(&z, 0);
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
#define MAX_ROUNDS 1000
int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: duty_app BUSY IDLE ROW\n"); return 2; }
    double busy = atof(argv[1]) * 1e9, idle = atof(argv[2]) * 1e9, row = atof(argv[3]) * 1e9;
    int n;
    struct ibv_device **l = ibv_get_device_list(&n);
    if (!l || !n) { fprintf(stderr, "no device\n"); return 1; }
    struct ibv_context *ctx = ibv_open_device(l[0]);
    struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : 0;
    if (!pd) { fprintf(stderr, "no pd\n"); return 1; }
    size_t sizes[] = {4096, 65536, 1 << 20, 64 << 20};
    for (int s = 0; s < 4; s++) {
        for (int a = 0; a < 2; a++) {
            size_t len = sizes[s];
            int fl = IBV_ACCESS_LOCAL_WRITE | (a ? IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE : 0);
            char *buf = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
            if (buf == MAP_FAILED) { perror("mmap"); return 1; }
            memset(buf, 1, len);
            for (int i = 0; i < 3; i++) ibv_dereg_mr(ibv_reg_mr(pd, buf, len, fl));
            static double r[MAX_ROUNDS];
            int k = 0;
            double t0 = now_ns();
            while (k < MAX_ROUNDS && (k == 0 || now_ns() - t0 < row)) {
                double t = now_ns(), took;
                long p = 0;
                do {
                    struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, fl);
                    if (!mr) { perror("reg"); return 1; }
                    ibv_dereg_mr(mr);
                    p++;
                } while ((took = now_ns() - t) < busy);
                r[k++] = took / p;
                sleep_ns(idle);
            }
            qsort(r, k, sizeof *r, cmp);
            double med = k % 2 ? r[k / 2] : (r[k / 2 - 1] + r[k / 2]) / 2;
            printf("app %zu %s mean_us %.1f rounds %d min %.1f max %.1f\n", len, a ? "remote" : "local",
                   med / 1000, k, r[0] / 1000, r[k - 1] / 1000);
            munmap(buf, len);
        }
    }
    return 0;
}
