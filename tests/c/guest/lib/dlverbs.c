/* The pointers behind lib/dlverbs.h, resolved before main as NCCL resolves its verbs
 * table: registration and deregistration with dlvsym under the version NCCL asks for
 * (IBVERBS_1.1, ibv_reg_mr_iova2 IBVERBS_1.8), the rest with dlsym. Built empty unless
 * MRCACHE_DLVERBS is defined (the programs in tests/c/guest/dl/). */
#ifdef MRCACHE_DLVERBS
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DLVERBS_DEFINE(name) dlv_##name##_t dlv_##name;
DLVERBS_FUNCTIONS(DLVERBS_DEFINE)

static const char *version_of(const char *name) {
    if (!strcmp(name, "ibv_reg_mr") || !strcmp(name, "ibv_dereg_mr"))
        return "IBVERBS_1.1";
    if (!strcmp(name, "ibv_reg_mr_iova2"))
        return "IBVERBS_1.8";
    return NULL;
}

__attribute__((constructor)) static void dlverbs_resolve(void) {
    if (dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_LAZY)) {
        fprintf(stderr, "FAIL dlverbs: libibverbs is loaded before the program opens it\n");
        exit(2);
    }
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "FAIL dlverbs: dlopen libibverbs.so.1: %s\n", dlerror());
        exit(2);
    }
#define DLVERBS_RESOLVE(fn)                                                                   \
    {                                                                                         \
        const char *v = version_of(#fn);                                                      \
        void *p = v ? dlvsym(h, #fn, v) : dlsym(h, #fn);                                      \
        if (!p) {                                                                             \
            fprintf(stderr, "FAIL dlverbs: %s not found: %s\n", #fn, dlerror());              \
            exit(2);                                                                          \
        }                                                                                     \
        memcpy(&dlv_##fn, &p, sizeof p);                                                      \
    }
    DLVERBS_FUNCTIONS(DLVERBS_RESOLVE)
}
#endif
