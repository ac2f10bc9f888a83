/* The hit path through the whole library, as an application sees it, beside UCX's rcache in
 * the same process: no RDMA device. mrcache side: ibv_reg_mr + ibv_dereg_mr on a fake
 * ibv_context whose provider ops (_compat_reg_mr/_compat_dereg_mr) do nothing but hand out
 * an object, with libmrcache.so preloaded (MRCACHE_MAX_ENTRIES=unlimited). UCX side:
 * ucs_rcache_get + ucs_rcache_region_put with a registrar that does nothing and no memory
 * events. Both on the same pattern: N buffers of 4 KiB a gap page apart, visited in random
 * (or sequential) order; each figure is the median over 201 batches of 1,000
 * registration+deregistration pairs, in ns per pair, after every buffer was registered once.
 *
 *   hitpath [-t THREADS] [-o random|seq] [-a ACCESS] [-s] [-i] [-r ROUNDS] N...  (ci/bench runs it)
 * -a: the registrations' access, `local` (default: local write), `remote` (remote read and
 * write too: passed through under MRCACHE_REMOTE=bypass) or `zero-based` (ZERO_BASED, which
 * the cache passes to libibverbs on its full path). A pass-through needs libibverbs' own
 * ibv_reg_mr_iova2 and ibv_dereg_mr, which cannot handle the fake context: preload
 * tests/c/host/verbs_shim.c after libmrcache.so (ci/bench-hitpath callgrind-paths does).
 * -s: the threads share one set of buffers (contention on the same entries); else each has
 * its own. -r: measure UCX then mrcache ROUNDS times, alternating, and print the medians
 * (default 1). -i: in each measurement, a UCX batch and an mrcache batch in turn (their
 * order alternating), both caches filled first: the two sides see the same machine state
 * within microseconds (ci/bench-hitpath default uses it). Prints one line per N: regions, order, threads, buffers, mrcache ns, ucx ns,
 * ratio. Not a test: figures depend on the machine; compare the ratio.
 * Builds against UCX 1.13 (Debian 12) and 1.18 (Debian 13, ci/aarch64 hitpath).
 * Built with -DCALLGRIND and run under `valgrind --tool=callgrind --collect-atstart=no`,
 * only the timed loops are counted, one dump per side and N (ci/bench-hitpath callgrind). */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucp/api/ucp_version.h>
#include <ucs/memory/rcache.h>
#ifdef CALLGRIND
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_TOGGLE_COLLECT
#define CALLGRIND_DUMP_STATS_AT(name) (void)(name)
#endif

#define BUF 4096ul
#define STRIDE (2 * BUF)
#define BATCH 1000
#define BATCHES 201

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* ---- the fake provider ---- */
static struct ibv_context fake_ctx;
static struct ibv_pd fake_pd;

static struct ibv_mr *fake_reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
    (void)pd, (void)addr, (void)len, (void)iova, (void)access;
    /* Providers allocate struct verbs_mr (ibv_mr + 8 bytes) or more. */
    return calloc(1, sizeof(struct ibv_mr) + 64);
}

static int fake_dereg(struct ibv_mr *mr) {
    free(mr);
    return 0;
}

/* ---- UCX rcache with a no-op registrar ---- */
static ucs_status_t ucx_reg(void *c, ucs_rcache_t *r, void *arg, ucs_rcache_region_t *reg, uint16_t f) {
    (void)c, (void)r, (void)arg, (void)reg, (void)f;
    return UCS_OK;
}
static void ucx_dereg(void *c, ucs_rcache_t *r, ucs_rcache_region_t *reg) { (void)c, (void)r, (void)reg; }
static void ucx_dump(void *c, ucs_rcache_t *r, ucs_rcache_region_t *reg, char *b, size_t m) {
    (void)c, (void)r, (void)reg;
    if (m) b[0] = 0;
}
/* Named fields: UCX 1.18 (Debian 13) put a merge callback between mem_dereg and dump_region. */
static const ucs_rcache_ops_t ucx_ops = {.mem_reg = ucx_reg, .mem_dereg = ucx_dereg, .dump_region = ucx_dump};
static ucs_rcache_t *rcache;
/* UCX 1.17 ("rcache dynamic region alignment", its NEWS) moved the alignment from the
 * cache's parameters to each ucs_rcache_get. */
#if UCP_API_VERSION < UCP_VERSION(1, 17)
#define RCACHE_ALIGNMENT
#else
#define RCACHE_ALIGNMENT UCS_RCACHE_MIN_ALIGNMENT,
#endif

