/* A program without threads: cache an idle entry, unmap its memory (munmap / madvise
 * DONTNEED / mremap / MAP_FIXED over it), map again at the same address, register at once
 * (well inside the inline drain's 20 ms): every such registration must reach the provider.
 * prints "stale N of M"; exit 0. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
static int shim_regs;
static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)addr, (void)len, (void)iova, (void)access;
    shim_regs++;
    return calloc(1, sizeof(struct ibv_mr) + 64);
}
static int fake_dereg(struct ibv_mr *mr) { free(mr); return 0; }
static struct ibv_context ctx;
static struct ibv_pd pd;
int main(void) {
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    size_t len = 1 << 20;
    int stale = 0, n = 0;
    /* One reservation: every mapping below lands inside it (MAP_FIXED, mremap's target). */
    char *arena = mmap(NULL, 4 * len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (int r = 0; r < 4000; r++) {
        char *b = mmap(arena, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        memset(b, 1, 4096);
        struct ibv_mr *m = ibv_reg_mr(&pd, b, len, IBV_ACCESS_LOCAL_WRITE);
        ibv_dereg_mr(m);
        m = ibv_reg_mr(&pd, b, len, IBV_ACCESS_LOCAL_WRITE); /* a hit: fast path armed */
        ibv_dereg_mr(m);
        switch (r % 4) {
        case 0: munmap(b, len); b = mmap(b, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0); break;
        case 1: madvise(b, len, MADV_DONTNEED); break;
        case 2: b = mmap(b, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0); break;
        case 3: { char *o = mremap(b, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, b + 2 * len); (void)o;
                  b = mmap(b, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
                  mmap(o, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0); break; }
        }
        int before = shim_regs;
        m = ibv_reg_mr(&pd, b, len, IBV_ACCESS_LOCAL_WRITE);
        n++;
        if (shim_regs == before) stale++;
        ibv_dereg_mr(m);
        mmap(arena, 4 * len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    }
    printf("stale %d of %d\n", stale, n);
    return 0;
}
