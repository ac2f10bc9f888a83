/* A program dlopens a plugin linked with libibverbs, RTLD_LOCAL (argv[1]); built twice, not
 * linked with libibverbs and linked with it (loaded before the plugin then). The
 * plugin's RTLD_NEXT lookups of verbs functions find libibverbs among its dependencies
 * without the preload and mrcache's hooks with it, never NULL. Exit 0: as expected. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static int failed;

static int in_libibverbs(void *p) {
    Dl_info info;
    return p && dladdr(p, &info) && info.dli_fname && strstr(info.dli_fname, "libibverbs.so");
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    int preload = dlsym(RTLD_DEFAULT, "mrcache_version") != NULL;
    void *plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!plugin) {
        fprintf(stderr, "FAIL: dlopen %s: %s\n", argv[1], dlerror());
        return 2;
    }
    void *(*local_next)(const char *) = (void *(*)(const char *))dlsym(plugin, "local_next");
    static const char *names[] = {"ibv_reg_mr", "ibv_dereg_mr"};
    for (unsigned i = 0; i < 2; i++) {
        dlerror();
        void *got = local_next(names[i]);
        const char *error = dlerror();
        if (got && error) {
            fprintf(stderr, "FAIL RTLD_NEXT %s from the plugin left dlerror() = %s\n", names[i],
                    error);
            failed = 1;
        }
        void *ours = preload ? dlsym(RTLD_DEFAULT, names[i]) : NULL;
        if (preload ? got != ours : !in_libibverbs(got)) {
            fprintf(stderr, "FAIL RTLD_NEXT %s from the plugin = %p (%s), want %s\n", names[i],
                    got, got ? "non-NULL" : error, preload ? "mrcache's hook" : "libibverbs'");
            failed = 1;
        }
    }
    if (!failed)
        printf("dlsym_local: ok (preload %s)\n", preload ? "loaded" : "absent");
    return failed;
}