static ucs_rcache_t *make_rcache(void) {
    ucs_rcache_params_t p;
    memset(&p, 0, sizeof p);
    p.region_struct_size = sizeof(ucs_rcache_region_t);
#if UCP_API_VERSION < UCP_VERSION(1, 17)
    p.alignment = UCS_RCACHE_MIN_ALIGNMENT;
    p.max_alignment = 4096;
#endif
    p.ucm_events = 0; /* no memory hooks: lookups only, like the fake provider */
    p.ucm_event_priority = 1000;
    p.ops = &ucx_ops;
    p.flags = UCS_RCACHE_FLAG_NO_PFN_CHECK;
    p.max_regions = (unsigned long)-1;
    p.max_size = (size_t)-1;
    p.max_unreleased = (size_t)-1;
    ucs_rcache_t *r = NULL;
    if (ucs_rcache_create(&p, "bench", NULL, &r) != UCS_OK) {
        fprintf(stderr, "ucs_rcache_create failed\n");
        exit(1);
    }
    return r;
}

/* ---- the pattern ---- */
struct run {
    char *base;      /* this thread's buffers */
    size_t n;
    uint32_t *order; /* visiting order, cycled */
    int use_ucx;     /* -1: both, batch by batch (-i) */
    double median;   /* ns per pair (mrcache's with -i) */
    double median_ucx; /* with -i */
    pthread_barrier_t *start;
};

static int access_flags = IBV_ACCESS_LOCAL_WRITE; /* not a constant: ibv_reg_mr -> _iova2 */

