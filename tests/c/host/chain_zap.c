/* mrcache sees an unmap that went through a chain of interposers. A fake provider (the
 * ibv_context ops count registrations; libmrcache.so preloaded) registers a buffer, the
 * cache keeps it, the buffer is unmapped and mapped again at the same address (or its pages
 * dropped, or its write access taken away), and registered again: a second provider registration means the hook reported
 * it, a cache hit means it did not (a stale registration on a real HCA).
 *   chain_zap munmap|madvise|mprotect    exit 0: reported; 1: not reported
 *   chain_zap count             no verbs: ROUNDS munmaps only
 * Built with -DOWN_MUNMAP the program defines munmap itself, as MVAPICH2's mem_hooks do:
 * it counts the call (its own invalidation) and calls the next munmap (dlsym RTLD_NEXT);
 * it prints "own munmap: N" at the end, N the calls it got for the program's buffers. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define ROUNDS 5

/* The program's buffers' length (no other library unmaps this much here). */
static const size_t len = 4 * 4096;

#ifdef OWN_MUNMAP
static unsigned long own_munmaps;
int munmap(void *addr, size_t l) {
    static int (*next)(void *, size_t);
    if (!next) next = (int (*)(void *, size_t))dlsym(RTLD_NEXT, "munmap");
    if (l == len) __atomic_fetch_add(&own_munmaps, 1, __ATOMIC_RELAXED);
    return next(addr, l);
}
#endif

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

static char *map(char *at) {
    return mmap(at, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED : 0), -1, 0);
}

static int done(int rc) {
#ifdef OWN_MUNMAP
    printf("own munmap: %lu\n", own_munmaps);
#endif
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    if (!strcmp(argv[1], "count")) {
        for (int i = 0; i < ROUNDS; i++) {
            char *p = map(NULL);
            if (p == MAP_FAILED || munmap(p, len)) return 3;
        }
        return done(0);
    }
    static struct ibv_context ctx;
    static struct ibv_pd pd;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    int access = IBV_ACCESS_LOCAL_WRITE;
    int stale = 0;
    for (int i = 0; i < ROUNDS; i++) {
        char *buf = map(NULL);
        if (buf == MAP_FAILED) return 3;
        memset(buf, 1, len);
        int before = registrations;
        struct ibv_mr *mr = ibv_reg_mr(&pd, buf, len, access);
        if (!mr || ibv_dereg_mr(mr)) return 3;
        mr = ibv_reg_mr(&pd, buf, len, access);
        if (!mr || ibv_dereg_mr(mr) || registrations != before + 1) {
            fprintf(stderr, "chain_zap: the cache did not keep the registration (%d)\n", registrations - before);
            return 3;
        }
        if (!strcmp(argv[1], "munmap")) {
            if (munmap(buf, len) || map(buf) != buf) return 3;
        } else if (!strcmp(argv[1], "madvise")) {
            if (madvise(buf, len, MADV_DONTNEED)) return 3;
        } else if (!strcmp(argv[1], "mprotect")) {
            /* Write access taken away (and given back): the entry must go. */
            if (mprotect(buf, len, PROT_READ) || mprotect(buf, len, PROT_READ | PROT_WRITE)) return 3;
        } else {
            return 2;
        }
        memset(buf, 2, len);
        mr = ibv_reg_mr(&pd, buf, len, access);
        if (!mr || ibv_dereg_mr(mr)) return 3;
        stale += registrations == before + 1;
        if (munmap(buf, len)) return 3;
    }
    printf("%s: %d of %d reported\n", argv[1], ROUNDS - stale, ROUNDS);
    return done(stale ? 1 : 0);
}
