/* A pass-through's ibv_dereg_mr made while this thread is inside one
 * of libmrcache's hooks (here from a signal handler the provider's registration raises)
 * goes to libibverbs without leaving the pass-through table (the guard refuses the nested
 * call): its address stays behind. Twice at one address (the allocator hands the same
 * chunk back), then a registration the cache keeps lands there: forget_passed takes only
 * one copy, so the app's ibv_dereg_mr of the cached MR goes straight to libibverbs, which
 * frees it while the cache keeps it (the next hit hands out the freed MR).
 * Prints what happened; exit 0: the cached MR survived; 1: the cache's MR was freed
 * behind it; 3: set-up failed (or the allocator did not reuse the address: no result). */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define LEN 65536ul
static struct ibv_pd pd;
static struct ibv_mr *victim;
static int fake_regs, fake_deregs, double_frees;
/* The provider's live MRs, to catch a deregistration of one already freed. */
static struct ibv_mr *live[4096];
static int nlive;

static void track(struct ibv_mr *mr) {
    if (mr && nlive < 4096) live[nlive++] = mr;
}

static int untrack(struct ibv_mr *mr) {
    for (int i = 0; i < nlive; i++)
        if (live[i] == mr) return live[i] = live[--nlive], 1;
    return 0;
}

static void on_signal(int sig) {
    (void)sig;
    /* The app's dereg, nested inside the registration hook. */
    if (victim && ibv_dereg_mr(victim)) fprintf(stderr, "nested dereg failed\n");
    victim = NULL;
}

static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)addr, (void)len, (void)iova, (void)access;
    struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr) + 64);
    track(mr);
    fake_regs++;
    if (victim) raise(SIGUSR1);
    return mr;
}

static int fake_dereg(struct ibv_mr *mr) {
    fake_deregs++;
    if (!untrack(mr)) {
        double_frees++;
        fprintf(stdout, "provider: deregistration of %p, not a live MR (freed already)\n", (void *)mr);
        return 0; /* not freed again: the report goes on */
    }
    free(mr);
    return 0;
}

static struct ibv_mr *reg(char *b, int remote) {
    return ibv_reg_mr(&pd, b, LEN, IBV_ACCESS_LOCAL_WRITE | (remote ? IBV_ACCESS_REMOTE_WRITE : 0));
}

int main(void) {
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    signal(SIGUSR1, on_signal);
    char *bufs = mmap(NULL, 8 * LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (bufs == MAP_FAILED) return 3;
    /* Warm up: the library's start, its first allocations. */
    for (int i = 0; i < 50; i++) {
        struct ibv_mr *m = reg(bufs, 1);
        if (!m || ibv_dereg_mr(m)) return 3;
    }
    struct ibv_mr *p1 = reg(bufs, 1); /* passed through (MRCACHE_REMOTE=bypass): noted */
    victim = p1;
    struct ibv_mr *p2 = reg(bufs + LEN, 1); /* p1 deregistered nested: left behind */
    struct ibv_mr *p3 = reg(bufs, 1); /* the allocator gives p1's chunk back: noted again */
    printf("p1 %p p2 %p p3 %p\n", (void *)p1, (void *)p2, (void *)p3);
    if (p3 != p1) return 3;
    victim = p3;
    struct ibv_mr *p4 = reg(bufs + 2 * LEN, 1); /* p3 deregistered nested: left behind */
    struct ibv_mr *c = reg(bufs + 4 * LEN, 0); /* local: cached (a miss) */
    printf("cached %p (the left-behind address %p)\n", (void *)c, (void *)p1);
    if (c != p1) return 3;
    /* Any unmap (here of an unrelated page) begins an invalidation: until the next drain
     * the lock-free release declines and the dereg takes the full path. */
    void *scratch = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (scratch == MAP_FAILED || munmap(scratch, 4096)) return 3;
    int before = fake_deregs;
    int rc = ibv_dereg_mr(c); /* the cache keeps its registration: no provider dereg */
    int freed = fake_deregs - before;
    printf("dereg of the cached MR: rc %d, provider deregistrations %d\n", rc, freed);
    ibv_dereg_mr(p2), ibv_dereg_mr(p4);
    if (freed != 0) {
        /* The cache still serves it: a hit on the same buffer hands out the freed MR. */
        int regs = fake_regs;
        struct ibv_mr *again = reg(bufs + 4 * LEN, 0);
        printf("the cache's own MR %p was freed by the provider while the cache keeps it; "
               "the next registration of that buffer returned %p (%s, %s)\n",
               (void *)c, (void *)again, again == c ? "the freed MR" : "another handle",
               fake_regs == regs ? "a hit: no provider registration" : "a provider registration");
        if (again) ibv_dereg_mr(again);
        printf("provider deregistrations of MRs already freed: %d\n", double_frees);
        return 1;
    }
    return 0;
}
