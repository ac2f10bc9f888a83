/* Cost-aware admission through the preload, on a fake provider whose registration and
 * window bind costs this program sets (busy waits). Behind libmrcache.so and
 * libadmit_shim.so (which counts the registrations passed through to "libibverbs").
 *   admit_cost remote: one 64 KiB buffer with remote write, registered and deregistered in
 *     turn. Phase "dear-binds": a bind (and an unbind) costs 200 us, a registration almost
 *     nothing: caching does not pay. Phase "dear-regs": a registration costs 300 us, binds
 *     nothing: it pays again. Prints per phase the calls of its last 100 (dear-binds) or 64
 *     (dear-regs) that were passed through. Phase "dear-app-deregs" (a 16 KiB buffer): the
 *     deregistration of an MR with remote rights (the app's own, through libibverbs)
 *     costs 500 us, the cache's (MW_BIND rights, no remote ones) almost nothing, a bind
 *     100 us: without the cache the app pays 500 us a round, cached about 200: prints
 *     the calls of its last 64 passed through.
 *   admit_cost local: local-only, a registration costs 100 us: prints the provider
 *     registrations of 200 rounds.
 *   admit_cost memlock: the provider pins at most 96 KiB (ENOMEM past it, as under
 *     RLIMIT_MEMLOCK), one 64 KiB remote buffer registered and deregistered in turn,
 *     a registration 300 us (the class caches): libibverbs alone never fails here, the
 *     limit holds one registration. A cached remote class's probe registers through
 *     libibverbs a range its cached entry still pins. Prints "memlock: N rounds ok" or the
 *     round that failed; exit 4 then.
 * exit 0 unless set-up failed (3). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static long reg_ns, bind_ns, own_reg_ns, app_dereg_ns;
static long provider_regs;
static size_t pinned, pin_limit;

#include "fake_timed_windows.h"

static struct ibv_mr *fake_reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
    (void)pd, (void)iova;
    spin(access & IBV_ACCESS_MW_BIND ? own_reg_ns : reg_ns);
    if (pin_limit && pinned + len > pin_limit) {
        errno = ENOMEM;
        return NULL;
    }
    pinned += len;
    provider_regs++;
    struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr) + 64);
    mr->addr = addr, mr->length = len, mr->lkey = 7, mr->rkey = 7;
    *(int *)(mr + 1) = access;
    return mr;
}
static int fake_dereg(struct ibv_mr *mr) {
    if (!(*(int *)(mr + 1) & IBV_ACCESS_MW_BIND)) spin(app_dereg_ns);
    pinned -= mr->length;
    free(mr);
    return 0;
}
int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "remote";
    atomic_int *passed = dlsym(RTLD_DEFAULT, "shim_regs");
    if (!passed) {
        fprintf(stderr, "admit_cost: libadmit_shim.so is not preloaded\n");
        return 3;
    }
    static struct ibv_context ctx;
    static struct ibv_pd pd;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    ctx.ops.alloc_mw = fake_alloc_mw;
    ctx.ops.dealloc_mw = fake_dealloc_mw;
    ctx.ops.bind_mw = fake_bind_mw;
    ctx.ops.poll_cq = fake_poll_cq;
    pd.context = &ctx;
    size_t len = 64 << 10;
    char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(buf, 1, len);
    if (!strcmp(mode, "local")) {
        reg_ns = 100000;
        for (int i = 0; i < 200; i++) {
            struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
            if (!mr || ibv_dereg_mr(mr)) return 3;
        }
        printf("local dear-regs: provider registrations %ld of 200, passed %d\n", provider_regs, *passed);
        return 0;
    }
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    if (!strcmp(mode, "memlock")) {
        reg_ns = own_reg_ns = 300000, pin_limit = 96 << 10;
        int rounds = 200;
        for (int i = 0; i < rounds; i++) {
            struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, access);
            if (!mr) {
                printf("memlock: round %d: ibv_reg_mr failed, errno %d (pinned %zu of %zu)\n", i, errno, pinned, pin_limit);
                return 4;
            }
            if (ibv_dereg_mr(mr)) return 3;
        }
        printf("memlock: %d rounds ok, passed %d\n", rounds, *passed);
        return 0;
    }
    char *small = mmap(NULL, 16 << 10, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(small, 1, 16 << 10);
    struct {
        const char *name;
        long reg, app_dereg, bind;
        int rounds, last;
        char *buf;
        size_t len;
    } phases[] = {{"dear-binds", 0, 0, 200000, 300, 100, buf, len},
                  {"dear-regs", 300000, 0, 0, 400, 64, buf, len},
                  {"dear-app-deregs", 0, 500000, 100000, 300, 64, small, 16 << 10}};
    for (int p = 0; p < 3; p++) {
        reg_ns = own_reg_ns = phases[p].reg, app_dereg_ns = phases[p].app_dereg;
        bind_ns = phases[p].bind;
        int before = 0;
        for (int i = 0; i < phases[p].rounds; i++) {
            if (i == phases[p].rounds - phases[p].last) before = *passed;
            struct ibv_mr *mr = ibv_reg_mr(&pd, phases[p].buf, phases[p].len, access);
            if (!mr || ibv_dereg_mr(mr)) {
                fprintf(stderr, "admit_cost: registration failed\n");
                return 3;
            }
        }
        printf("%s: passed %d of the last %d\n", phases[p].name, *passed - before, phases[p].last);
    }
    return 0;
}
