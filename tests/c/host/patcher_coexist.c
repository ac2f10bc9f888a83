/* mrcache and a third code patcher (patcher/fake_patcher.c, libfabric 1.17's memhooks form)
 * in one process, with a fake provider: the program dlopens the patcher, which patches
 * libc's munmap over mrcache's jump; the first registration sets mrcache up, which takes the
 * entry back and chains to the patcher's hook. A munmap must reach both. Then the patcher
 * restores the bytes it kept and the program dlcloses it: munmap must still work (mrcache
 * must not call into an unloaded library) and still reach mrcache.
 * Exit 0: all well; 1: mrcache missed the first munmap; 2: the patcher did; 3: mrcache
 * missed the one after dlclose; 4: set-up failed; 5: caching was off. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static int registrations;
static struct ibv_mr *fake_reg(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
    (void)pd, (void)addr, (void)len, (void)iova, (void)access;
    registrations++;
    return calloc(1, sizeof(struct ibv_mr) + 64);
}
static int fake_dereg(struct ibv_mr *mr) {
    free(mr);
    return 0;
}
static struct ibv_pd pd;

/* Registers and releases [buf, buf+len); returns whether the provider registered anew. */
static int missed(void *buf, size_t len) {
    int before = registrations;
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
    if (!mr)
        exit(4);
    ibv_dereg_mr(mr);
    return registrations > before;
}

static char *mapped(char *at, size_t len) {
    int fixed = at ? MAP_FIXED_NOREPLACE : 0;
    char *p = mmap(at, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | fixed, -1, 0);
    if (p == MAP_FAILED || (at && p != at))
        exit(4);
    memset(p, 1, len);
    return p;
}

int main(void) {
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))(void (*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))(void (*)(void))fake_dereg;
    pd.context = &ctx;
    void *h = dlopen("libfake_patcher.so", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 4;
    }
    int (*start)(void) = (int (*)(void))dlsym(h, "patcher_start");
    int (*stop)(void) = (int (*)(void))dlsym(h, "patcher_stop");
    char **lo = dlsym(h, "patcher_lo"), **hi = dlsym(h, "patcher_hi");
    int *events = dlsym(h, "patcher_events");
    if (!start || !stop || !lo || !hi || !events || start())
        return 4;
    size_t len = 1 << 20;
    char *buf = mapped(NULL, len);
    *lo = buf, *hi = buf + len;
    missed(buf, len);
    if (missed(buf, len)) {
        printf("caching is off (the second registration was not a hit)\n");
        return 5;
    }
    munmap(buf, len);
    int patcher_saw = *events > 0;
    int mrcache_saw = missed(mapped(buf, len), len);
    printf("munmap: mrcache %s, the patcher %s\n", mrcache_saw ? "saw it" : "MISSED",
           patcher_saw ? "saw it" : "MISSED");
    if (!mrcache_saw || !patcher_saw)
        return mrcache_saw ? 2 : 1;
    if (stop() || dlclose(h))
        return 4;
    missed(buf, len);
    munmap(buf, len);
    int after = missed(mapped(buf, len), len);
    printf("after dlclose: mrcache %s\n", after ? "saw it" : "MISSED");
    return after ? 0 : 3;
}
