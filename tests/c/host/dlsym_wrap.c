/* RTLD_NEXT lookups of a hooked verbs name resolve relative to the object that calls dlsym,
 * as without libmrcache.so: linked with -lwrap_verbs -libverbs (in that order), it also
 * dlopens liblate_verbs.so RTLD_GLOBAL. Under the preload, where the next definition is
 * libibverbs' own the answer is mrcache's hook. Exit 0: all as expected. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

void *wrap_next(const char *name);

static int failed;

static const char *object(void *p) {
    Dl_info info;
    if (!p)
        return "NULL";
    return dladdr(p, &info) && info.dli_fname ? info.dli_fname : "?";
}

static void expect(const char *what, void *got, void *want) {
    if (got != want) {
        fprintf(stderr, "FAIL %s: got %p (%s), want %p (%s)\n", what, got, object(got), want,
                object(want));
        failed = 1;
    }
}

int main(int argc, char **argv) {
    (void)argc;
    int preload = dlsym(RTLD_DEFAULT, "mrcache_version") != NULL;
    void *verbs = dlopen("libibverbs.so.1", RTLD_NOLOAD | RTLD_LAZY);
    void *wrap = dlopen("libwrap_verbs.so", RTLD_NOLOAD | RTLD_LAZY);
    char late_path[4096];
    snprintf(late_path, sizeof late_path, "%s", argv[0]);
    char *slash = strrchr(late_path, '/');
    snprintf(slash ? slash + 1 : late_path, sizeof late_path - (slash ? slash + 1 - late_path : 0),
             "liblate_verbs.so");
    void *late = dlopen(late_path, RTLD_NOW | RTLD_GLOBAL);
    if (!verbs || !wrap || !late) {
        fprintf(stderr, "FAIL: set-up: %s\n", dlerror());
        return 2;
    }
    void *(*late_next)(const char *) = (void *(*)(const char *))dlsym(late, "late_next");
    void *ours = preload ? dlsym(RTLD_DEFAULT, "ibv_reg_mr") : NULL;
    void *wraps = dlsym(wrap, "ibv_reg_mr");
    /* Never the caller's own definition: calling it would recurse forever. */
    expect("RTLD_NEXT ibv_reg_mr from the wrapper", wrap_next("ibv_reg_mr"),
           preload ? ours : dlsym(verbs, "ibv_reg_mr"));
    expect("RTLD_NEXT ibv_dereg_mr from the wrapper", wrap_next("ibv_dereg_mr"),
           preload ? dlsym(RTLD_DEFAULT, "ibv_dereg_mr") : dlsym(verbs, "ibv_dereg_mr"));
    /* The program comes first: its next is the first definition, the preload's if any. */
    expect("RTLD_NEXT ibv_reg_mr from the program", dlsym(RTLD_NEXT, "ibv_reg_mr"),
           preload ? ours : wraps);
    /* Nothing after the late library defines it. */
    expect("RTLD_NEXT ibv_reg_mr from a library loaded last", late_next("ibv_reg_mr"), NULL);
    if (!failed)
        printf("dlsym_wrap: ok (preload %s)\n", preload ? "loaded" : "absent");
    return failed;
}
