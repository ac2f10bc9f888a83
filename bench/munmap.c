/* What the memory hooks cost: munmap, madvise(MADV_DONTNEED) or mremap (shrink to half)
 * of 64 KiB of fresh anonymous memory (first page touched), each call timed alone and the
 * median taken (a loaded host preempts some calls: a mean would time the load). Run with
 * and without libmrcache.so preloaded (ci/bench compares). MODE says what the memory is to
 * the cache:
 *   idle    the process never touches verbs (the cost every other process pays);
 *   active  the process registered another buffer first, so the cache exists and every
 *           call is reported to it, but this memory was never registered;
 *   held    this memory was registered and deregistered just before the call (with the
 *           preload the cache holds it as an idle entry: the call invalidates it, and the
 *           deregistration happens at the next drain, here the next ibv_reg_mr).
 * Besides the call it prints the median whole iteration (mmap, touch, [reg, dereg,] call,
 * and the munmap left after madvise or mremap), where "held" pays the deferred
 * deregistration.
 * DEVICE "rdma" (default) uses the first RDMA device; "fake" a provider whose registrations
 * do nothing (no RDMA needed: the host), so the figures show the cache's own work. Without
 * the preload libibverbs cannot call the fake context: the program then calls the fake
 * provider itself, which is what registering costs there without a cache.
 *   munmap MODE OP [ITERATIONS] [DEVICE]
 *     MODE: idle|active|held   OP: munmap|madvise|mremap   DEVICE: rdma|fake
 * Prints: BENCH unmap op=<op> mode=<mode> device=<device> iters=<n> median_call_ns=<ns>
 *         median_iter_ns=<ns> */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define LEN (64 << 10)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int usage(void) {
    fprintf(stderr, "usage: munmap idle|active|held munmap|madvise|mremap [ITERATIONS] [rdma|fake]\n");
    return 2;
}

static struct ibv_mr *fake_reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
    (void)iova, (void)access;
    struct ibv_mr *mr = calloc(1, sizeof *mr);
    if (mr) {
        mr->pd = pd, mr->context = pd->context, mr->addr = addr, mr->length = len;
        mr->lkey = mr->rkey = 1;
    }
    return mr;
}

static int fake_dereg(struct ibv_mr *mr) {
    free(mr);
    return 0;
}

/* Register through ibv_reg_mr (a real device, or the fake one under the preload), or call
 * the fake provider directly (the fake one without the preload). */
static int via_libibverbs;

static struct ibv_mr *reg(struct ibv_pd *pd, void *addr, size_t len) {
    if (!via_libibverbs)
        return fake_reg(pd, addr, len, (uintptr_t)addr, IBV_ACCESS_LOCAL_WRITE);
    return ibv_reg_mr(pd, addr, len, IBV_ACCESS_LOCAL_WRITE);
}

static int dereg(struct ibv_mr *mr) {
    return via_libibverbs ? ibv_dereg_mr(mr) : fake_dereg(mr);
}

int main(int argc, char **argv) {
    if (argc < 3)
        return usage();
    const char *mode = argv[1], *op = argv[2];
    long iters = argc > 3 ? atol(argv[3]) : 20000;
    const char *device = argc > 4 ? argv[4] : "rdma";
    int fake = !strcmp(device, "fake");
    int held = !strcmp(mode, "held"), verbs = held || !strcmp(mode, "active");
    int op_munmap = !strcmp(op, "munmap"), op_madvise = !strcmp(op, "madvise");
    if ((!verbs && strcmp(mode, "idle")) || (!op_munmap && !op_madvise && strcmp(op, "mremap")) ||
        iters < 1 || (!fake && strcmp(device, "rdma")))
        return usage();
    struct ibv_pd *pd = NULL;
    struct ibv_mr *other = NULL;
    static struct ibv_context fake_ctx;
    static struct ibv_pd fake_pd;
    if (verbs && fake) {
        const char *env = getenv("LD_PRELOAD");
        via_libibverbs = env && strstr(env, "libmrcache");
        /* through void (*)(void): the generic function pointer type -Wextra accepts */
        fake_ctx.ops._compat_reg_mr = (void *(*)(void))(void (*)(void))fake_reg;
        fake_ctx.ops._compat_dereg_mr = (void *(*)(void))(void (*)(void))fake_dereg;
        fake_pd.context = &fake_ctx;
        pd = &fake_pd;
    } else if (verbs) {
        via_libibverbs = 1; /* a real device: libibverbs' calls, preloaded or not */
        struct ibv_device **list = ibv_get_device_list(NULL);
        struct ibv_context *ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
        pd = ctx ? ibv_alloc_pd(ctx) : NULL;
    }
    if (verbs) {
        static char buf[LEN];
        other = pd ? reg(pd, buf, sizeof buf) : NULL;
        if (!other) {
            fprintf(stderr, "modes active and held need an RDMA device (or DEVICE fake)\n");
            return 1;
        }
    }
    double *calls = malloc(iters * sizeof *calls), *whole = malloc(iters * sizeof *whole);
    if (!calls || !whole)
        return 1;
    for (long i = 0; i < iters; i++) {
        double start = now();
        char *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return 1;
        p[0] = 1;
        if (held) {
            struct ibv_mr *mr = reg(pd, p, LEN);
            if (!mr || dereg(mr)) {
                fprintf(stderr, "registration failed\n");
                return 1;
            }
        }
        double t0 = now();
        int bad;
        if (op_munmap)
            bad = munmap(p, LEN) != 0;
        else if (op_madvise)
            bad = madvise(p, LEN, MADV_DONTNEED) != 0;
        else
            bad = mremap(p, LEN, LEN / 2, 0) != p;
        calls[i] = now() - t0;
        if (bad || (!op_munmap && munmap(p, op_madvise ? LEN : LEN / 2))) {
            perror(op);
            return 1;
        }
        whole[i] = now() - start;
    }
    qsort(calls, iters, sizeof *calls, by_value);
    qsort(whole, iters, sizeof *whole, by_value);
    printf("BENCH unmap op=%s mode=%s device=%s iters=%ld median_call_ns=%.0f median_iter_ns=%.0f\n",
           op, mode, verbs ? device : "none", iters, calls[iters / 2] * 1e9, whole[iters / 2] * 1e9);
    free(calls);
    free(whole);
    if (other)
        dereg(other);
    return 0;
}
