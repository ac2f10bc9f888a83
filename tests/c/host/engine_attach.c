/* The front attaching the engine (libmrcache_engine.so) at the first verbs call, against a
 * fake provider (the engine calls its ops; verbs_shim.c, preloaded after the front, answers
 * what reaches "libibverbs"). Each mode prints one line "engine_attach: ...", a registration
 * pair "cached" when the second registration of a buffer returned the first one's MR.
 *   engine_attach race LIB   a thread dlopens LIB (tests/c/host/engine_attach_lib.c), whose
 *                            constructor, 300 ms in, registers a buffer twice; meanwhile the
 *                            main thread makes the process's first registration: both must
 *                            finish, and both be cached (the constructor's thread holds the
 *                            loader's lock the main thread's dlopen of the engine waits for)
 *   engine_attach chdir DIR  chdir(DIR) before the first registration, then a pair
 *   engine_attach pair       a pair
 *   engine_attach tls LIB FRONT  dlopen LIB (a large initial-exec TLS block, using up the
 *                            static TLS's spare room), then dlopen FRONT: "loaded" or why
 *                            not; then the front's mrcache_selftest_report (which attaches
 *                            the engine) and four threads whose 64 MiB mallocs call mmap
 *                            inside malloc ("loaded, [not ]attached, threads done")
 * Exit 0 unless something failed to run (3). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_mr.h"

static struct ibv_context ctx;
static struct ibv_pd pd;
/* For engine_attach_lib.c's constructor (the program is linked with -rdynamic). */
struct ibv_pd *attach_pd = &pd;
atomic_int attach_in_ctor;

/* Register `b` twice: "cached" when the second returned the first's MR, else "uncached"
 * ("failed": a registration failed). */
const char *attach_pair(struct ibv_pd *p, char *b) {
    struct ibv_mr *m1 = ibv_reg_mr(p, b, 4096, IBV_ACCESS_LOCAL_WRITE);
    if (!m1 || ibv_dereg_mr(m1)) return "failed";
    struct ibv_mr *m2 = ibv_reg_mr(p, b, 4096, IBV_ACCESS_LOCAL_WRITE);
    if (!m2) return "failed";
    const char *r = m2 == m1 ? "cached" : "uncached";
    return ibv_dereg_mr(m2) ? "failed" : r;
}

/* A thread whose first act is a malloc that mmaps (inside malloc, under its arena lock). */
static void *big_malloc(void *unused) {
    (void)unused;
    for (int i = 0; i < 8; i++) {
        char *p = malloc(64 << 20);
        if (p) p[0] = 1;
        free(p);
    }
    return NULL;
}

static void *opened;
static void *opener(void *lib) {
    opened = dlopen(lib, RTLD_NOW);
    if (!opened) fprintf(stderr, "engine_attach: dlopen %s: %s\n", (char *)lib, dlerror());
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return 3;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    static char buf[4096] __attribute__((aligned(4096)));
    if (!strcmp(argv[1], "race") && argc == 3) {
        pthread_t t;
        if (pthread_create(&t, NULL, opener, argv[2])) return 3;
        while (!attach_in_ctor) usleep(1000);
        usleep(50000); /* the constructor now holds the loader's lock, asleep */
        const char *main_pair = attach_pair(&pd, buf);
        pthread_join(t, NULL);
        const char *(*ctor_pair)(void) = (const char *(*)(void))(opened ? dlsym(opened, "attach_ctor_result") : NULL);
        printf("engine_attach: main %s, constructor %s\n", main_pair, ctor_pair ? ctor_pair() : "not run");
        return 0;
    }
    if (!strcmp(argv[1], "chdir") && argc == 3) {
        if (chdir(argv[2])) return 3;
        printf("engine_attach: %s\n", attach_pair(&pd, buf));
        return 0;
    }
    if (!strcmp(argv[1], "pair")) {
        printf("engine_attach: %s\n", attach_pair(&pd, buf));
        return 0;
    }
    if (!strcmp(argv[1], "tls") && argc == 4) {
        if (!dlopen(argv[2], RTLD_NOW)) {
            fprintf(stderr, "engine_attach: %s\n", dlerror());
            return 3;
        }
        void *h = dlopen(argv[3], RTLD_NOW);
        if (!h) {
            printf("engine_attach: %s\n", dlerror());
            return 0;
        }
        /* The front attaches the engine for mrcache info's report (which the engine writes;
         * without the engine it is empty). */
        size_t (*report)(char *, size_t) = (size_t (*)(char *, size_t))dlsym(h, "mrcache_selftest_report");
        static char text[8192];
        if (!report) return 3;
        const char *attached = report(text, sizeof text) ? "attached" : "not attached";
        pthread_t t[4];
        for (int i = 0; i < 4; i++)
            if (pthread_create(&t[i], NULL, big_malloc, NULL)) return 3;
        for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
        printf("engine_attach: loaded, %s, threads done\n", attached);
        return 0;
    }
    return 3;
}
