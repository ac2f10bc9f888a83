/* A verbs program built with a sanitizer (tests/guest_sanitizers.rs): a fake provider
 * (ibv_context ops that count what they register, as tests/c/host/fast_hit.c) and, behind
 * libmrcache.so, verbs_shim.so for libibverbs' reg/dereg. Registers and releases one
 * mmapped buffer ROUNDS times, unmaps it, maps a new one and registers that once.
 * Prints "cached: N registrations" when the cache served the repeats (the provider saw 1,
 * then 1 more for the new mapping), "uncached: N registrations" when every call passed
 * through (the cache off); exit 0 either way, 1 when the cache served a stale entry, 3 when
 * the set-up failed. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
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
    if (first == 1 && registrations == 2) {
        printf("cached: %d registrations\n", registrations);
    } else if (first == ROUNDS && registrations == ROUNDS + 1) {
        printf("uncached: %d registrations\n", registrations);
    } else {
        fprintf(stderr, "san_verbs: %d registrations for %d rounds, then %d\n", first, ROUNDS, registrations);
        return 1;
    }
    return 0;
}
