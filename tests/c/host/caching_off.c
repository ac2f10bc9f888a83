/* A process whose cache is off (MRCACHE_ENABLE=0, or a bad value): every registration and
 * deregistration is libibverbs' own, and the hooks go straight to it after the first call
 * (`CACHING_OFF`). A fake provider behind libmrcache.so and verbs_shim.so (libibverbs'
 * reg/dereg: counts them). 200 pairs of one local buffer (cached when the cache is on),
 * from two threads at once for the second half, then ibv_dereg_mr(NULL).
 * Prints "caching_off: R registrations and D deregistrations reached libibverbs; dereg(NULL) = E".
 * exit 0; 3: set-up or a call failed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define LEN 65536ul
static struct ibv_pd pd;
static char *buf;

#include "fake_mr.h"

static void *pairs(void *n) {
    for (long i = 0; i < (long)n; i++) {
        struct ibv_mr *mr = ibv_reg_mr(&pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE);
        if (!mr || ibv_dereg_mr(mr)) return (void *)1;
    }
    return NULL;
}

int main(void) {
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    int *regs = dlsym(RTLD_DEFAULT, "shim_regs"), *deregs = dlsym(RTLD_DEFAULT, "shim_deregs");
    if (!regs || !deregs) {
        fprintf(stderr, "caching_off: verbs_shim.so is not preloaded\n");
        return 3;
    }
    buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED || pairs((void *)100)) return 3;
    pthread_t t;
    if (pthread_create(&t, NULL, pairs, (void *)50)) return 3;
    void *a = pairs((void *)50), *b;
    pthread_join(t, &b);
    if (a || b) return 3;
    int rc = ibv_dereg_mr(NULL);
    printf("caching_off: %d registrations and %d deregistrations reached libibverbs; dereg(NULL) = %d\n", *regs,
           *deregs, rc);
    return 0;
}
