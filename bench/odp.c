/* On-demand paging against pinning, per buffer size, on the device's loopback (rxe):
 *   pinned    ibv_reg_mr + ibv_dereg_mr of a populated buffer, local access, as the app asks
 *             (under the preload with MRCACHE_ODP=on: the cache's hit on its on-demand entry)
 *   odp       the same pair with IBV_ACCESS_ON_DEMAND (libibverbs alone: the preload passes
 *             an app's own ON_DEMAND request through)
 *   write     one RDMA WRITE of the whole buffer into a pinned registration of it
 *   first     the same WRITE into a fresh on-demand registration: the device faults every
 *             page in (what an on-demand entry's first use costs)
 * Medians of ROUNDS rounds (or as many as fit in SECONDS per figure), in us, and the ratios
 * odp/pinned and first/write. Not a test: rxe under TCG only gives the shape, and its
 * writes wait for a workqueue the polling thread competes with (milliseconds, noisy).
 *   odp [SECONDS]   (ci/bench odp runs it plain and under the preload, one boot) */
#include "lib/loopback.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define ROUNDS 200
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

static struct loopback lb;

/* One figure: the median time of `op` over rounds, within `secs`. */
static double figure(double secs, double (*op)(char *, size_t), char *buf, size_t len) {
    static double r[ROUNDS];
    int k = 0;
    double t0 = now_us();
    while (k < ROUNDS && (k < 3 || now_us() - t0 < secs * 1e6)) {
        double t = op(buf, len);
        if (t < 0)
            return -1;
        r[k++] = t;
    }
    return median(r, k);
}

static double pair(char *buf, size_t len, int extra) {
    double t = now_us();
    struct ibv_mr *mr = ibv_reg_mr(lb.pd, buf, len, IBV_ACCESS_LOCAL_WRITE | extra);
    if (!mr) {
        fprintf(stderr, "odp: ibv_reg_mr(%zu%s): %s\n", len, extra ? ", ON_DEMAND" : "",
                strerror(errno));
        return -1;
    }
    ibv_dereg_mr(mr);
    return now_us() - t;
}
static double pinned(char *buf, size_t len) { return pair(buf, len, 0); }
static double odp(char *buf, size_t len) { return pair(buf, len, IBV_ACCESS_ON_DEMAND); }

/* One WRITE of len bytes (in stage-sized pieces) into mr at buf. */
static double write_into(struct ibv_mr *mr, char *buf, size_t len) {
    double t = now_us();
    for (size_t off = 0; off < len; off += LB_STAGE_BYTES) {
        size_t n = len - off < LB_STAGE_BYTES ? len - off : LB_STAGE_BYTES;
        if (lb_write(&lb, lb.stage, n, lb.stage_mr->lkey, (uintptr_t)(buf + off), mr->rkey))
            return -1;
    }
    return now_us() - t;
}
static struct ibv_mr *pinned_mr; /* the buffer's pinned registration, for write_pinned */
static double write_pinned(char *buf, size_t len) { return write_into(pinned_mr, buf, len); }
/* A fresh on-demand registration each round, over pages dropped first, so that the device
 * faults every one in (the registration itself is not timed). */
static double write_first(char *buf, size_t len) {
    madvise(buf, len, MADV_DONTNEED);
    memset(buf, 1, len);
    struct ibv_mr *mr = ibv_reg_mr(lb.pd, buf, len, ACCESS | IBV_ACCESS_ON_DEMAND);
    if (!mr)
        return -1;
    double t = write_into(mr, buf, len);
    ibv_dereg_mr(mr);
    return t;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 0.5;
    if (lb_open(&lb, NULL))
        return 2;
    printf("%-9s %10s %10s %8s %10s %10s %8s\n", "size", "pinned us", "odp us", "odp/pin",
           "write us", "first us", "first/w");
    size_t sizes[] = {4096, 65536, 1 << 20, 16 << 20};
    for (int s = 0; s < 4; s++) {
        size_t len = sizes[s];
        char *buf = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                         -1, 0);
        memset(buf, 1, len);
        double p = figure(secs, pinned, buf, len), o = figure(secs, odp, buf, len);
        pinned_mr = ibv_reg_mr(lb.pd, buf, len, ACCESS);
        if (!pinned_mr)
            return 1;
        double w = figure(secs, write_pinned, buf, len);
        ibv_dereg_mr(pinned_mr);
        double f = figure(secs, write_first, buf, len);
        if (p < 0 || o < 0 || w < 0 || f < 0)
            return 1;
        char name[32];
        snprintf(name, sizeof name, "%zu KiB", len >> 10);
        printf("%-9s %10.1f %10.1f %7.2fx %10.1f %10.1f %7.2fx\n", name, p, o, o / p, w, f, f / w);
        munmap(buf, len);
    }
    lb_close(&lb);
    return 0;
}
