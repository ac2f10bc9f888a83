/* A verbs program built with a sanitizer (tests/host/sanitizer_builds.rs): a fake provider
 * (ibv_context ops that count what they register, as tests/c/host/fast_hit.c) and, behind
 * libmrcache.so, verbs_shim.so for libibverbs' reg/dereg. Registers and releases one
 * mmapped buffer ROUNDS times, unmaps it, maps a new one and registers that once. Then a
 * large malloc'd buffer, registered, freed (the sanitizer's allocator unmaps it with its
 * own system call: run with ASan's quarantine off) and mapped again at its place, then
 * registered: a hit there is stale.
 * Prints "cached: N registrations" when the cache served the repeats (the provider saw 1,
 * then 1 more for the new mapping), "uncached: N registrations" when every call passed
 * through (the cache off); exit 0 either way, 1 when the cache served a stale entry, 3 when
 * the set-up failed. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define LEN 65536ul
#define ROUNDS 10
#define LIVE 16
static struct ibv_mr *live[LIVE];
static int registrations;

static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)addr, (void)len, (void)iova, (void)access;
    struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr));
    for (int i = 0; mr && i < LIVE; i++)
        if (!live[i]) {
            live[i] = mr;
            registrations++;
            return mr;
        }
    free(mr);
    return NULL;
}

static int fake_dereg(struct ibv_mr *mr) {
    for (int i = 0; i < LIVE; i++)
        if (live[i] == mr) {
            live[i] = NULL;
            free(mr);
            return 0;
        }
    fprintf(stderr, "san_verbs: the provider was asked to deregister %p, not one of its own\n", (void *)mr);
    exit(1);
}

static struct ibv_pd pd;

static int cycle(char *buf) {
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE);
    if (!mr || mr->addr != buf || ibv_dereg_mr(mr)) {
        fprintf(stderr, "san_verbs: reg/dereg of %p failed\n", (void *)buf);
        return -1;
    }
    return 0;
}

int main(void) {
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    char *buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return 3;
    for (int r = 0; r < ROUNDS; r++)
        if (cycle(buf)) return 3;
    int first = registrations;
    if (munmap(buf, LEN)) return 3;
    char *again = mmap(buf, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (again == MAP_FAILED || cycle(again)) return 3;
    if (first == 1 && registrations == 1) {
        fprintf(stderr, "san_verbs: the registration of an unmapped buffer was served from the cache\n");
        return 1;
    }
    int mapped = registrations;
    size_t big = 4ul << 20;
    char *heap = malloc(big);
    if (!heap) return 3;
    for (int r = 0; r < 3; r++) {
        struct ibv_mr *mr = ibv_reg_mr(&pd, heap, big, IBV_ACCESS_LOCAL_WRITE);
        if (!mr || ibv_dereg_mr(mr)) return 3;
    }
    int before = registrations;
    /* The allocator's block starts in the page holding its header, before `heap`. */
    uintptr_t at = (uintptr_t)heap;
    char *page = (char *)(at & ~(uintptr_t)4095);
    free(heap);
    size_t span = ((at + big + 4095) & ~(uintptr_t)4095) - (uintptr_t)page;
    char *back = mmap(page, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (back != page) {
        fprintf(stderr, "san_verbs: the freed block's pages were not unmapped (%p); run with ASAN_OPTIONS=quarantine_size_mb=0\n", (void *)back);
        return 3;
    }
    struct ibv_mr *mr = ibv_reg_mr(&pd, back + (at - (uintptr_t)page), big, IBV_ACCESS_LOCAL_WRITE);
    if (!mr || ibv_dereg_mr(mr)) return 3;
    if (registrations == before) {
        fprintf(stderr, "san_verbs: a registration of memory the allocator unmapped (free) and mapped again was served from the cache\n");
        return 1;
    }
    int heap_regs = registrations - mapped;
    if (first == 1 && mapped == 2 && heap_regs == 2) {
        printf("cached: %d registrations\n", registrations);
    } else if (first == ROUNDS && mapped == ROUNDS + 1 && heap_regs == 4) {
        printf("uncached: %d registrations\n", registrations);
    } else {
        fprintf(stderr, "san_verbs: %d registrations for %d rounds, then %d; %d for the heap\n", first, ROUNDS, mapped, heap_regs);
        return 1;
    }
    return 0;
}
