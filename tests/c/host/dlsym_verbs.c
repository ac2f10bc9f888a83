/* A program that is not linked with libibverbs dlopens it RTLD_LOCAL (as NCCL does) and
 * looks the verbs functions up through the handle. Under libmrcache.so every function it
 * hooks must come back as its hook (the one RTLD_DEFAULT finds), under dlsym and under
 * dlvsym with the version it is exported under; other functions and other versions stay
 * libibverbs'. Without the preload, all come from libibverbs. Exit 0: as expected. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static int failed;

static int in_libibverbs(void *p) {
    Dl_info info;
    return p && dladdr(p, &info) && info.dli_fname && strstr(info.dli_fname, "libibverbs.so");
}

int main(void) {
    if (dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_LAZY)) {
        fprintf(stderr, "FAIL: libibverbs is loaded before the program opens it\n");
        return 2;
    }
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "FAIL: dlopen libibverbs: %s\n", dlerror());
        return 2;
    }
    int preload = dlsym(RTLD_DEFAULT, "mrcache_version") != NULL;
    static const char *hooked[][2] = {
        {"ibv_reg_mr", "IBVERBS_1.1"},       {"ibv_reg_mr_iova", "IBVERBS_1.7"},
        {"ibv_reg_mr_iova2", "IBVERBS_1.8"}, {"ibv_dereg_mr", "IBVERBS_1.1"},
        {"ibv_rereg_mr", "IBVERBS_1.1"},     {"ibv_reg_dmabuf_mr", "IBVERBS_1.12"},
        {"ibv_dealloc_pd", "IBVERBS_1.1"},   {"ibv_close_device", "IBVERBS_1.1"},
        {"ibv_fork_init", "IBVERBS_1.1"},
    };
    for (unsigned i = 0; i < sizeof hooked / sizeof hooked[0]; i++) {
        const char *name = hooked[i][0], *version = hooked[i][1];
        void *by_name = dlsym(h, name);
        void *by_version = dlvsym(h, name, version);
        void *ours = preload ? dlvsym(RTLD_DEFAULT, name, version) : NULL;
        if (preload && (!ours || in_libibverbs(ours))) {
            fprintf(stderr, "FAIL %s: RTLD_DEFAULT does not find libmrcache's hook\n", name);
            failed = 1;
        }
        if (preload ? by_name != ours : !in_libibverbs(by_name)) {
            fprintf(stderr, "FAIL dlsym(handle, %s) = %p, want %s\n", name, by_name,
                    preload ? "libmrcache's hook" : "libibverbs'");
            failed = 1;
        }
        if (preload ? by_version != ours : !in_libibverbs(by_version)) {
            fprintf(stderr, "FAIL dlvsym(handle, %s, %s) = %p, want %s\n", name, version,
                    by_version, preload ? "libmrcache's hook" : "libibverbs'");
            failed = 1;
        }
    }
    /* The 1.0 ABI (other structs) and unhooked functions stay libibverbs'. */
    if (!in_libibverbs(dlvsym(h, "ibv_reg_mr", "IBVERBS_1.0")) ||
        !in_libibverbs(dlvsym(h, "ibv_dereg_mr", "IBVERBS_1.0"))) {
        fprintf(stderr, "FAIL: an IBVERBS_1.0 lookup did not return libibverbs' function\n");
        failed = 1;
    }
    if (!in_libibverbs(dlsym(h, "ibv_get_device_list")) ||
        !in_libibverbs(dlsym(h, "ibv_alloc_pd"))) {
        fprintf(stderr, "FAIL: an unhooked function did not come from libibverbs\n");
        failed = 1;
    }
    if (!failed)
        printf("dlsym_verbs: ok (preload %s)\n", preload ? "loaded" : "absent");
    return failed;
}
