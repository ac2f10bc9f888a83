/* A registration a provider makes through the public API while libmrcache is inside one
 * of its calls passes through (docs/design/overview.md, "Interposition": one registration is never processed twice).
 * Here the outer call is one of a remote class admission passes through steadily (dear
 * binds, MRCACHE_REMOTE=revoke), so the lock-free lane takes it (the
 * lane once ran libibverbs without the guard, and the nested call was served the cache's MR).
 *   nested_lane public    the provider registers b (cached, local 4 KiB) and deregisters
 *                         it through the public API
 *   nested_lane internal  ... and frees it through its own op (as it would its own object)
 * exit 0: every nested registration passed through; 1: one was served from the cache. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static long bind_ns;
static char *nest_in, *nest_on;
static struct ibv_mr *nested_mr;
static int internal;
static struct ibv_pd pd;
#define LIVE 4096
static struct ibv_mr *live[LIVE];
static int dead_use;

#include "fake_timed_windows.h"

static int is_live(struct ibv_mr *mr) {
    for (int i = 0; i < LIVE; i++) if (mr && live[i] == mr) return 1;
    return 0;
}
static int fake_dereg(struct ibv_mr *mr);
static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)iova;
    struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr) + 64);
    mr->addr = addr, mr->length = len, mr->lkey = 7, mr->rkey = 7;
    *(int *)(mr + 1) = access;
    for (int i = 0; i < LIVE; i++) if (!live[i]) { live[i] = mr; break; }
    if (nest_in && addr == nest_in) {
        char *on = nest_on;
        nest_in = NULL; /* once */
        nested_mr = ibv_reg_mr(&pd, on, 4096, IBV_ACCESS_LOCAL_WRITE);
        if (nested_mr) {
            if (internal) fake_dereg(nested_mr); /* its own object: its own op */
            else ibv_dereg_mr(nested_mr);
        }
    }
    return mr;
}
static int fake_dereg(struct ibv_mr *mr) {
    for (int i = 0; i < LIVE; i++)
        if (live[i] == mr) { live[i] = NULL; return 0; } /* never freed: no address reuse */
    dead_use++;
    printf("provider: dereg of %p, not a live MR\n", (void *)mr);
    return 0;
}
int main(int argc, char **argv) {
    internal = argc > 1 && !strcmp(argv[1], "internal");
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    ctx.ops.alloc_mw = fake_alloc_mw;
    ctx.ops.dealloc_mw = fake_dealloc_mw;
    ctx.ops.bind_mw = fake_bind_mw;
    ctx.ops.poll_cq = fake_poll_cq;
    pd.context = &ctx;
    size_t len = 64 << 10;
    char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *b = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(buf, 1, len), memset(b, 1, 4096);
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    bind_ns = 200000;
    for (int i = 0; i < 300; i++) {
        struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, access);
        if (!mr || ibv_dereg_mr(mr)) return 3;
    }
    struct ibv_mr *cached = NULL;
    for (int i = 0; i < 3; i++) {
        struct ibv_mr *m = ibv_reg_mr(&pd, b, 4096, IBV_ACCESS_LOCAL_WRITE);
        if (!m || ibv_dereg_mr(m)) return 3;
        if (i && m != cached) { fprintf(stderr, "b not cached\n"); return 3; }
        cached = m;
    }
    int served = 0, rounds = 20;
    for (int i = 0; i < rounds; i++) {
        nest_in = buf, nest_on = b, nested_mr = NULL;
        struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, access);
        if (!mr || ibv_dereg_mr(mr)) return 3;
        if (nested_mr == cached) served++;
        if (internal && served) break;
    }
    printf("nested registrations served the cache's own MR %p: %d of the rounds\n", (void *)cached, served);
    if (internal && served) {
        struct ibv_mr *again = ibv_reg_mr(&pd, b, 4096, IBV_ACCESS_LOCAL_WRITE);
        printf("after the provider freed it: ibv_reg_mr(b) returned %p (%s)\n", (void *)again,
               again == cached ? (is_live(again) ? "the cached MR, live" : "the cached MR, NOT live in the provider") : "another");
        if (again) ibv_dereg_mr(again);
        printf("the cache's MR %p live in the provider: %d\n", (void *)cached, is_live(cached));
    }
    return served ? 1 : 0;
}