static inline void pair(struct run *r, size_t i) {
    void *buf = r->base + (size_t)r->order[i % r->n] * STRIDE;
    if (r->use_ucx) {
        ucs_rcache_region_t *reg;
        if (ucs_rcache_get(rcache, buf, BUF, RCACHE_ALIGNMENT PROT_READ | PROT_WRITE, NULL, &reg) != UCS_OK) {
            fprintf(stderr, "ucs_rcache_get failed\n");
            exit(1);
        }
        ucs_rcache_region_put(rcache, reg);
    } else {
        struct ibv_mr *mr = ibv_reg_mr(&fake_pd, buf, BUF, access_flags);
        if (!mr || ibv_dereg_mr(mr)) {
            fprintf(stderr, "ibv_reg_mr/ibv_dereg_mr failed\n");
            exit(1);
        }
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* -i: one UCX batch and one mrcache batch in turn (which goes first alternates), on the
 * same buffers and the same visiting order: both sides see the same machine state, where
 * whole measurements apart may not (this machine's speed changes from second to second). */
static void *run_interleaved(struct run *r) {
    for (size_t i = 0; i < r->n; i++) {
        r->use_ucx = 1, pair(r, i);
        r->use_ucx = 0, pair(r, i);
    }
    pthread_barrier_wait(r->start);
    static __thread double t[2][BATCHES];
    size_t k[2] = {0, 0};
    for (int b = 0; b < BATCHES; b++)
        for (int j = 0; j < 2; j++) {
            int side = (b + j) % 2; /* 1: UCX */
            r->use_ucx = side;
            double t0 = now_ns();
            for (int i = 0; i < BATCH; i++) pair(r, k[side]++);
            t[side][b] = (now_ns() - t0) / BATCH;
        }
    qsort(t[0], BATCHES, sizeof t[0][0], cmp);
    qsort(t[1], BATCHES, sizeof t[1][0], cmp);
    r->median = t[0][BATCHES / 2];
    r->median_ucx = t[1][BATCHES / 2];
    return NULL;
}

static void *run(void *arg) {
    struct run *r = arg;
    if (r->use_ucx < 0) return run_interleaved(r);
    for (size_t i = 0; i < r->n; i++) pair(r, i); /* every buffer registered once */
    pthread_barrier_wait(r->start);
    static __thread double t[BATCHES];
    size_t k = 0;
    CALLGRIND_TOGGLE_COLLECT;
    for (int b = 0; b < BATCHES; b++) {
        double t0 = now_ns();
        for (int i = 0; i < BATCH; i++) pair(r, k++);
        t[b] = (now_ns() - t0) / BATCH;
    }
    CALLGRIND_TOGGLE_COLLECT;
    qsort(t, BATCHES, sizeof t[0], cmp);
    r->median = t[BATCHES / 2];
    return NULL;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t next_rand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)rng;
}

/* Median ns per pair on `threads` threads with private buffers (the slowest thread's);
 * use_ucx -1: both in turn, mrcache's returned and UCX's in *ucx. */
static double measure(size_t n, int threads, int random, int shared, int use_ucx, double *ucx) {
    struct run runs[16];
    pthread_t tid[16];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, threads);
    for (int t = 0; t < threads; t++) {
        struct run *r = &runs[t];
        r->n = n, r->use_ucx = use_ucx, r->start = &start;
        r->base = shared && t > 0 ? runs[0].base
                                  : mmap(NULL, n * STRIDE, PROT_READ | PROT_WRITE,
                                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (r->base == MAP_FAILED) {
            perror("mmap");
            exit(1);
        }
        r->order = malloc(n * sizeof *r->order);
        for (size_t i = 0; i < n; i++) r->order[i] = (uint32_t)i;
        if (random)
            for (size_t i = n; i > 1; i--) {
                size_t j = next_rand() % i;
                uint32_t x = r->order[i - 1];
                r->order[i - 1] = r->order[j], r->order[j] = x;
            }
        pthread_create(&tid[t], NULL, run, r);
    }
    double worst = 0, worst_ucx = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        if (runs[t].median > worst) worst = runs[t].median;
        if (runs[t].median_ucx > worst_ucx) worst_ucx = runs[t].median_ucx;
        /* Unmapping invalidates what mrcache holds for the next round. */
        if (!shared || t == 0) munmap(runs[t].base, n * STRIDE);
        free(runs[t].order);
    }
    pthread_barrier_destroy(&start);
    if (ucx) *ucx = worst_ucx;
    return worst;
}

int main(int argc, char **argv) {
    int threads = 1, random = 1, shared = 0, rounds = 1, interleave = 0, i = 1;
    for (; i < argc && argv[i][0] == '-'; i += 2) {
        if (!strcmp(argv[i], "-s")) {
            shared = 1, i--;
            continue;
        }
        if (!strcmp(argv[i], "-i")) {
            interleave = 1, i--;
            continue;
        }
        if (i + 1 >= argc) break;
        if (!strcmp(argv[i], "-a")) {
            if (!strcmp(argv[i + 1], "remote"))
                access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
            else if (!strcmp(argv[i + 1], "zero-based"))
                access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED;
            else if (strcmp(argv[i + 1], "local"))
                i = argc; /* usage */
        } else if (!strcmp(argv[i], "-t")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-o")) random = strcmp(argv[i + 1], "seq") != 0;
        else if (!strcmp(argv[i], "-r")) rounds = atoi(argv[i + 1]);
    }
    if (threads < 1 || threads > 16 || rounds < 1 || rounds > 99 || i >= argc) {
        fprintf(stderr, "usage: hitpath [-t THREADS(1-16)] [-o random|seq] [-a local|remote|zero-based] [-s] [-i] [-r ROUNDS(1-99)] N...\n");
        return 2;
    }
    fake_ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    fake_ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    fake_pd.context = &fake_ctx;
    rcache = make_rcache();
    /* The library sets itself up at the first verbs call; a call racing the set-up passes
     * through to libibverbs, which cannot handle the fake context: one call first, alone. */
    static char warm[BUF];
    struct ibv_mr *w = ibv_reg_mr(&fake_pd, warm, sizeof warm, access_flags);
    if (!w || ibv_dereg_mr(w)) {
        fprintf(stderr, "warm-up registration failed\n");
        return 1;
    }
    printf("%10s %6s %7s %7s %12s %12s %8s\n", "regions", "order", "threads", "buffers", "mrcache_ns",
           "ucx_ns", "ratio");
    for (; i < argc; i++) {
        size_t n = strtoul(argv[i], NULL, 10);
        double ucxs[99], mrcs[99];
        char name[64];
        for (int k = 0; k < rounds; k++) {
            if (interleave) {
                mrcs[k] = measure(n, threads, random, shared, -1, &ucxs[k]);
                continue;
            }
            ucxs[k] = measure(n, threads, random, shared, 1, NULL);
            snprintf(name, sizeof name, "ucx %zu", n);
            CALLGRIND_DUMP_STATS_AT(name);
            mrcs[k] = measure(n, threads, random, shared, 0, NULL);
            snprintf(name, sizeof name, "mrcache %zu", n);
            CALLGRIND_DUMP_STATS_AT(name);
        }
        qsort(ucxs, rounds, sizeof ucxs[0], cmp);
        qsort(mrcs, rounds, sizeof mrcs[0], cmp);
        double ucx = ucxs[rounds / 2], mrc = mrcs[rounds / 2];
        printf("%10zu %6s %7d %7s %12.1f %12.1f %7.2fx\n", n, random ? "random" : "seq", threads,
               shared ? "shared" : "private", mrc, ucx, mrc / ucx);
        fflush(stdout);
    }
    ucs_rcache_destroy(rcache);
    return 0;
}
